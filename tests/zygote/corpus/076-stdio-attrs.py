# about: isatty, encoding, errors, buffering of the three streams
# mode: c
# stdin: "x\n"
import sys
for s in (sys.stdin, sys.stdout, sys.stderr):
    print(s.name, s.mode, s.isatty(), s.encoding, s.errors, s.line_buffering, s.write_through, s.fileno(), type(s.buffer).__name__, type(s.buffer.raw).__name__)
print(sys.stdin is sys.__stdin__, sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__)
print(repr(sys.stdin), repr(sys.stdout), repr(sys.stderr))
