# about: /usr/bin/python3 by absolute path (zygote or not: the output is the same)
# mode: c
# interpreter: /usr/bin/python3
# zygote: any
import sys
print(sys.orig_argv, sys.executable, sys.argv)
