# about: a program that does nothing (only this comment)
# mode: c
