# about: an annotation naming nothing fails at definition time
# mode: c
# exit: 1
def f(a: undefined_name):
    pass
print('never')
