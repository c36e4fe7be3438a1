# about: SIGTERM to itself: killed (143), nothing more
# mode: c
# exit: 143
import os, signal, time
print('before', flush=True)
print('lost')
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
