# about: -e PYTHONUNBUFFERED=1: exec; merged output in write order
# mode: c
# env: {"PYTHONUNBUFFERED": "1"}
# merge: true
# zygote: fallback PYTHONUNBUFFERED
import sys
print('out 1')
print('err 1', file=sys.stderr)
print('out 2')
