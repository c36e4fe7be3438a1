# about: flush=True interleaves as written
# mode: c
# merge: true
import sys
print('out 1', flush=True)
print('err 1', file=sys.stderr)
print('out 2', flush=True)
print('err 2', file=sys.stderr)
