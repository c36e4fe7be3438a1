# about: iterating over stdin lines
# mode: c
# stdin: "a\nb\n\nc"
import sys
for line in sys.stdin:
    print(repr(line))
