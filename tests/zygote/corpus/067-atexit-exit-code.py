# about: atexit handlers run after sys.exit(9), the code stays
# mode: c
# exit: 9
import atexit, sys
atexit.register(print, 'atexit ran')
sys.exit(9)
