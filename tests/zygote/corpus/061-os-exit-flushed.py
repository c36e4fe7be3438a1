# about: os._exit after explicit flushes
# mode: c
# exit: 0
import os, sys
print('kept', flush=True)
sys.stderr.write('err line\n')
os._exit(0)
