# about: -e LC_CTYPE: exec
# mode: c
# env: {"LC_CTYPE": "C"}
# zygote: fallback LC_CTYPE
import sys
print(sys.stdout.encoding, sys.flags.utf8_mode)
