# about: sys.exit('message'): the message on stderr, exit 1
# mode: c
# exit: 1
import sys
print('before')
sys.exit('bye now')
