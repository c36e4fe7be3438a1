# about: a DeprecationWarning raised in an imported module is hidden
# mode: c
import depmod
print('done', depmod.VALUE)
