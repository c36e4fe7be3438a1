# about: sys.exit(None)
# mode: c
# exit: 0
import sys
print('before')
sys.exit(None)
