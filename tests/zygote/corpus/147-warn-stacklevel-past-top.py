# about: a warning whose stacklevel points above the program's frame
# mode: c
# differs: the zygote's own frames are below the program's: a stacklevel past the program's frame names a zygote frame instead of 'sys:1'
import warnings
warnings.warn('from the top', stacklevel=2)
print('done')
