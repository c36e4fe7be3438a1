# about: the environment (TRACEPARENT differs per run: left out)
# mode: c
import os
for k in sorted(os.environ):
    if k != 'TRACEPARENT':
        print(k, repr(os.environ[k]))
print(len(os.environ) == len(os.environb))
