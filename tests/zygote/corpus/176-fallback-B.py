# about: -B: exec
# mode: c
# flags: ["-B"]
# zygote: fallback -B
import sys
print(sys.dont_write_bytecode)
