# about: -O: exec; assertions are off
# mode: c
# flags: ["-O"]
# zygote: fallback -O
assert False, 'not raised under -O'
print(__debug__, __import__('sys').flags.optimize)
