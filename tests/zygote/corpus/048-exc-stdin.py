# about: an uncaught exception in a program read from stdin
# mode: stdin
# exit: 1
x = 1
raise AttributeError('from stdin')
