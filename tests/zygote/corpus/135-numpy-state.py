# about: numpy's global state after import: error handling, print options, results
# mode: c
import numpy as np
print(np.__version__, np.geterr(), np.get_printoptions()['precision'], np.getbufsize())
a = np.arange(12, dtype=float).reshape(3, 4) / 7
print(a)
print(a.sum(), a.dtype, np.float64(1) / 3)
with np.errstate(all='warn'):
    np.float64(1) / np.float64(0)
