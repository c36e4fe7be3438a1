# about: -e HOME (differs from the pool's): exec
# mode: c
# env: {"HOME": "/tmp"}
# zygote: fallback HOME
import os, site
print(os.path.expanduser('~'), site.USER_BASE)
