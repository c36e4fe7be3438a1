# about: -e PYTHONPATH: exec, and the path has it
# mode: c
# env: {"PYTHONPATH": "/x"}
# zygote: fallback PYTHONPATH
import sys
print(sys.path)
