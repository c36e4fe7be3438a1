# about: -E: exec
# mode: c
# flags: ["-E"]
# zygote: fallback -E
import sys
print(sys.flags.ignore_environment)
