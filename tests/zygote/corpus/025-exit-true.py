# about: sys.exit(True): 1
# mode: c
# exit: 1
import sys
sys.exit(True)
