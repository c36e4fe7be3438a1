# about: a SyntaxError in a FILE
# mode: file
# path: syntax_file.py
# exit: 1
print('never')
def f(:
    pass
