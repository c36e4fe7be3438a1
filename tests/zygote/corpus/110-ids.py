# about: pid (small, not its value), uids, gids, groups, process group and session
# mode: c
import os
pid = os.getpid()
print(pid < 10, os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups(), os.getresuid(), os.getresgid())
print(os.getpgrp() == pid, os.getsid(0) == pid, os.getsid(0) == os.getpgrp())
