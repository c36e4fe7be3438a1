# about: every module loaded after the program imports numpy itself
# mode: c
import sys
import numpy
for name in sorted(sys.modules):
    print(name)
