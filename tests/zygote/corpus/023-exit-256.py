# about: sys.exit(256): the status is taken modulo 256
# mode: c
# exit: 0
import sys
sys.exit(256)
