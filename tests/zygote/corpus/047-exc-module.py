# about: an uncaught exception in a -m module (runpy's frames are not shown)
# mode: module
# module: exc_mod
# exit: 1
def g():
    raise TypeError('in a module')


g()
