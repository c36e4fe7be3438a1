# about: the site module's exit(4)
# mode: c
# exit: 4
print('x')
exit(4)
