# about: a traceback through a function defined in a workspace module and a FILE
# mode: file
# path: exc_through.py
# exit: 1
import depmod


def call(fn):
    return fn()


call(lambda: depmod.VALUE / 0)
