# about: a warning from a FILE shows the source line
# mode: file
# path: warn_file.py
import warnings


def old():
    warnings.warn('old() is old', FutureWarning, stacklevel=2)


old()
print('done')
