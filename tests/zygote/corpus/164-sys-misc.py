# about: misc sys attributes
# mode: c
import sys
print(sys.byteorder, sys.maxsize, sys.platform, sys.abiflags, sys.api_version, sys.hexversion, sys.float_repr_style)
print(sys.argv is sys.argv, type(sys.stdin).__name__, sys.path_importer_cache.get('/nonexistent'), hasattr(sys, 'last_value'), hasattr(sys, 'last_type'))
