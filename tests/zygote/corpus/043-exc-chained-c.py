# about: implicit chaining in -c
# mode: c
# exit: 1
try:
    1 / 0
except ZeroDivisionError:
    [][1]
