# about: the __main__ module is the program's namespace
# mode: file
# path: main_module.py
import sys
import __main__
print(__main__ is sys.modules['__main__'], vars(__main__) is globals(), __main__.__file__, __main__.__spec__)
