# about: --cwd /tmp
# mode: c
# cwd: /tmp
import os, sys
print(os.getcwd(), os.environ.get('PWD'), repr(sys.path[0]), os.path.abspath('x'))
