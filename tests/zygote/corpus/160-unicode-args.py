# about: non-ASCII and odd arguments
# mode: c
# args: ["é", "日本語", "\u00a0", "--", "-m", "a=b", "  "]
import os, sys
print(sys.argv, [os.fsencode(a) for a in sys.argv[1:3]])
