# about: the import machinery: meta path finders, path hooks, sys.path
# mode: c
import sys
name = lambda o: getattr(o, '__qualname__', None) or type(o).__name__
print([name(f) for f in sys.meta_path])
print([name(h) for h in sys.path_hooks])
print(sys.path)
