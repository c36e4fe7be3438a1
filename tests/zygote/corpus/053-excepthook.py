# about: sys.excepthook is the default one, and a custom hook is used for an uncaught exception
# mode: c
# exit: 1
import sys
print(sys.excepthook is sys.__excepthook__, sys.unraisablehook is sys.__unraisablehook__)
def hook(t, v, tb):
    print('hooked', t.__name__, v, file=sys.stderr)
sys.excepthook = hook
raise OSError(5, 'custom')
