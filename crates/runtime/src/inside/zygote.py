# agentrun's Python zygote (see crates/runtime/src/inside/zygote.rs, which ships this file inside the
# agentrun binary and starts it as `python3 -c <this file> MODULE...` in a shell).
#
# It imports the preload modules, then serves fork requests from the shell's cells on fd 3.
# For each request it forks a child *into the requesting cell* (its pid namespace through
# setns before the fork; its mount and ipc namespaces and root in the child), which reads the
# run's request (argv, environment, code, ...) from a socket of its own, then confines
# itself exactly as the cell prepared it (rlimits, capabilities, the cell's Landlock ruleset,
# the run's seccomp filter), takes the run's stdio, environment and working directory, and
# runs the code as `__main__` the way a fresh `python3` would. The zygote reaps its children
# and reports each one's wait status and resource usage on the run's report socket.
#
# Everything the child needs is decided on the Rust side; this file only performs it. The
# zygote never runs a run's code itself: only its forked children do, after confinement.
#
# The zygote never holds anything of a run either (its argv, environment, code, file names,
# working directory, stdin or output): every later run is forked from its memory. A fork
# request is the fixed bytes b"go" and fds; the run's request waits, written by the cell, on
# one of those fds, which only the forked child reads (see _Run.read_request). What the zygote
# itself reads is the cell's signal requests and its children's wait status.
#
# A spare cell may ask ahead of its run (b"ahead" and three fds: report socket, request
# socket, pid namespace): the child is forked into the cell's pid namespace at once and waits
# for the run's request, which then brings the other fds (namespaces, root, stdio, ruleset).
import sys
import os

# What a fresh interpreter has when its program starts: modules, and signals ignored (the
# interpreter's own SIGPIPE and SIGXFSZ, and what it inherited, as an exec'd command does).
_FRESH_MODULES = frozenset(sys.modules)


def _status_bits(field):
    """The bits set in a hex mask of /proc/self/status (`SigIgn:`, `CapBnd:`, ...)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                mask = int(line.split()[1], 16)
                return frozenset(n for n in range(64) if mask >> n & 1)
    return frozenset()


def _sigset(field):
    """The signals of a signal mask of /proc/self/status (signal N is bit N-1)."""
    return frozenset(n + 1 for n in _status_bits(field))


_FRESH_IGNORED = _sigset("SigIgn:")

# The preload list first, so that what it imports is told apart from what this file imports
# (which a run's process does not keep, see _reset_interpreter).
_report = {"preloaded": [], "skipped": {}}
_name = None
for _name in sys.argv[1:]:
    try:
        __import__(_name)
        _report["preloaded"].append(_name)
    except BaseException as e:  # reported and skipped, never fatal
        _report["skipped"][_name] = "%s: %s" % (type(e).__name__, e)
del _name
_PRELOADED_MODULES = frozenset(sys.modules) - _FRESH_MODULES

_BOOT = globals()
_ZYGOTE_FD = 3
_READY_FD = 4


def _fatal(msg):
    try:
        os.write(2, ("agentrun zygote: %s\n" % msg).encode())
    finally:
        os._exit(125)


try:
    import ctypes
    import json
    import resource
    import select
    import selectors
    import signal
    import socket
    import struct
except Exception as e:  # an image without the standard library's C modules
    _fatal("cannot start: %s: %s" % (type(e).__name__, e))

_libc = ctypes.CDLL(None, use_errno=True)
_ARCH = os.uname().machine
# capget/capset numbers (the rest go through glibc's wrappers).
_SYS = {
    "x86_64": {"capget": 125, "capset": 126, "rt_sigaction": 13},
    "aarch64": {"capget": 90, "capset": 91, "rt_sigaction": 134},
}.get(_ARCH)
_SYS_LANDLOCK_RESTRICT_SELF = 446  # the same on every architecture
_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_PR_SET_PDEATHSIG = 1
_PR_SET_SECCOMP = 22
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SECCOMP_MODE_FILTER = 2
_CAP_VERSION_3 = 0x20080522


def _check(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _install_filter(program):
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    _check(
        _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0),
        "seccomp",
    )


def _narrow_capabilities(keep, last_cap):
    for cap in range(last_cap + 1):
        if cap not in keep and cap in _BOUNDING:
            rc = _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
            if rc != 0 and ctypes.get_errno() != 22:  # EINVAL: a cap this kernel lacks
                _check(rc, "dropping capability %d" % cap)
    _check(_libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient caps")
    if _SYS is None:
        raise OSError(0, "capabilities: unknown architecture %s" % _ARCH)
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.syscall(_SYS["capget"], ctypes.byref(header), data), "capget")
    for i in range(2):
        mask = 0
        for cap in keep:
            if cap // 32 == i:
                mask |= 1 << (cap % 32)
        data[i].effective &= mask
        data[i].permitted &= mask
        data[i].inheritable = 0
    _check(_libc.syscall(_SYS["capset"], ctypes.byref(header), data), "capset")


def _setns(fd, kind, what):
    _check(_libc.setns(fd, kind), "setns " + what)


# --- start-up: what every child installs, then the preload list --------------------------------

_chan = socket.socket(fileno=_ZYGOTE_FD)
_setup = json.loads(_chan.recv(1 << 20))
_FILTERS = [bytes.fromhex(p) for p in _setup["filters"]]
_KEEP_CAPS = frozenset(_setup["keep_caps"])
with open("/proc/sys/kernel/cap_last_cap") as f:
    _LAST_CAP = int(f.read())
_BOUNDING = _status_bits("CapBnd:")
_OWN_PIDNS = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
with open("/proc/self/oom_score_adj") as f:
    _OOM_SCORE_ADJ = str(min(1000, int(f.read()) + 500))
# -u / PYTHONUNBUFFERED (sys.flags does not say): the interpreter made stdout write-through.
_UNBUFFERED = sys.stdout.write_through

# One line in the shell's init log, which `agentrun pool status` reads.
os.write(2, ("agentrun zygote: ready: %s\n" % json.dumps(_report)).encode())
del _report
sys.stdout.flush()
sys.stderr.flush()
import gc  # noqa: E402

gc.collect()
# Objects made so far stay out of the collector's reach: the children's collections then do not
# touch (and copy) the pages that hold them.
gc.freeze()


# --- serving ---------------------------------------------------------------------------------

# A fork request's bytes (nothing else: see the top of this file) and its fds: the report
# socket, the run's request socket, the cell's pid, mount and ipc namespaces and root, the
# run's stdin, stdout and stderr, and the cell's Landlock ruleset if it has one.
_GO = b"go"
_RUN_FDS = 9
# A spare cell's request for a child ahead of its run: these bytes and 3 fds (report socket,
# request socket, pid namespace); the other 6 or 7 (_PLACE_FDS) come with the request.
_AHEAD = b"ahead"
_AHEAD_FDS = 3
_PLACE_FDS = 6
# Largest run request the child reads (the cell's socket buffer bounds it well below).
_MAX_REQUEST = 1 << 20


class _Run:
    """One fork request, as the cell sent it: fds only. `go`: every fd of the run (its request
    is already queued on its request socket). `ahead` (a spare cell's, before it has a run):
    the report and request sockets and the cell's pid namespace; the rest of the fds come
    with the request, which the child waits for."""

    def __init__(self, fds, ahead=False):
        self.ahead = ahead
        self.fds = fds
        self.req = None
        self.report, self.request, self.pidns = fds[:_AHEAD_FDS]
        if not ahead:
            self._place(fds[_AHEAD_FDS:])

    def _place(self, fds):
        (self.mntns, self.ipcns, self.root, self.stdin, self.stdout,
         self.stderr) = fds[:_PLACE_FDS]
        self.landlock = fds[_PLACE_FDS] if len(fds) > _PLACE_FDS else None

    def read_request(self):
        """In the forked child only: the run's request (JSON), which its cell wrote on the
        request socket (before it asked for the fork; an `ahead` child waits for it, with the
        cell's namespaces, root, the run's stdio and the ruleset as its fds). One read. The
        cell hanging up instead (its spare was not wanted, or its run is exec'd) ends the
        child: it ran nothing."""
        if not self.ahead:
            self.req = json.loads(os.read(self.request, _MAX_REQUEST))
            return
        sock = socket.socket(fileno=self.request)
        try:
            msg, fds, flags, _addr = socket.recv_fds(sock, _MAX_REQUEST, _PLACE_FDS + 1)
        finally:
            sock.detach()
        if not msg:
            os._exit(0)
        self.fds = self.fds + fds
        if flags & socket.MSG_TRUNC or len(fds) not in (_PLACE_FDS, _PLACE_FDS + 1):
            raise OSError(0, "a request with %d fds" % len(fds))
        self._place(fds)
        self.req = json.loads(msg)

    def close_all(self, keep=()):
        for fd in self.fds:
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _send(fd, msg):
    try:
        os.write(fd, json.dumps(msg).encode())
        return True
    except OSError:
        return False


def _hung_up(fd):
    p = select.poll()
    p.register(fd, select.POLLHUP)
    return any(ev & (select.POLLHUP | select.POLLERR) for _, ev in p.poll(0))


def _reseed():
    """Draws numpy's global generator afresh for the next child (os.fork reseeds `random` in
    each child; numpy's would be the zygote's). Done in the zygote right after each fork, off
    the run's path: each child starts from a state drawn after the previous one was forked."""
    nprandom = sys.modules.get("numpy.random")
    if nprandom is not None:
        try:
            nprandom.seed()
        except Exception:
            pass


def _serve():
    """The zygote's loop. Returns only in a forked child, with its run."""
    sel = selectors.DefaultSelector()
    sel.register(_chan, selectors.EVENT_READ, "request")
    children = {}  # pidfd -> (pid, report fd)
    by_report = {}  # report fd -> pid
    while True:
        for key, _ in sel.select():
            if key.data == "request":
                try:
                    msg, fds, _flags, _addr = socket.recv_fds(_chan, len(_AHEAD), 16)
                except OSError:
                    os._exit(0)
                if not msg:
                    os._exit(0)  # the shell's init is gone
                go = msg == _GO and len(fds) in (_RUN_FDS, _RUN_FDS + 1)
                ahead = msg == _AHEAD and len(fds) == _AHEAD_FDS
                if _flags & socket.MSG_TRUNC or not (go or ahead):
                    for fd in fds:
                        os.close(fd)
                    continue
                run = _Run(fds, ahead)
                if _hung_up(run.report):
                    run.close_all()  # a request its cell stopped waiting for
                    continue
                # What the zygote made since its last fork stays out of the child's
                # collections and its exit's scan for open files (which would copy its pages).
                gc.freeze()
                try:
                    _setns(run.pidns, _CLONE_NEWPID, "pid")
                    pid = os.fork()
                except OSError as e:
                    _send(run.report, {"failed": "fork: %s" % e})
                    run.close_all()
                    continue
                if pid == 0:
                    sel.close()
                    # Its fd is closed with the others before the run; the object must not
                    # close that number again later (by then it may be one of the run's).
                    _chan.detach()
                    return run
                _setns(_OWN_PIDNS, _CLONE_NEWPID, "pid (back)")
                _reseed()
                run.close_all(keep=(run.report,))
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, run.report)
                by_report[run.report] = pid
                sel.register(pidfd, selectors.EVENT_READ, "exit")
                sel.register(run.report, selectors.EVENT_READ, "signal")
            elif key.data == "signal":
                # The cell asks for a signal to the child or its group. It cannot send it
                # itself: the child restricted itself into a Landlock domain of its own, and
                # Landlock lets no process outside it signal into it; the zygote has none.
                pid = by_report.get(key.fd)
                try:
                    msg = json.loads(os.read(key.fd, 4096) or b"null")
                except (OSError, ValueError):
                    msg = None
                if pid is None or not isinstance(msg, dict):
                    sel.unregister(key.fd)  # the cell closed its end: nothing more to send
                    continue
                if msg.get("ping"):
                    # A cell about to hand its run to a child forked ahead checks that the
                    # zygote (which reports the child's end) still answers.
                    _send(key.fd, {"pong": True})
                    continue
                try:
                    if msg.get("group"):
                        os.killpg(pid, msg["signal"])
                    else:
                        os.kill(pid, msg["signal"])
                except (OSError, KeyError, TypeError, ValueError):
                    pass
            else:
                pidfd = key.fd
                sel.unregister(pidfd)
                pid, report = children.pop(pidfd)
                os.close(pidfd)
                _, status, ru = os.wait4(pid, 0)
                if by_report.pop(report, None) is not None:
                    try:
                        sel.unregister(report)
                    except KeyError:
                        pass
                _send(report, {"exit": status, "user_us": int(ru.ru_utime * 1e6),
                               "system_us": int(ru.ru_stime * 1e6), "max_rss_kb": ru.ru_maxrss})
                os.close(report)


def _enter(run):
    """In the forked child: becomes the run's process, confined like an exec'd one."""
    req = run.req
    _libc.prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)
    _setns(run.mntns, _CLONE_NEWNS, "mnt")
    os.fchdir(run.root)
    os.chroot(".")
    _setns(run.ipcns, _CLONE_NEWIPC, "ipc")
    os.setpgid(0, 0)
    for res, value in ((resource.RLIMIT_NOFILE, req["limits"]["nofile"]),
                       (resource.RLIMIT_NPROC, req["limits"]["nproc"]),
                       (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (value, value))
    try:
        # The zygote is in the shell's cgroup too: under memory pressure the run goes first.
        # (Before Landlock, which gives no write access to /proc.)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(_OOM_SCORE_ADJ)
    except OSError:
        pass
    _narrow_capabilities(_KEEP_CAPS, _LAST_CAP)
    _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if run.landlock is not None:
        _check(_libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, run.landlock, 0), "landlock")
    for program in _FILTERS:
        _install_filter(program)
    # From here on the process can do no more than an exec'd command of the run.
    for n, fd in enumerate((run.stdin, run.stdout, run.stderr)):
        os.dup2(fd, n)
    os.chdir(req["cwd"])


def _fallback_reason(req):
    """Why this run should be exec'd after all (what only the cell's files can tell)."""
    mode = req["mode"]
    if mode == "file":
        path = req["target"]
        try:
            st = os.stat(path)
        except OSError:
            return "the script cannot be opened"
        import stat
        if not stat.S_ISREG(st.st_mode):
            return "the script is not a regular file"
        try:
            with open(path, "rb") as f:
                head = f.read(4)
                f.seek(0, 2)
                if f.tell() >= 22:
                    f.seek(-22, 2)
                    if f.read(4) == b"PK\x05\x06" or head == b"PK\x03\x04":
                        return "the script is a zip archive"
        except OSError:
            return "the script cannot be read"
    if mode == "stdin" and os.isatty(0):
        return "stdin is a terminal (interactive)"
    return None


def _fresh_stdio():
    """sys.stdin/stdout/stderr as a fresh interpreter makes them on the run's fds 0, 1, 2."""
    import io
    unbuffered = _UNBUFFERED
    made = []
    for fd, old, name in ((0, sys.__stdin__, "<stdin>"), (1, sys.__stdout__, "<stdout>"),
                          (2, sys.__stderr__, "<stderr>")):
        raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
        if fd == 0:
            buf = io.BufferedReader(raw)
        elif unbuffered:
            buf = raw
        else:
            buf = io.BufferedWriter(raw)
        raw.name = name
        line_buffering = not unbuffered and fd != 0 and (fd == 2 or raw.isatty())
        text = io.TextIOWrapper(buf, encoding=old.encoding, errors=old.errors, newline="\n",
                                line_buffering=line_buffering, write_through=bool(unbuffered))
        text.mode = "r" if fd == 0 else "w"
        made.append(text)
    sys.stdin, sys.stdout, sys.stderr = made
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = made


def _ignore_raw(sig):
    """SIG_IGN for a signal glibc keeps to itself (32, 33: sigaction refuses them; glibc
    installs its handler again when it needs one)."""
    if _SYS is None:
        return
    act = (ctypes.c_ulong * 4)(1, 0, 0, 0)  # handler SIG_IGN, flags, (restorer,) mask
    if _ARCH == "aarch64":
        act = (ctypes.c_ulong * 3)(1, 0, 0)
    _libc.syscall(_SYS["rt_sigaction"], sig, act, None, 8)


def _signal_fixes():
    """What differs between the zygote's signal dispositions (which its children inherit)
    and a fresh interpreter's: what it was started with ignored, SIGINT raising
    KeyboardInterrupt, the rest default. Worked out once, in the zygote: [(signal, action)]."""
    caught = _sigset("SigCgt:")
    ignored = _sigset("SigIgn:")
    fixes = [(signal.SIGINT, signal.default_int_handler)]
    for sig in range(1, 65):
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGINT):
            continue
        want_ignored = sig in _FRESH_IGNORED
        if want_ignored and sig not in ignored:
            fixes.append((sig, signal.SIG_IGN))
        elif not want_ignored and (sig in ignored or sig in caught):
            fixes.append((sig, signal.SIG_DFL))
    return fixes


def _fresh_signals():
    """Signal dispositions as a fresh interpreter has them (see _signal_fixes)."""
    for sig, action in _SIGNAL_FIXES:
        try:
            signal.signal(sig, action)
        except (OSError, ValueError):
            if action is signal.SIG_IGN:
                _ignore_raw(sig)
            # else glibc's own (its handler does nothing unless glibc asked for it)


def _reset_interpreter(req):
    """What a fresh interpreter would have that the zygote's copy does not."""
    import warnings
    _fresh_signals()
    os.environ.clear()
    for kv in req["env"]:
        k, _, v = kv.partition("=")
        os.environ[k] = v
    sys.orig_argv = list(req["orig_argv"])
    warnings._filters_mutated()
    warnings.onceregistry.clear()
    _fresh_stdio()
    # The modules this file imported are the zygote's, not the run's: a fresh interpreter
    # has only its own and (here) the preload list's. Ours keep working for this file. (A
    # list worked out in the zygote: going over every module here would write to, and so
    # copy, the pages of all their names.)
    for name in _OWN_MODULES:
        sys.modules.pop(name, None)


def _main_module(**attrs):
    import builtins
    import types
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __annotations__={}, **attrs)
    sys.modules["__main__"] = main
    return main.__dict__


def _user_traceback(tb):
    """The traceback without the zygote's own frames (a fresh interpreter has none)."""
    while tb is not None and tb.tb_frame.f_globals is _BOOT:
        tb = tb.tb_next
    return tb


def _run(req):
    """Runs the request's code as `__main__`; returns only by raising (SystemExit at the end)."""
    import importlib.machinery
    mode, target, args = req["mode"], req.get("target"), req["args"]
    if mode == "module":
        import runpy
        sys.argv = ["-m"] + args
        sys.path[0] = os.getcwd()
        _main_module(__loader__=importlib.machinery.BuiltinImporter, __spec__=None,
                     __package__=None, __doc__=None)
        runpy._run_module_as_main(target)
        return
    if mode == "command":
        sys.argv = ["-c"] + args
        sys.path[0] = ""
        source, filename = target, "<string>"
        g = _main_module(__loader__=importlib.machinery.BuiltinImporter, __spec__=None,
                         __package__=None, __doc__=None)
    elif mode == "stdin":
        sys.argv = args if args else [""]
        sys.path[0] = ""
        source, filename = sys.stdin.buffer.read(), "<stdin>"
        g = _main_module(__file__="<stdin>", __cached__=None,
                         __loader__=importlib.machinery.BuiltinImporter, __spec__=None,
                         __package__=None, __doc__=None)
    else:
        sys.argv = [target] + args
        path = target if os.path.isabs(target) else os.path.join(os.getcwd(), target)
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        with open(path, "rb") as f:
            source = f.read()
        filename = path
        g = _main_module(__file__=path, __cached__=None, __spec__=None, __package__=None,
                         __doc__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    code = compile(source, filename, "exec", dont_inherit=True)
    exec(code, g)


# --- a child from here on --------------------------------------------------------------------

_SIGNAL_FIXES = _signal_fixes()
_OWN_MODULES = tuple(set(sys.modules) - _FRESH_MODULES - _PRELOADED_MODULES)
# A fresh interpreter has no import caches: the zygote's are marked stale once, here, so that
# every child looks at its cell's own files on its first import from each directory (the
# zygote imports nothing from now on).
import importlib  # noqa: E402

importlib.invalidate_caches()
del importlib
os.close(_READY_FD)  # readers of the ready pipe see its end: the zygote serves from now on
_run_req = _serve()
try:
    _run_req.read_request()
    _enter(_run_req)
    _why = _fallback_reason(_run_req.req)
except BaseException as e:
    _send(_run_req.report, {"failed": "%s: %s" % (type(e).__name__, e)})
    os._exit(125)
if _why is not None:
    _send(_run_req.report, {"fallback": _why})
    os._exit(125)
if not _send(_run_req.report, {"started": os.getpid()}):
    os._exit(125)  # the cell gave up on us (it exec'd the command instead): run nothing
os.closerange(3, 1 << 30)
_reset_interpreter(_run_req.req)
_req = _run_req.req
del _run_req, _why


def _exit_code(e):
    """The exit code of an uncaught SystemExit, its message printed, as the interpreter does
    (None: 0, an int: itself, anything else: printed on stderr, 1); None when the code is an
    int the interpreter would not take as one (the exact path then decides)."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code if -(1 << 31) <= code < (1 << 31) else None
    try:
        sys.stderr.write(str(code))
        sys.stderr.write("\n")
    except Exception:
        return None
    return 1


def _flushed():
    """Flushes stdout and stderr; False if one failed (the exact path then reports it)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            return False
    return True


def _finish(code, sigint=False):
    """Ends the run's process as the interpreter's finalization would, without its module
    teardown: that frees every object of the preloaded modules too, and in a process forked
    from the zygote writes to (copies) most of its pages: ~30 ms where a fresh interpreter
    spends ~1. In the interpreter's order: threads the program started are waited for, atexit
    handlers run, stdout and stderr are flushed, `__main__`'s globals are released in order (so
    that their finalizers run, as when the interpreter frees the module), garbage is collected, files
    the program left open are closed (flushing what they buffer), then the process exits. A
    flush that fails makes the interpreter's own finalization do the rest (exact, slow)."""
    import atexit  # here: the program must not find it imported
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()
    atexit._run_exitfuncs()
    if code is None or not _flushed():
        raise SystemExit(code if code is not None else 1)
    main = sys.modules.get("__main__")
    if main is not None:
        # In order, as the module's dict is freed when nothing else holds it.
        d = main.__dict__
        for k in list(d):
            if k != "__builtins__":
                d[k] = None
        del d, k
    del main
    gc.collect()
    import io
    # The standard streams stay open (and so do the layers under them), as at the
    # interpreter's exit.
    std = set()
    for x in (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__):
        while x is not None and id(x) not in std:
            std.add(id(x))
            x = getattr(x, "buffer", None) or getattr(x, "raw", None)
    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase) and id(obj) not in std:
            try:
                if not obj.closed:
                    obj.close()
            except Exception:
                pass
    del obj
    if not _flushed():
        raise SystemExit(code)
    if sigint:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


try:
    _run(_req)
except SystemExit as e:
    _code = _exit_code(e)
    if _code is None:
        raise
    del e
    _finish(_code)
except KeyboardInterrupt as e:
    # A fresh interpreter prints it, finishes (threads, atexit, ...), then dies of SIGINT.
    e.__traceback__ = _user_traceback(e.__traceback__)
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, e.__traceback__
    sys.excepthook(type(e), e, e.__traceback__)
    del e
    _finish(130, sigint=True)
except BaseException as e:
    # The default hook prints the exception's own traceback: trim that one.
    e.__traceback__ = _user_traceback(e.__traceback__)
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, e.__traceback__
    sys.excepthook(type(e), e, e.__traceback__)
    del e
    _finish(1)
else:
    _finish(0)
