# about: HOME and the user site
# mode: c
import os, site, sys
print(os.path.expanduser('~'), site.ENABLE_USER_SITE, site.USER_SITE, site.USER_BASE, site.getsitepackages())
print(sys.prefix, sys.base_prefix, sys.exec_prefix, sys.platlibdir, sys.implementation.cache_tag, sys.version)
