# about: sys.exit with a non-int object: its str on stderr, exit 1
# mode: c
# exit: 1
import sys
sys.exit([1, 'two'])
