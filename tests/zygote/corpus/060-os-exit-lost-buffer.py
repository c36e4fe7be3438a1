# about: os._exit(3) loses what is still buffered (stdout to a pipe, a partial stderr line)
# mode: c
# exit: 3
import os, sys
print('lost')
sys.stderr.write('partial line, lost')
os._exit(3)
