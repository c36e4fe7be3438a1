# about: -e LANG=C (differs from the pool's): exec; the locale is C
# mode: c
# env: {"LANG": "C"}
# zygote: fallback LANG
import locale, sys
print(locale.getlocale(), sys.stdout.encoding, sys.stdin.encoding, sys.getfilesystemencoding(), sys.flags.utf8_mode)
print('é')
