# about: explicit and implicit exception chaining in a FILE
# mode: file
# path: exc_chained.py
# exit: 1
def parse(s):
    try:
        return int(s)
    except ValueError as e:
        raise KeyError('not a number') from e


try:
    parse('x')
except KeyError:
    raise RuntimeError('while handling')
