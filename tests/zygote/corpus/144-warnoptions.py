# about: warn options and -X options
# mode: c
import sys
print(sys.warnoptions, sys._xoptions, sys.flags.dev_mode, sys.flags.warn_default_encoding)
