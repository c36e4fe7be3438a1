# about: a KeyboardInterrupt caught
# mode: c
# exit: 0
import os, signal, time
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
except KeyboardInterrupt:
    print('caught')
