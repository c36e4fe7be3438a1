# about: atexit handlers run after an uncaught exception's traceback
# mode: c
# exit: 1
import atexit, sys
atexit.register(lambda: print('atexit out') or print('atexit err', file=sys.stderr))
raise ValueError('uncaught')
