# Run several times through the zygote by tests/tests/zygote.rs: every line but `hash` must
# differ from run to run (each forked run reseeds what a fresh interpreter would seed anew).
# `hash` is the documented difference: the string hash seed is the zygote's, fixed at its
# start, so it is the same for every run a zygote forks.
import os, random, secrets, tempfile, uuid
import numpy

print('random', random.random())
print('random_getrandbits', random.getrandbits(64))
print('system_random', random.SystemRandom().random())
print('secrets', secrets.token_hex(16))
print('uuid4', uuid.uuid4())
print('numpy_rand', numpy.random.rand())
print('numpy_default_rng', numpy.random.default_rng().random())
fd, name = tempfile.mkstemp()
os.close(fd)
print('mkstemp', os.path.basename(name))
print('temp_name', next(tempfile._get_candidate_names()))
print('urandom', os.urandom(16).hex())
print('hash', hash('abc'), hash(b'abc'))
