# about: traceback.print_exc, format_exc and a one-frame extract_stack in a FILE (print_stack: corpus/051)
# mode: file
# path: tb_file.py
import traceback


def where():
    return traceback.extract_stack(limit=1)[0].name


print(where())
try:
    {}['k']
except KeyError:
    traceback.print_exc()
    print(traceback.format_exc().count('\n'))
print('done')
