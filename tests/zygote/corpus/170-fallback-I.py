# about: -I (isolated mode) is an interpreter flag: exec
# mode: c
# flags: ["-I"]
# zygote: fallback -I
import sys
print(sys.flags.isolated, sys.flags.ignore_environment, sys.flags.no_user_site, sys.flags.safe_path, sys.path, sys.orig_argv)
