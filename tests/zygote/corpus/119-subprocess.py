# about: child processes: their output passes the parent's buffered output
# mode: c
import os, subprocess, sys
print('parent buffered')
subprocess.run([sys.executable, '-c', 'print("child python")'])
os.system('echo child shell')
r = subprocess.run(['python3', '-c', 'import sys; print(sys.argv, sys.flags.isolated); sys.exit(3)', 'arg'], capture_output=True, text=True)
print(r.returncode, r.stdout, end='')
