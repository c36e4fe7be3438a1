# about: whether numpy is already imported when the program starts
# mode: c
# differs: the preload list is imported in the zygote, so it is in sys.modules before the program imports it (import costs nothing; sys.modules, gc.get_objects(), memory use show it)
# zygote-stdout: "True\n"
import sys
print('numpy' in sys.modules)
