# about: the parent pid the program sees
# mode: c
# differs: the zygote forks the program, so its parent is the zygote, outside the cell's pid namespace: os.getppid() is 0 where an exec'd python3 (a child of the cell's PID 1) sees 1
# zygote-stdout: "0\n"
import os
print(os.getppid())
