# about: stdout (block-buffered to a pipe) and stderr (line-buffered) on the same pipe
# mode: c
# merge: true
import sys
print('out 1')
print('err 1', file=sys.stderr)
print('out 2')
sys.stderr.write('err 2 no newline')
print('out 3')
