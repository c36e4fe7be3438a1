# about: the warnings filters after the program imports numpy itself
# mode: c
import warnings
import numpy
for f in warnings.filters:
    print(f)
