# about: output larger than a pipe buffer
# mode: c
import sys
for i in range(20000):
    sys.stdout.write('%06d ........\n' % i)
print('end', file=sys.stderr)
