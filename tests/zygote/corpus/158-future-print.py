# about: a __future__ import at the top of -c code
# mode: c
from __future__ import annotations
def f(a: undefined_name) -> 'x': pass
print(f.__annotations__)
