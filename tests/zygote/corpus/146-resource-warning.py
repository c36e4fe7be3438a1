# about: an unclosed file: ResourceWarning is ignored by default
# mode: c
import gc
f = open('/dev/null')
del f
gc.collect()
print('done')
