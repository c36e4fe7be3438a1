# about: the path importer cache after importing numpy
# mode: c
# differs: the path importer cache holds what the zygote's own imports looked up (e.g. its working directory, not the run's), and the program's `import numpy` looks nothing up
import sys
import numpy
for k in sorted(sys.path_importer_cache):
    print(k, type(sys.path_importer_cache[k]).__name__)
