# about: raise SystemExit(7) in a FILE-mode script
# mode: file
# path: exit_raise.py
# exit: 7
print('in file')
raise SystemExit(7)
