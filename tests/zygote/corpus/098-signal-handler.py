# about: a Python handler for SIGUSR1
# mode: c
import os, signal
signal.signal(signal.SIGUSR1, lambda n, f: print('handled', n))
os.kill(os.getpid(), signal.SIGUSR1)
print('after')
