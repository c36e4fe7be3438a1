# about: -e LANG with the pool's own value (not a difference)
# mode: c
# env: {"LANG": "C.UTF-8"}
import locale, sys
print(locale.getlocale(), sys.stdout.encoding)
