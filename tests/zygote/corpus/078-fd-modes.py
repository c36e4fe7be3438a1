# about: blocking, inheritable, file types of fds 0 1 2
# mode: c
# stdin: "data"
import os, stat
for fd in (0, 1, 2):
    st = os.fstat(fd)
    print(fd, os.get_blocking(fd), os.get_inheritable(fd), os.isatty(fd), stat.S_ISFIFO(st.st_mode), stat.S_ISCHR(st.st_mode), stat.S_ISREG(st.st_mode), oct(st.st_mode & 0o777))
