# about: blocked, ignored and caught signals of the process
# mode: c
import signal
print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
for line in open('/proc/self/status'):
    if line.startswith(('SigBlk', 'SigIgn', 'SigCgt', 'ShdPnd', 'SigPnd')):
        print(line.rstrip())
