# about: an atexit handler that raises: reported, the others still run, exit 0
# mode: c
# exit: 0
import atexit
class Boom:
    def __repr__(self):
        return 'Boom()'
    def __call__(self):
        raise RuntimeError('in atexit')
atexit.register(print, 'first registered')
atexit.register(Boom())
atexit.register(print, 'last registered')
print('main')
