"""Imported by corpus/046: fails while it is being imported."""
VALUE = 1


def fail():
    raise LookupError('badmod cannot be imported')


fail()
