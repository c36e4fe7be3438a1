# about: raw bytes incl. invalid UTF-8, surrogates, non-ASCII text
# mode: c
import sys
sys.stdout.flush()
sys.stdout.buffer.write(b'\xff\xfe\x00ok\x80\n')
sys.stdout.buffer.flush()
print('\udcff surrogateescape')
print('\udcff backslashreplace', file=sys.stderr)
print('é ✓ 日本語')
