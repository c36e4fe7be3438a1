# about: sys.exit in a program read from stdin
# mode: stdin
# exit: 6
import sys
print('stdin program')
sys.exit(6)
