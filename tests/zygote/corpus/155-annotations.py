# about: annotations are evaluated (no __future__ flag leaks into the program's compilation)
# mode: c
x: int = 1
def f(a: list) -> str: pass
print(__annotations__, f.__annotations__)
