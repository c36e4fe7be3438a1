# about: -bb before -c: exec
# mode: c
# flags: ["-bb"]
# zygote: fallback -b
# exit: 1
print(__import__('sys').flags.bytes_warning)
str(b'x')
