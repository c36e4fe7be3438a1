# about: an exception raised by a workspace module while it is imported
# mode: c
# exit: 1
print('importing')
import badmod
