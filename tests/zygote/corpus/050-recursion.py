# about: RecursionError: the repeat count depends on the stack depth the program starts at
# mode: c
# differs: the zygote's own frames are below the program's (a pure-Python zygote cannot run code at depth 1), so one frame less is left before the limit: 'repeated 995 more times' (unless the zygote raises the limit by its depth, which sys.getrecursionlimit() then shows)
# exit: 1
def f(n):
    return f(n + 1)
f(0)
