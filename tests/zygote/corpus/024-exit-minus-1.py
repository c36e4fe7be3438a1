# about: sys.exit(-1): 255
# mode: c
# exit: 255
import sys
sys.exit(-1)
