# Run-to-run isolation probe (issue 29), run inside a sandbox by tests/tests/isolation.rs with
# the image's python3 (the host image's /usr/bin/python3): standard library only, nothing
# installed. The test prepends one line, `ISO = {...}` (JSON), and runs the whole text as
# `python3 -c`, as a code context's cell, or as an MCP `run_python` call.
#
# ISO["role"] == "plant" (run/sandbox A): leaves ISO["mark"] everywhere a run can leave
#   something (env, argv and stdin come from the caller; files it reads and writes, its
#   memory, a background process holding unix/TCP/UDP sockets and a memfd, SysV shm/msg/sem,
#   POSIX shm and mqueue, a kernel keyring key) and prints `ISO-PLANTED {json}`: what held.
# ISO["role"] == "scan" (run/sandbox B, later, on the same shell): first plants its own
#   marker where it can (the positive control), then reads every channel it can reach and
#   prints `ISO-VERDICT {json}`: per channel, what it planted, every marker seen and where,
#   how much it read, and what it could not read. A marker is `AGENTRUN-ISO-` and 24 hex
#   digits; the test knows which are whose. This file holds no marker of its own.
#
# Timing side channels are out of scope. Read-only mounts are not walked for files: no run
# can leave anything there (their content is the image's or the host's).
import ctypes
import errno
import json
import mmap
import os
import re
import select
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

CFG = ISO  # noqa: F821 (the line the test prepends)
MARK = CFG["mark"]
MB = MARK.encode()
PAT = re.compile(rb"AGENTRUN-ISO-[0-9a-f]{24}")
CHUNK = 8 << 20
FILE_MAX = 8 << 20
OWN = "iso-" + MARK

_libc = ctypes.CDLL(None, use_errno=True)
for _f, _res, _args in [
    ("shmget", ctypes.c_int, [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]),
    ("shmat", ctypes.c_void_p, [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]),
    ("shmdt", ctypes.c_int, [ctypes.c_void_p]),
    ("msgget", ctypes.c_int, [ctypes.c_int, ctypes.c_int]),
    ("msgsnd", ctypes.c_int, [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
    ("msgrcv", ctypes.c_ssize_t, [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long, ctypes.c_int]),
    ("semget", ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.c_int]),
    ("syscall", ctypes.c_long, None),
]:
    getattr(_libc, _f).restype = _res
    if _args is not None:
        getattr(_libc, _f).argtypes = _args
try:
    _rt = ctypes.CDLL("librt.so.1", use_errno=True)
except OSError:
    _rt = _libc
_rt.mq_open.restype = ctypes.c_int
_rt.mq_send.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint]
_rt.mq_receive.restype = ctypes.c_ssize_t
_rt.mq_receive.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p]
IPC_CREAT, IPC_PRIVATE, IPC_NOWAIT, MSG_NOERROR, SHM_RDONLY = 0o1000, 0, 0o4000, 0o10000, 0o10000
SYS_ADD_KEY, SYS_KEYCTL = 248, 250  # x86_64
KEYCTL_READ, KEY_SPEC_SESSION, KEY_SPEC_USER = 11, -3, -4


def layout():
    """What a forked run may share with another fork of the same parent: the hash secret
    and the address-space layout (reported, not judged here)."""
    return {
        "hash": hash("agentrun-iso"),
        "libc": ctypes.cast(_libc.printf, ctypes.c_void_p).value,
        "heap": id(object()) >> 20,
    }


def err_name(e):
    n = getattr(e, "errno", None)
    return errno.errorcode.get(n, type(e).__name__) if n else type(e).__name__


def c_err():
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


# --- planting ---------------------------------------------------------------------------------


class Planted:
    def __init__(self):
        self.ok = {}  # what -> detail
        self.failed = {}  # what -> why
        self.keep = []  # objects that must stay alive (memory, sockets, threads)

    def do(self, what, fn):
        try:
            detail = fn()
            self.ok[what] = detail if detail is not None else True
        except Exception as e:  # noqa: BLE001 (every failure is reported, none is fatal)
            self.failed[what] = "%s: %s" % (err_name(e), e)


def write_file(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


def plant_files(p):
    home = os.environ.get("HOME") or "/root"
    dirs = ["/tmp", "/var/tmp", "/dev/shm", os.getcwd(), home, "/workspace", "/", "/etc", "/root"]
    for d in dict.fromkeys(dirs):
        p.do("file:" + d, lambda d=d: write_file(os.path.join(d, OWN), MB + b"\n"))


def plant_memory(p):
    heap = bytearray(MB * 4096)  # 152 KiB of markers on the heap
    words = [MARK[:13] + MARK[13:] for _ in range(64)]  # separate str objects
    anon = mmap.mmap(-1, 1 << 20)
    anon.write(MB * (len(anon) // len(MB)))
    p.keep += [heap, words, anon]
    return "heap, 64 str objects, 1 MiB anonymous mmap"


def plant_sysv(p):
    def shm():
        sid = _libc.shmget(IPC_PRIVATE, 1 << 16, IPC_CREAT | 0o666)
        if sid < 0:
            raise OSError(ctypes.get_errno(), "shmget")
        addr = _libc.shmat(sid, None, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "shmat")
        ctypes.memmove(addr, MB * 64, len(MB) * 64)
        p.shm_addr = addr
        return sid

    def msg():
        qid = _libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o666)
        if qid < 0:
            raise OSError(ctypes.get_errno(), "msgget")
        buf = struct.pack("l", 1) + MB
        if _libc.msgsnd(qid, buf, len(MB), IPC_NOWAIT) < 0:
            raise OSError(ctypes.get_errno(), "msgsnd")
        return qid

    def sem():
        sid = _libc.semget(int(MARK[-6:], 16) + 1, 1, IPC_CREAT | 0o666)
        if sid < 0:
            raise OSError(ctypes.get_errno(), "semget")
        return sid

    p.do("sysv_shm", shm)
    p.do("sysv_msg", msg)
    p.do("sysv_sem", sem)


def plant_mqueue(p):
    name = "/" + OWN

    def mq():
        fd = _rt.mq_open(name.encode(), os.O_CREAT | os.O_RDWR | os.O_NONBLOCK, 0o666, None)
        if fd >= 0:
            _rt.mq_send(fd, MB, len(MB), 0)
            return "made and sent"
        e = c_err()
        # (Landlock may refuse the open of a queue it made: its name is still there.)
        if OWN in os.listdir("/dev/mqueue"):
            return "made, open refused: " + e
        raise OSError(ctypes.get_errno(), "mq_open")

    p.do("mqueue", mq)


def plant_keyring(p):
    def key(ring):
        def add():
            r = _libc.syscall(SYS_ADD_KEY, b"user", OWN.encode(), MB, len(MB), ring)
            if r < 0:
                raise OSError(ctypes.get_errno(), "add_key")
            return r

        return add

    p.do("key_session", key(KEY_SPEC_SESSION))
    p.do("key_user", key(KEY_SPEC_USER))


def plant_posix_shm(p):
    try:
        import _posixshmem

        def shm():
            fd = _posixshmem.shm_open("/" + OWN + "-posix", os.O_CREAT | os.O_RDWR, 0o666)
            os.write(fd, MB)
            os.close(fd)

        p.do("posix_shm", shm)
    except ImportError as e:
        p.failed["posix_shm"] = str(e)


# The background process A leaves: it holds sockets and a memfd with the marker and answers
# every connection with it, as long as it lives (the run's end should end it).
BG = r"""
import os, socket, sys, threading, time
mark = sys.argv[1].encode()
w = int(sys.argv[2])
fd = os.memfd_create("iso-bg")
os.write(fd, mark * 16)
socks = []
u = socket.socket(socket.AF_UNIX); u.bind("\0iso-" + sys.argv[1]); u.listen(8); socks.append(u)
u = socket.socket(socket.AF_UNIX); u.bind("/tmp/iso-" + sys.argv[1] + ".sock"); u.listen(8); socks.append(u)
t = socket.socket(socket.AF_INET); t.bind(("127.0.0.1", 0)); t.listen(8); socks.append(t)
port = t.getsockname()[1]
try:
    t6 = socket.socket(socket.AF_INET6); t6.bind(("::1", port)); t6.listen(8); socks.append(t6)
except OSError:
    pass
d = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); d.bind(("127.0.0.1", port))
def serve(s):
    while True:
        c, _ = s.accept()
        try:
            c.sendall(mark)
        finally:
            c.close()
for s in socks:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
os.write(w, b"%d" % port)
os.close(w)
time.sleep(600)
"""


def plant_background(p):
    def bg():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                os.setsid()
                if os.fork() == 0:
                    os.dup2(os.open("/dev/null", os.O_RDWR), 0)
                    os.dup2(0, 1)
                    os.dup2(0, 2)
                    env = dict(os.environ, ISO_BG=MARK)
                    os.set_inheritable(w, True)
                    os.execve(sys.executable, [sys.executable, "-c", BG, MARK, str(w)], env)
            finally:
                os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        got = b""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], 1)
            if ready:
                chunk = os.read(r, 64)
                if not chunk:
                    break
                got += chunk
        os.close(r)
        if not got:
            raise RuntimeError("the background process did not start")
        return {"port": int(got)}

    p.do("background", bg)


def plant_all(p, extra_files=True):
    p.do("memory", lambda: plant_memory(p))
    if extra_files:
        plant_files(p)
    plant_sysv(p)
    plant_posix_shm(p)
    plant_mqueue(p)
    plant_keyring(p)


def need(value, why):
    if not value:
        raise LookupError(why)
    return value


def plant():
    p = Planted()
    carriers = CFG.get("carriers", [])
    p.ok["code"] = True  # this text carries the marker (the ISO line)
    if "env" in carriers:
        p.do("env", lambda: need([k for k, v in os.environ.items() if MARK in v], "not in the environment"))
    if "argv" in carriers:
        p.do("argv", lambda: need(any(MARK in a for a in sys.argv), "not in argv"))
    if "stdin" in carriers:
        p.do("stdin", lambda: need(MB in sys.stdin.buffer.read(), "not on stdin"))
    for path in CFG.get("read", []):
        p.do("read:" + path, lambda path=path: need(MB in read_bytes(path), "not in the file"))
    plant_all(p)
    plant_background(p)
    report = {"mark": MARK, "ok": p.ok, "failed": p.failed, "ppid": os.getppid(), "layout": layout()}
    print("ISO-PLANTED " + json.dumps(report), flush=True)
    # (the planted memory stays referenced until the process, or the context, ends)
    globals()["_iso_keep"] = p.keep
    linger()


def linger():
    """A container's main process stays (its container runs on for `exec`)."""
    if CFG.get("linger"):
        sys.stdout.flush()
        time.sleep(CFG["linger"])


# --- scanning ---------------------------------------------------------------------------------


class Channel:
    def __init__(self, name):
        self.name = name
        self.seen = {}  # marker -> [where, ...] (at most 8)
        self.own = []  # every place this run's own marker was seen
        self.checked = 0
        self.unreadable = {}  # reason -> count
        self.samples = {}  # reason -> a few paths
        self.strangers = []  # objects that are not this run's (IPC in a fresh namespace)

    def look(self, data, where):
        self.checked += 1
        if not data:
            return
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        for m in set(PAT.findall(data)):
            m = m.decode()
            if m == MARK:
                self.own.append(where)
            places = self.seen.setdefault(m, [])
            if len(places) < 8:
                places.append(where)

    def failed(self, where, e):
        why = err_name(e) if isinstance(e, BaseException) else str(e)
        self.unreadable[why] = self.unreadable.get(why, 0) + 1
        s = self.samples.setdefault(why, [])
        if len(s) < 4:
            s.append(where)

    def report(self):
        return {
            "seen": self.seen,
            "checked": self.checked,
            "unreadable": self.unreadable,
            "samples": self.samples,
            "strangers": self.strangers,
        }


def read_bytes(path, limit=FILE_MAX):
    with open(path, "rb", buffering=0) as f:
        return f.read(limit)


def regions(pid):
    """The readable regions of a process worth scanning: writable, anonymous, heap/stack,
    shared memory and deleted/memfd files (read-only file mappings are the files' own)."""
    out = []
    with open("/proc/%s/maps" % pid) as f:
        for line in f:
            parts = line.split(None, 5)
            perms = parts[1]
            path = parts[5].strip() if len(parts) > 5 else ""
            if perms[0] != "r" or path in ("[vvar]", "[vsyscall]", "[vvar_vclock]", "[vdso]"):
                continue
            if "w" in perms or not path or path.startswith("[") or "(deleted)" in path or \
                    path.startswith(("/memfd:", "/dev/shm", "/SYSV", "/dev/zero")):
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi, path or "anon"))
    return out


def scan_memory(ch, pid, limit=2 << 30):
    where = "pid %s" % pid
    try:
        regs = regions(pid)
        f = open("/proc/%s/mem" % pid, "rb", buffering=0)
    except OSError as e:
        ch.failed(where + " mem", e)
        return
    total = 0
    keep = len(MB) + 16
    with f:
        for lo, hi, path in regs:
            addr, tail = lo, b""
            while addr < hi and total < limit:
                n = min(CHUNK, hi - addr)
                try:
                    f.seek(addr)
                    data = f.read(n)
                except (OSError, OverflowError, ValueError) as e:
                    ch.failed("%s %s@%x" % (where, path, addr), e)
                    break
                if not data:
                    break
                ch.look(tail + data, "%s mem %s@%x" % (where, path, addr))
                tail = data[-keep:]
                addr += len(data)
                total += len(data)
                del data


def scan_self(chs):
    ch = chs["self_mem"]
    scan_memory(ch, os.getpid())
    chs["environ"].look(read_bytes("/proc/self/environ"), "/proc/self/environ")
    chs["environ"].look("\0".join("%s=%s" % kv for kv in os.environ.items()), "os.environ")
    chs["argv"].look(read_bytes("/proc/self/cmdline"), "/proc/self/cmdline")
    # (a process forked by a zygote has the zygote's cmdline: its argv is sys.argv)
    chs["argv"].look("\0".join(sys.argv), "sys.argv")
    if "stdin" in CFG.get("carriers", []):
        data = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            r, _, _ = select.select([0], [], [], 0.5)
            if not r:
                continue
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break
            data += chunk
        chs["stdin"].look(data, "stdin")


def scan_procs(chs):
    me = os.getpid()
    pids = sorted((int(p) for p in os.listdir("/proc") if p.isdigit()))
    listed = []
    for pid in pids:
        base = "/proc/%d" % pid
        try:
            comm = open(base + "/comm").read().strip()
        except OSError:
            comm = "?"
        listed.append("%d %s" % (pid, comm))
        chs["procs"].look(comm, base + "/comm")
        for name in ["cmdline", "environ", "status", "stat", "maps", "mountinfo", "cgroup", "limits", "sched", "wchan", "io"]:
            try:
                chs["procs"].look(read_bytes(base + "/" + name), base + "/" + name)
            except OSError as e:
                chs["procs"].failed(base + "/" + name, e)
        for link in ["cwd", "exe", "root"]:
            try:
                chs["procs"].look(os.readlink(base + "/" + link), base + "/" + link)
            except OSError as e:
                chs["procs"].failed(base + "/" + link, e)
        try:
            fds = os.listdir(base + "/fd")
        except OSError as e:
            chs["procs"].failed(base + "/fd", e)
            fds = []
        for fd in fds:
            try:
                target = os.readlink("%s/fd/%s" % (base, fd))
            except OSError as e:
                chs["procs"].failed("%s/fd/%s" % (base, fd), e)
                continue
            chs["procs"].look(target, "%s/fd/%s" % (base, fd))
            if pid != me and (target.startswith("/memfd:") or target.endswith("(deleted)")):
                try:
                    chs["procs"].look(read_bytes("%s/fd/%s" % (base, fd)), "%s/fd/%s -> %s" % (base, fd, target))
                except OSError as e:
                    chs["procs"].failed("%s/fd/%s" % (base, fd), e)
        if pid != me:
            scan_memory(chs["proc_mem"], pid)
    return listed


def mountinfo():
    out = []
    for line in open("/proc/self/mountinfo"):
        f = line.split()
        sep = f.index("-")
        mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), f[4])
        out.append((mp, "ro" in f[5].split(","), f[sep + 1]))
    return out


SKIP_FS = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs", "securityfs", "bpf", "pstore", "configfs", "fusectl", "binfmt_misc", "autofs", "hugetlbfs"}


def scan_files(ch):
    mounts = mountinfo()
    by_point = {}
    for mp, ro, fs in mounts:
        by_point[mp] = (ro, fs)  # the last mount on a point is the one seen

    def mount_of(path):
        best = "/"
        for mp in by_point:
            if (path == mp or path.startswith(mp.rstrip("/") + "/")) and len(mp) > len(best):
                best = mp
        return by_point.get(best, (False, "?"))

    rw_points = [mp for mp, (ro, fs) in by_point.items() if not ro and fs not in SKIP_FS]
    since = CFG.get("since", 0)
    walked = {"files": 0, "image_files": 0, "dirs": 0, "skipped_ro": []}
    seen_dirs = set()

    def walk(d):
        ro, fs = mount_of(d)
        if fs in SKIP_FS:
            return
        try:
            st = os.lstat(d)
        except OSError as e:
            ch.failed(d, e)
            return
        if (st.st_dev, st.st_ino) in seen_dirs:
            return
        seen_dirs.add((st.st_dev, st.st_ino))
        walked["dirs"] += 1
        try:
            entries = list(os.scandir(d))
        except OSError as e:
            ch.failed(d, e)
            return
        if ro:
            # A read-only mount: only on the way to a writable mount below it.
            if len(walked["skipped_ro"]) < 32:
                walked["skipped_ro"].append(d)
            for e in entries:
                p = e.path
                if e.is_dir(follow_symlinks=False) and any(
                        mp == p or mp.startswith(p.rstrip("/") + "/") for mp in rw_points):
                    walk(p)
            return
        for e in entries:
            p = e.path
            ch.look(e.name, "name " + p)
            try:
                if e.is_symlink():
                    ch.look(os.readlink(p), "link " + p)
                elif e.is_dir(follow_symlinks=False):
                    if p not in ("/proc", "/sys"):
                        walk(p)
                elif e.is_file(follow_symlinks=False):
                    # An image's own files (older than run A) are not read: what a run
                    # writes on the overlay root is newer.
                    if fs == "overlay" and e.stat(follow_symlinks=False).st_ctime < since:
                        walked["image_files"] += 1
                        continue
                    walked["files"] += 1
                    ch.look(read_bytes(p), p)
            except OSError as ex:
                ch.failed(p, ex)

    walk("/")
    # What the walk from / could not reach (a profile may not let a run list / or /var):
    # every writable mount and every place a run may write, from there.
    home = os.environ.get("HOME") or "/root"
    for d in rw_points + ["/tmp", "/var/tmp", "/dev/shm", os.getcwd(), home, "/workspace", "/root", "/etc"]:
        if os.path.isdir(d):
            walk(d)
    return walked


def scan_posix_shm(ch):
    for name in sorted(os.listdir("/dev/shm")):
        ch.look(name, "/dev/shm name")
        if OWN not in name:
            ch.strangers.append("/dev/shm/" + name)
        try:
            ch.look(read_bytes("/dev/shm/" + name), "/dev/shm/" + name)
        except OSError as e:
            ch.failed("/dev/shm/" + name, e)


def scan_mqueue(ch):
    try:
        names = sorted(os.listdir("/dev/mqueue"))
    except OSError as e:
        ch.failed("/dev/mqueue", e)
        return
    for name in names:
        ch.look(name, "/dev/mqueue name")
        if OWN not in name:
            ch.strangers.append("/dev/mqueue/" + name)
        try:
            ch.look(read_bytes("/dev/mqueue/" + name), "/dev/mqueue/" + name)
        except OSError as e:
            ch.failed("/dev/mqueue/" + name, e)
        fd = _rt.mq_open(("/" + name).encode(), os.O_RDONLY | os.O_NONBLOCK)
        if fd < 0:
            ch.failed("mq_open /" + name, c_err())
            continue
        buf = ctypes.create_string_buffer(1 << 20)
        while True:
            n = _rt.mq_receive(fd, buf, len(buf), None)
            if n < 0:
                break
            ch.look(buf.raw[:n], "mq_receive /" + name)
        os.close(fd)


def scan_sysv(ch, mine):
    for kind in ["shm", "msg", "sem"]:
        try:
            lines = open("/proc/sysvipc/" + kind).read().splitlines()
        except OSError as e:
            ch.failed("/proc/sysvipc/" + kind, e)
            continue
        ch.look("\n".join(lines), "/proc/sysvipc/" + kind)
        for line in lines[1:]:
            f = line.split()
            ident = int(f[1])
            if (kind, ident) not in mine:
                ch.strangers.append("%s key %s id %s" % (kind, f[0], ident))
            if kind == "shm":
                size = int(f[3])
                addr = _libc.shmat(ident, None, SHM_RDONLY)
                if addr in (None, ctypes.c_void_p(-1).value):
                    ch.failed("shmat %d" % ident, c_err())
                    continue
                ch.look(ctypes.string_at(addr, min(size, 64 << 20)), "shm id %d" % ident)
                _libc.shmdt(addr)
            elif kind == "msg":
                buf = ctypes.create_string_buffer(8 + (1 << 16))
                while True:
                    n = _libc.msgrcv(ident, buf, 1 << 16, 0, IPC_NOWAIT | MSG_NOERROR)
                    if n < 0:
                        if ctypes.get_errno() != errno.ENOMSG:
                            ch.failed("msgrcv %d" % ident, c_err())
                        break
                    ch.look(buf.raw[8:8 + n], "msg id %d" % ident)


def scan_sockets(ch):
    listening = []
    try:
        unix = open("/proc/net/unix").read()
        ch.look(unix, "/proc/net/unix")
        for line in unix.splitlines()[1:]:
            f = line.split()
            if len(f) >= 8 and int(f[3], 16) & 0x10000:  # __SO_ACCEPTCON: listening
                listening.append(("unix", f[7]))
    except OSError as e:
        ch.failed("/proc/net/unix", e)
    for name in ["tcp", "tcp6", "udp", "udp6", "raw", "raw6", "packet", "netlink"]:
        try:
            text = open("/proc/net/" + name).read()
        except OSError as e:
            ch.failed("/proc/net/" + name, e)
            continue
        ch.look(text, "/proc/net/" + name)
        if name in ("tcp", "tcp6"):
            for line in text.splitlines()[1:]:
                f = line.split()
                if f[3] == "0A":
                    listening.append((name, int(f[1].rsplit(":", 1)[1], 16)))
    for kind, where in listening:
        try:
            if kind == "unix":
                s = socket.socket(socket.AF_UNIX)
                addr = "\0" + where[1:] if where.startswith("@") else where
            else:
                s = socket.socket(socket.AF_INET if kind == "tcp" else socket.AF_INET6)
                addr = ("127.0.0.1" if kind == "tcp" else "::1", where)
            s.settimeout(1)
            with s:
                s.connect(addr)
                data = b""
                try:
                    while len(data) < 4096:
                        chunk = s.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                except socket.timeout:
                    pass
            ch.look(data, "connect %s %s" % (kind, where))
        except OSError as e:
            ch.failed("connect %s %s" % (kind, where), e)


def scan_keys(ch):
    ids = []
    for f in ["/proc/keys", "/proc/key-users"]:
        try:
            text = open(f).read()
        except OSError as e:
            ch.failed(f, e)
            continue
        ch.look(text, f)
        if f == "/proc/keys":
            ids = [int(line.split()[0], 16) for line in text.splitlines() if line.strip()]
    for kid in ids:
        buf = ctypes.create_string_buffer(1 << 16)
        n = _libc.syscall(SYS_KEYCTL, KEYCTL_READ, kid, buf, len(buf))
        if n < 0:
            ch.failed("keyctl read %x" % kid, c_err())
            continue
        ch.look(buf.raw[:n], "keyctl read %x" % kid)


def scan_cgroup(ch):
    """The run's cgroup as it sees it, and every cgroup file it can read (the shell's
    cgroup namespace; a sandbox may see none)."""
    ch.look(read_bytes("/proc/self/cgroup"), "/proc/self/cgroup")
    n = 0
    for root, dirs, files in os.walk("/sys/fs/cgroup", onerror=lambda e: ch.failed(e.filename, e)):
        for name in files + dirs:
            ch.look(name, "name " + os.path.join(root, name))
        for name in files:
            p = os.path.join(root, name)
            if n >= 5000:
                return
            n += 1
            try:
                ch.look(read_bytes(p, 1 << 16), p)
            except OSError as e:
                ch.failed(p, e)


def scan_procfs(ch):
    for f in ["/proc/mounts", "/proc/self/mountinfo", "/proc/locks", "/proc/sys/kernel/hostname",
              "/proc/sys/kernel/domainname", "/proc/sysvipc/shm", "/etc/hostname", "/etc/hosts"]:
        try:
            ch.look(read_bytes(f, 1 << 16), f)
        except OSError as e:
            ch.failed(f, e)
    ch.look(" ".join(os.uname()), "uname")


def cleanup(p):
    """Removes this scan's IPC objects and /dev/shm files: a later scan in the same sandbox
    (OpenSandbox B runs three) then finds only what another run left."""
    IPC_RMID = 0
    if "sysv_shm" in p.ok:
        _libc.shmdt(ctypes.c_void_p(p.shm_addr))
        _libc.shmctl(p.ok["sysv_shm"], IPC_RMID, None)
    if "sysv_msg" in p.ok:
        _libc.msgctl(p.ok["sysv_msg"], IPC_RMID, None)
    if "sysv_sem" in p.ok:
        _libc.semctl(p.ok["sysv_sem"], 0, IPC_RMID)
    _rt.mq_unlink(("/" + OWN).encode())
    for name in os.listdir("/dev/shm"):
        if OWN in name:
            try:
                os.unlink("/dev/shm/" + name)
            except OSError:
                pass


def scan():
    t0 = time.monotonic()
    carriers = CFG.get("carriers", [])
    p = Planted()
    plant_all(p)
    # A child with the marker in its argv, environment and memory (the procs/proc_mem control).
    child = None
    try:
        child = subprocess.Popen(
            [sys.executable, "-S", "-c", "import sys, time; x = sys.argv[1] * 64; time.sleep(300)", MARK],
            env={"ISO_CHILD": MARK, "PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while MB not in read_bytes("/proc/%d/cmdline" % child.pid):
            if time.monotonic() > deadline:
                raise RuntimeError("the child did not start")
            time.sleep(0.02)
        time.sleep(0.2)  # (its interpreter up: the marker in its heap too)
        p.ok["child"] = child.pid
    except Exception as e:  # noqa: BLE001
        p.failed["child"] = "%s: %s" % (err_name(e), e)
    # Listeners answering with the marker (the sockets control).
    def serve(s):
        while True:
            try:
                c, _ = s.accept()
                c.sendall(MB)
                c.close()
            except OSError:
                return

    def listener():
        socks = []
        u = socket.socket(socket.AF_UNIX)
        u.bind("\0" + OWN)
        u.listen(8)
        socks.append(u)
        t = socket.socket(socket.AF_INET)
        t.bind(("127.0.0.1", 0))
        t.listen(8)
        socks.append(t)
        for s in socks:
            threading.Thread(target=serve, args=(s,), daemon=True).start()
        p.keep.extend(socks)
        return t.getsockname()[1]

    p.do("sockets", listener)

    names = ["self_mem", "environ", "argv", "stdin", "procs", "proc_mem", "files", "posix_shm",
             "mqueue", "sysv", "sockets", "keys", "cgroup", "procfs"]
    chs = {n: Channel(n) for n in names}
    mine = set()
    for k, kind in [("sysv_shm", "shm"), ("sysv_msg", "msg"), ("sysv_sem", "sem")]:
        if isinstance(p.ok.get(k), int) and not isinstance(p.ok.get(k), bool):
            mine.add((kind, p.ok[k]))
    extra = {}
    for name, fn in [
        ("self", lambda: scan_self(chs)),
        ("procs", lambda: extra.__setitem__("processes", scan_procs(chs))),
        ("files", lambda: extra.__setitem__("walk", scan_files(chs["files"]))),
        ("posix_shm", lambda: scan_posix_shm(chs["posix_shm"])),
        ("mqueue", lambda: scan_mqueue(chs["mqueue"])),
        ("sysv", lambda: scan_sysv(chs["sysv"], mine)),
        ("sockets", lambda: scan_sockets(chs["sockets"])),
        ("keys", lambda: scan_keys(chs["keys"])),
        ("cgroup", lambda: scan_cgroup(chs["cgroup"])),
        ("procfs", lambda: scan_procfs(chs["procfs"])),
    ]:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (a channel that breaks is reported as such)
            extra.setdefault("crashed", {})[name] = "%s: %s" % (err_name(e), e)
    if child is not None:
        child.kill()
        child.wait()
    cleanup(p)

    # Where this run's own marker must have been seen (the positive control).
    expect = {"self_mem": p.ok.get("memory")}
    if "env" in carriers:
        expect["environ"] = True
    if "argv" in carriers:
        expect["argv"] = True
    if "stdin" in carriers:
        expect["stdin"] = True
    if "child" in p.ok:
        expect["procs"] = "child %s" % p.ok["child"]
        expect["proc_mem"] = "child %s" % p.ok["child"]
    if any(k.startswith("file:") for k in p.ok):
        expect["files"] = [k[5:] for k in p.ok if k.startswith("file:")]
    if "posix_shm" in p.ok or "file:/dev/shm" in p.ok:
        expect["posix_shm"] = True
    if "mqueue" in p.ok:
        expect["mqueue"] = p.ok["mqueue"]
    if any(k.startswith("sysv_") and k != "sysv_sem" for k in p.ok):
        expect["sysv"] = [k for k in p.ok if k.startswith("sysv_")]
    if "sockets" in p.ok:
        expect["sockets"] = True
    if "key_session" in p.ok or "key_user" in p.ok:
        expect["keys"] = True
    missing = {c: what for c, what in expect.items() if MARK not in chs[c].seen}
    # Each planted file must have been read.
    if "files" in expect:
        places = set(chs["files"].own)
        lost = [d for d in expect["files"] if os.path.join(d, OWN) not in places]
        if lost:
            missing["files"] = lost
    verdict = {
        "mark": MARK,
        "planted": p.ok,
        "unplantable": p.failed,
        "expect": expect,
        "missing": missing,
        "channels": {n: c.report() for n, c in chs.items()},
        "seconds": round(time.monotonic() - t0, 2),
        "ppid": os.getppid(),
        "layout": layout(),
    }
    verdict.update(extra)
    print("ISO-VERDICT " + json.dumps(verdict), flush=True)
    linger()


if CFG["role"] == "plant":
    plant()
else:
    scan()
