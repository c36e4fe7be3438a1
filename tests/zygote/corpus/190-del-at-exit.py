# about: finalizers of __main__'s objects run at exit, after atexit handlers
# mode: c
import atexit


class Noisy:
    def __init__(self, name):
        self.name = name

    def __del__(self):
        print("del", self.name, flush=True)


a = Noisy("a")
_b = Noisy("_b")
atexit.register(lambda: print("atexit", flush=True))
print("end")
