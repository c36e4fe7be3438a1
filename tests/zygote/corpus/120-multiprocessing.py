# about: a multiprocessing pool (fork) in the run
# mode: file
# path: mp_pool.py
import multiprocessing


def square(x):
    return x * x


if __name__ == '__main__':
    print(multiprocessing.get_start_method())
    with multiprocessing.Pool(2) as p:
        print(p.map(square, range(6)))
    print(multiprocessing.current_process().name, multiprocessing.parent_process())
