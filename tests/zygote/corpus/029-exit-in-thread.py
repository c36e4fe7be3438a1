# about: SystemExit in a thread ends that thread only, silently
# mode: c
# exit: 0
import sys, threading
t = threading.Thread(target=sys.exit, args=(9,))
t.start()
t.join()
print('main goes on')
