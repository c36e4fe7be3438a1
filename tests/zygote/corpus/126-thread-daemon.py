# about: a daemon thread still sleeping at exit does not hold the process
# mode: c
import threading, time
def forever():
    time.sleep(60)
    print('never')
threading.Thread(target=forever, daemon=True).start()
print('main done', threading.active_count())
