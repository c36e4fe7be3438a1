# about: input() twice
# mode: c
# stdin: "hello\nworld\n"
a = input()
b = input()
print(repr(a), repr(b))
