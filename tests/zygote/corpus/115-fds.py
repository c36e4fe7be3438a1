# about: only fds 0, 1 and 2 are open
# mode: c
import os, re
fds = os.listdir('/proc/self/fd')
for fd in sorted(fds, key=int):
    try:
        print(fd, re.sub(r'\[\d+\]', '[N]', os.readlink('/proc/self/fd/' + fd)))
    except FileNotFoundError:
        pass
