# about: the mounts the run sees (points, options, types; not sources)
# mode: c
for line in open('/proc/self/mountinfo'):
    pre, post = line.split(' - ')
    f = pre.split()
    print(f[4], f[5], post.split()[0])
