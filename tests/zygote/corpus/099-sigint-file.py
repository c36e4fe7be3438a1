# about: KeyboardInterrupt in a FILE script, with the source line in the traceback
# mode: file
# path: sigint_file.py
# exit: 130
import os
import signal


def interrupt():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10 ** 9):
        pass


interrupt()
