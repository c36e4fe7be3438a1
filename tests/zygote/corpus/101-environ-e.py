# about: -e variables (not ones the zygote depends on)
# mode: c
# env: {"FOO": "bar", "EMPTY": "", "UNI": "é", "SPACES": "a b  c"}
import os
print(sorted((k, v) for k, v in os.environ.items() if k != 'TRACEPARENT'))
print(os.getenv('FOO'), os.environb[b'UNI'])
