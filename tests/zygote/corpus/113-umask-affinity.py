# about: umask, CPU affinity, nice, CPU count, scheduler
# mode: c
import os
m = os.umask(0o22)
print(oct(m), sorted(os.sched_getaffinity(0)), os.nice(0), os.cpu_count(), os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
