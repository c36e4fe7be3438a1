# about: the frames above the program's code: depth and print_stack
# mode: c
# differs: the zygote's own frames are below the program's: sys._getframe().f_back, inspect.stack() and traceback.print_stack() show them
import sys, traceback
f, n = sys._getframe(), 0
while f is not None:
    n, f = n + 1, f.f_back
print('depth', n)
traceback.print_stack()
print('limit', sys.getrecursionlimit())
