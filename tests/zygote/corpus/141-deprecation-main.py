# about: a DeprecationWarning raised in __main__ is shown
# mode: c
import warnings
warnings.warn('old api', DeprecationWarning)
print('done')
