# about: python3 reading the program from a (non-tty) stdin
# mode: stdin
import sys
g = globals()
s = __spec__
print("argv", sys.argv)
print("name", __name__, g.get("__file__", "-"), g.get("__cached__", "-"))
print("spec", None if s is None else (s.name, s.origin, s.parent, s.has_location, s.cached, type(s.loader).__name__, s.submodule_search_locations))
print("loader", getattr(__loader__, "__name__", None) or type(__loader__).__name__)
print("package", repr(__package__), "doc", repr(__doc__))
print("globals", sorted(g))
print("path", sys.path)
print("orig_argv", sys.orig_argv)
print("executable", sys.executable)
print("flags", sys.flags)
print("co_filename", sys._getframe().f_code.co_filename)
