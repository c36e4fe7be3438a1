# about: a SyntaxError in -c code
# mode: c
# exit: 1
print('never')
x = (1,
