# about: the warnings filters the program starts with (importing numpy adds some)
# mode: c
# differs: importing the preload list has side effects the program starts with: numpy adds four warnings filters (corpus/137: after its own `import numpy` both sides agree)
import warnings
for f in warnings.filters:
    print(f)
print(warnings.defaultaction, warnings.onceregistry)
