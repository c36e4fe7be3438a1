# about: the program's code object (name, flags, filename)
# mode: c
import sys
c = sys._getframe().f_code
print(c.co_name, c.co_filename, c.co_flags, c.co_firstlineno, c.co_consts[-1:])
