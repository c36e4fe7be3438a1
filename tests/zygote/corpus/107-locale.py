# about: locale and encodings
# mode: c
import locale, sys
print(locale.getlocale(), locale.getpreferredencoding(False), locale.setlocale(locale.LC_CTYPE), locale.setlocale(locale.LC_NUMERIC))
print(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors(), sys.getdefaultencoding(), locale.localeconv()['decimal_point'])
