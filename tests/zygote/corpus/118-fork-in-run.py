# about: the program forks: the child prints and exits, the parent reaps it
# mode: c
import os, sys
sys.stdout.flush()
pid = os.fork()
if pid == 0:
    print('child', os.getppid() > 0)
    sys.stdout.flush()
    os._exit(4)
_, status = os.waitpid(pid, 0)
print('parent', os.waitstatus_to_exitcode(status))
