# about: -e PATH (differs from the pool's): exec
# mode: c
# env: {"PATH": "/usr/bin:/bin"}
# zygote: fallback PATH
import os, shutil
print(os.environ['PATH'], shutil.which('python3'))
