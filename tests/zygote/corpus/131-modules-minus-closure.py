# about: modules loaded, less numpy's import closure (computed in a fresh python3)
# mode: c
import subprocess, sys
probe = 'import sys; a = set(sys.modules); import numpy; print(" ".join(sorted(set(sys.modules) - a)))'
closure = set(subprocess.run(['python3', '-c', probe], capture_output=True, text=True).stdout.split())
print(len(closure) > 50)
for name in sorted(set(sys.modules) - closure):
    print(name)
