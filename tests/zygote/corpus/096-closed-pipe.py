# about: writing to a pipe whose reader is gone: SIGPIPE is ignored, BrokenPipeError
# mode: c
import os
r, w = os.pipe()
os.close(r)
try:
    os.write(w, b'x')
except BrokenPipeError as e:
    print('BrokenPipeError', e.errno)
