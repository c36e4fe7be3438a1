# about: sys.stdin.buffer.read() of invalid UTF-8
# mode: c
# stdin-hex: ff fe 41 0a c3 a9 80 00
import sys
print(sys.stdin.buffer.read())
