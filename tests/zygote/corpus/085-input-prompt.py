# about: input(prompt) writes the prompt to stdout when stdin is not a tty
# mode: c
# stdin: "bob\n"
name = input('name? ')
print('hi', name)
