# about: warnings.warn twice from one line is shown once
# mode: c
import warnings
for i in range(2):
    warnings.warn('x')
def f():
    warnings.warn('from f', stacklevel=2)
f()
f()
print('done')
