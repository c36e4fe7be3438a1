# about: pickle of a class defined in __main__ round-trips (-c)
# mode: c
import pickle
class Point:
    def __init__(self, x):
        self.x = x
p = pickle.loads(pickle.dumps(Point(3)))
print(type(p).__module__, type(p).__qualname__, p.x, pickle.dumps(Point(1), protocol=4))
