# about: /proc/self/exe and comm
# mode: c
import os
print(os.readlink('/proc/self/exe'), open('/proc/self/comm').read().strip())
