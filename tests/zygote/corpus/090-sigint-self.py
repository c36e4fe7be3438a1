# about: SIGINT to itself: KeyboardInterrupt traceback, then death by SIGINT (130)
# mode: c
# exit: 130
import os, signal, time
print('before', flush=True)
os.kill(os.getpid(), signal.SIGINT)
time.sleep(5)
print('never')
