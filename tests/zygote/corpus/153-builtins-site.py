# about: __builtins__, help, exit, quit and the other site additions
# mode: c
import builtins, sys
print(type(__builtins__).__name__, __builtins__ is builtins)
print(type(help).__name__, repr(exit), repr(quit), type(copyright).__name__, type(credits).__name__, type(license).__name__)
print(hasattr(sys, 'ps1'), hasattr(sys, 'ps2'), sys.displayhook is sys.__displayhook__, sys.breakpointhook is sys.__breakpointhook__)
print(sorted(n for n in dir(builtins) if not n.startswith('__'))[-12:], len(dir(builtins)))
