# about: output without a trailing newline is flushed at exit
# mode: c
import sys
sys.stdout.write('no newline')
sys.stderr.write('err no newline')
