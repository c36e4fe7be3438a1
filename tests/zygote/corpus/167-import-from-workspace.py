# about: a workspace module imported by a -c program (cwd /workspace is on the path)
# mode: c
import depmod, sys
print(depmod.__file__, depmod.__spec__.origin, depmod.__name__, sys.modules['depmod'] is depmod)
