# about: buffered stdout after the traceback on a shared pipe
# mode: c
# merge: true
# exit: 1
print('printed before the exception')
raise KeyError('k')
