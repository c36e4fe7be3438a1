# about: -u (unbuffered): exec, and the merged order is the write order
# mode: c
# flags: ["-u"]
# merge: true
# zygote: fallback -u
import sys
print('out 1')
print('err 1', file=sys.stderr)
print('out 2')
print(sys.stdout.write_through, sys.flags)
