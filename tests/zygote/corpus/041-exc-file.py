# about: an uncaught exception in a FILE: traceback with source lines
# mode: file
# path: exc_file.py
# exit: 1
def inner(d):
    return d['missing']


def outer():
    return inner({})


outer()
