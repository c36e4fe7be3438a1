# about: sys.exit(3)
# mode: c
# exit: 3
import sys
print('before')
sys.exit(3)
