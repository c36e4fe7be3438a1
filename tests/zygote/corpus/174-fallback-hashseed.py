# about: -e PYTHONHASHSEED=0: exec, and hashes are the fixed seed's
# mode: c
# env: {"PYTHONHASHSEED": "0"}
# zygote: fallback PYTHONHASHSEED
import sys
print(hash('abc'), hash(b'abc'), sys.flags.hash_randomization)
