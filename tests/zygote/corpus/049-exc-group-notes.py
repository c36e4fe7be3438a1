# about: an ExceptionGroup with notes (3.11 rendering)
# mode: c
# exit: 1
e = ValueError('inner')
e.add_note('a note')
raise ExceptionGroup('several', [e, TypeError('other')])
