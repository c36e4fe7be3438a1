# about: interpreter-wide settings
# mode: c
import faulthandler, gc, sys
print(sys.getrecursionlimit(), sys.getswitchinterval(), sys.get_int_max_str_digits(), sys.dont_write_bytecode, sys.pycache_prefix)
print(gc.isenabled(), gc.get_threshold(), gc.get_debug(), faulthandler.is_enabled(), sys.gettrace(), sys.getprofile())
print(sys.get_coroutine_origin_tracking_depth(), sys.get_asyncgen_hooks(), sys.getdlopenflags())
