# about: -e OPENBLAS_NUM_THREADS=1: read by OpenBLAS when numpy is imported, so a preloaded numpy would have the pool's value: the run must fall back (or the output differs)
# mode: c
# env: {"OPENBLAS_NUM_THREADS": "1"}
# zygote: fallback OPENBLAS_NUM_THREADS
import os
import numpy
a = numpy.ones((600, 600))
a @ a
print(len(os.listdir('/proc/self/task')))
