# about: the threads the program sees: only its main thread, named MainThread
# mode: c
import os, threading
print(threading.active_count(), [t.name for t in threading.enumerate()])
print(threading.current_thread() is threading.main_thread(), threading.main_thread().name, threading.get_ident() == threading.main_thread().ident)
print(threading.Thread().name, len(os.listdir('/proc/self/task')), threading.get_native_id() == os.getpid())
