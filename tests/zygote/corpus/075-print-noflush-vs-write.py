# about: print(flush=False) to a pipe stays behind an os.write
# mode: c
import os
print('printed first', flush=False)
os.write(1, b'written second, seen first\n')
