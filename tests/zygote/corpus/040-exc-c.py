# about: an uncaught exception in -c: traceback, exit 1
# mode: c
# exit: 1
print('before')
def f(x):
    raise ValueError('boom %d' % x)
f(3)
