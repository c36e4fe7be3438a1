# about: an exception in a thread: threading.excepthook's report
# mode: c
import threading
def boom():
    raise ValueError('in thread')
t = threading.Thread(target=boom)
t.start()
t.join()
print('main goes on')
