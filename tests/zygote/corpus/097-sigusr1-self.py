# about: SIGUSR1 (default action) to itself: 138
# mode: c
# exit: 138
import os, signal, time
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(5)
