# about: clocks and time zone defaults (values equal across runs only)
# mode: c
import time
print(time.tzname, time.timezone, time.get_clock_info('monotonic').implementation, time.get_clock_info('time').resolution)
