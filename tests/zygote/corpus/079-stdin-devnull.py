# about: no stdin given: /dev/null, read gives ''
# mode: c
import os, sys, stat
print(repr(sys.stdin.read()), stat.S_ISCHR(os.fstat(0).st_mode))
