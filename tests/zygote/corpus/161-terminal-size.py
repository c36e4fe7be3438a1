# about: not a terminal: get_terminal_size fails, shutil falls back
# mode: c
import os, shutil
try:
    os.get_terminal_size()
except OSError as e:
    print('OSError', e.errno)
print(shutil.get_terminal_size())
