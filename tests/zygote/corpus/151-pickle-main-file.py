# about: pickle of a class defined in a FILE script round-trips
# mode: file
# path: pickle_file.py
import pickle


class Point:
    def __init__(self, x):
        self.x = x


p = pickle.loads(pickle.dumps(Point(5)))
print(type(p).__module__, p.x, pickle.dumps(Point(2), protocol=4))
