# about: atexit handlers run last-registered first, after the main program
# mode: c
import atexit
for name in ('a', 'b', 'c'):
    atexit.register(print, 'atexit', name)
print('main')
