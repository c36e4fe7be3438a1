# about: -e LC_ALL (the pool has none): exec
# mode: c
# env: {"LC_ALL": "C.UTF-8"}
# zygote: fallback LC_ALL
import locale
print(locale.setlocale(locale.LC_CTYPE), locale.getlocale())
