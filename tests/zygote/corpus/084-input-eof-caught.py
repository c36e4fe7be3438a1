# about: EOFError caught
# mode: c
try:
    input()
except EOFError as e:
    print('eof', repr(e))
