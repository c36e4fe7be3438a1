# about: -X dev: exec; dev mode shows the warning it hides otherwise
# mode: c
# flags: ["-X", "dev"]
# zygote: fallback -X
import sys, warnings
print(sys.flags.dev_mode, sys._xoptions)
warnings.warn('dev', DeprecationWarning, stacklevel=1)
print(len(warnings.filters) > 0)
