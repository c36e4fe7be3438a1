# about: input() on an empty stdin: EOFError
# mode: c
# stdin: ""
# exit: 1
print('reading')
input()
