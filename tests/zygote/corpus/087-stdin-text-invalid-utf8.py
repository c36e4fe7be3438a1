# about: text stdin with invalid UTF-8 (surrogateescape)
# mode: c
# stdin-hex: 61 ff 62 0a
import sys
print(ascii(sys.stdin.read()))
