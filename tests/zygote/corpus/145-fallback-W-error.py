# about: -W error is an interpreter flag: exec, and the warning is an error
# mode: c
# flags: ["-W", "error"]
# zygote: fallback -W
# exit: 1
import warnings
print(__import__('sys').warnoptions)
warnings.warn('x')
