# about: a non-ASCII and surrogate exception message on stderr (backslashreplace)
# mode: c
# exit: 1
raise RuntimeError('é ✓ \udcff')
