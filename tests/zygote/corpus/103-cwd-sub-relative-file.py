# about: a FILE given relative to a --cwd below the workspace
# mode: file
# path: cwdrel.py
# run: ../cwdrel.py
# cwd: /workspace/sub
import os, sys
print(os.getcwd(), __file__, sys.argv, sys.path[0])
