# about: another interpreter name (python3.11): exec
# mode: c
# interpreter: python3.11
# zygote: fallback
import sys
print(sys.orig_argv, sys.executable)
