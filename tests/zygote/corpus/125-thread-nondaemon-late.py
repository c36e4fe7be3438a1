# about: a non-daemon thread printing after the main thread is done: the interpreter waits
# mode: c
import threading, time
def late():
    time.sleep(0.3)
    print('late thread')
threading.Thread(target=late).start()
print('main done')
