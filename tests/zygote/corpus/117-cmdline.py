# about: /proc/self/cmdline (what ps shows)
# mode: c
# differs: a forked process keeps its parent's argv memory: /proc/self/cmdline (ps, psutil) shows the zygote's command line, not python3 -c ...
print([a[:40] for a in open('/proc/self/cmdline', 'rb').read().split(b'\0')])
