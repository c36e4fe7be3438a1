# about: resource limits
# mode: c
import resource
for name in sorted(n for n in dir(resource) if n.startswith('RLIMIT_')):
    print(name, resource.getrlimit(getattr(resource, name)))
