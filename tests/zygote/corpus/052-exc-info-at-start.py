# about: no exception is being handled when the program starts
# mode: c
import sys
print(sys.exc_info())
