# about: -e TZ: time's zone is the run's (the zygote may take the run, after time.tzset(), or fall back)
# mode: c
# env: {"TZ": "Asia/Tokyo"}
# zygote: any
import time
print(time.tzname, time.timezone, time.daylight, time.localtime(0).tm_hour, time.strftime('%Z', time.localtime(0)))
