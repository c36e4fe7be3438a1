# about: sys.exit in a -m module
# mode: module
# module: exit_mod
# exit: 5
import sys
print('module')
sys.exit(5)
