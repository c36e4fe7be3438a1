# about: the program closes fd 1 and prints: the flush at exit fails, exit 120
# mode: c
# exit: 120
import os, sys
sys.stderr.write('closing\n')
os.close(1)
print('x')
