# about: sys.stdin.read()
# mode: c
# stdin: "line 1\nline 2 é\nno newline"
import sys
print(repr(sys.stdin.read()))
