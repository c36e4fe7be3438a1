# about: what a child process of the program inherits (subprocess restores SIGPIPE and SIGXFSZ)
# mode: c
import subprocess
out = subprocess.run(['grep', '^Sig', '/proc/self/status'], capture_output=True, text=True).stdout
print(out, end='')
out = subprocess.run(['grep', '^Sig', '/proc/self/status'], capture_output=True, text=True, restore_signals=False).stdout
print(out, end='')
