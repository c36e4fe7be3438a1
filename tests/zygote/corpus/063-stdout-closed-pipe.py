# about: stdout is a pipe whose reader has gone (the program waits for that): the flush at exit fails, exit 120
# mode: c
# stdout: closed
# exit: 120
import select, sys
p = select.poll()
p.register(1, select.POLLOUT)
for _ in range(100):
    if any(ev & select.POLLERR for _, ev in p.poll(100)):
        break
print('to a closed pipe')
print('never', file=sys.stderr)
