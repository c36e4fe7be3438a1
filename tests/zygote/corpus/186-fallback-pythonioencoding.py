# about: -e PYTHONIOENCODING: exec, stdout in latin-1
# mode: c
# env: {"PYTHONIOENCODING": "latin-1:replace"}
# zygote: fallback PYTHONIOENCODING
import sys
print(sys.stdout.encoding, sys.stdout.errors, 'é ✓')
