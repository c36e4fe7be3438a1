# about: OS threads after importing numpy (OpenBLAS starts its workers at import)
# mode: c
# differs: OpenBLAS's worker threads do not survive the fork (it starts them again at the next BLAS call): 1 thread in a zygote run, 1 + workers in an exec'd one
import os
import numpy
print(len(os.listdir('/proc/self/task')))
