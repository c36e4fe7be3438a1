# about: inspect.getsource of a function in a FILE script
# mode: file
# path: getsource_file.py
import inspect


def documented(a, b=2):
    """Adds."""
    return a + b


print(inspect.getsource(documented), end='')
print(inspect.getsourcefile(documented), inspect.getmodule(documented).__name__)
