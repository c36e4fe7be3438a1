#!/usr/bin/python3
"""hack/bench's helpers for the warm pool daemon (`agentrun serve`).

    pool.py wait-socket SOCKET PID SECS     # 0 once SOCKET accepts a connection; 1 if PID died
                                            # or SECS passed (reason on stdout)
    pool.py status BIN [PROFILE]            # pool counters as JSON {ready,target,hits,misses,...}
                                            # summed over pools ({} when unavailable)
    pool.py ready BIN STATE_DIR [PROFILE]   # JSON list of idle pooled sandboxes [{id,pid}]
    pool.py wait-full BIN STATE_DIR SECS [PROFILE]  # waits until the pool is full and idle;
                                            # prints count
    pool.py mem BIN STATE_DIR DAEMON_PID [PROFILE]  # markdown: host memory per idle pooled
                                            # sandbox
    pool.py mem-row LABEL BIN STATE_DIR DAEMON_PID [PROFILE]  # the same, one markdown row:
                                            # label, shells, processes and python3 processes
                                            # per shell, RSS, PSS, of which python3's PSS,
                                            # tmpfs, PSS + tmpfs, memory cgroup (MiB)
    pool.py cpu BIN DAEMON_PID N [OPT...]   # markdown: CPU per run of `BIN exec OPT... -- /bin/true`
                                            # back to back, warm (daemon side + client) and cold
PROFILE: only the pools (and shells) of that profile, as `agentrun ps`/`pool status` name it
(a profile file by its absolute path).
"""
import json
import os
import socket
import subprocess
import sys
import time

CG = "/sys/fs/cgroup"


def run_json(bin_, *args):
    try:
        p = subprocess.run([bin_, *args], capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        return None
    if p.returncode != 0:
        return None
    try:
        return json.loads(p.stdout)
    except ValueError:
        return None


def status(bin_, profile=None):
    """Pool counters summed over pools (the `pools` list of `agentrun pool status --json`,
    or any list of objects with `ready` and `target`); with `profile`, over its pools."""
    data = run_json(bin_, "pool", "status", "--json")
    if data is None:
        return {}
    pools = data.get("pools", []) if isinstance(data, dict) else data
    if isinstance(data, dict) and "ready" in data:
        pools = [data]
    out = {}
    for p in pools if isinstance(pools, list) else []:
        if profile is not None and isinstance(p, dict) and p.get("profile") != profile:
            continue
        for k, v in p.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
    if isinstance(data, dict):
        for k in ("running", "max_sandboxes"):
            if isinstance(data.get(k), int):
                out[k] = data[k]
    return out


def cgroup_dirs():
    """Parent dirs of sandbox cgroups: the v1 pids controller (v1 and hybrid) or v2."""
    if os.path.isdir(f"{CG}/pids/agentrun"):
        return f"{CG}/pids/agentrun"
    return f"{CG}/agentrun"


def ready(bin_, state_dir, profile=None):
    """Idle pooled sandboxes: from `agentrun ps --json` (state "ready"; with `profile`, of
    that profile); without it, every sandbox cgroup whose state dir is ours (the daemon's
    pool, when nothing runs)."""
    data = run_json(bin_, "ps", "--json")
    if isinstance(data, dict):
        data = data.get("sandboxes", [])
    if isinstance(data, list):
        return [{"id": s.get("id"), "pid": s.get("pid")} for s in data
                if isinstance(s, dict) and s.get("state") == "ready"
                and (profile is None or s.get("profile") == profile)]
    out, parent = [], cgroup_dirs()
    for id_ in sorted(os.listdir(parent)) if os.path.isdir(parent) else []:
        if os.path.isdir(os.path.join(state_dir, "sandboxes", id_)):
            out.append({"id": id_, "pid": None})
    return out


def wait_full(bin_, state_dir, secs, profile=None):
    """Full: the pool's ready count reached its target (when `pool status` says so), else the
    ready count stayed the same, and non-zero, for 2 s."""
    deadline = time.monotonic() + secs
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        st = status(bin_, profile)
        n = len(ready(bin_, state_dir, profile))
        if st.get("target") and st.get("ready", 0) >= st["target"] and n >= st["target"]:
            time.sleep(0.5)  # let the last one settle (page faults of a fresh init)
            return n, "full"
        if n != last:
            last, since = n, time.monotonic()
        elif n and time.monotonic() - since >= 2 and not st.get("target"):
            return n, "stable"
        time.sleep(0.2)
    return last or 0, "timeout"


def procs_of(pid, id_):
    """All processes of a sandbox: its init's cgroup (pids controller, or v2), else the cgroup
    named after its id."""
    paths = []
    if pid:
        try:
            for line in open(f"/proc/{pid}/cgroup"):
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if "pids" in ctrls.split(","):
                    paths.insert(0, f"{CG}/pids{path}")
                elif ctrls == "" and not os.path.isdir(f"{CG}/pids"):
                    paths.append(f"{CG}{path}")
        except OSError:
            pass
    paths.append(os.path.join(cgroup_dirs(), id_ or ""))
    for p in paths:
        try:
            pids = [int(x) for x in open(os.path.join(p, "cgroup.procs")).read().split()]
            if pids:
                return pids, p
        except (OSError, ValueError):
            continue
    return ([pid] if pid else []), None


def mem_of(pid):
    """(RSS, PSS) in bytes from /proc/PID/smaps_rollup."""
    rss = pss = 0
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            k, _, v = line.partition(":")
            if k == "Rss":
                rss = int(v.split()[0]) * 1024
            elif k == "Pss":
                pss = int(v.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return rss, pss


def descendants(root):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def tmpfs_used(daemon_pid, state_dir, id_):
    """Bytes used on tmpfs mounts under the sandbox's state dir, seen from the daemon's mount
    namespace (or ours)."""
    prefix = os.path.join(state_dir, "sandboxes", id_) + "/"
    for ns_pid in (daemon_pid, "self"):
        total, seen = 0, False
        try:
            lines = open(f"/proc/{ns_pid}/mountinfo").read().splitlines()
        except OSError:
            continue
        for line in lines:
            f = line.split()
            mnt, fstype = f[4], f[f.index("-") + 1]
            if fstype == "tmpfs" and (mnt + "/").startswith(prefix):
                root = f"/proc/{ns_pid}/root" if ns_pid != "self" else ""
                try:
                    s = os.statvfs(root + mnt)
                    total += (s.f_blocks - s.f_bfree) * s.f_frsize
                    seen = True
                except OSError:
                    pass
        if seen:
            return total
    return None


def mem_cgroup(path_pids, id_):
    for p in (path_pids and path_pids.replace("/pids/", "/memory/"),
              f"{CG}/memory/agentrun/{id_}", f"{CG}/agentrun/{id_}"):
        for f in ("memory.usage_in_bytes", "memory.current"):
            try:
                return int(open(os.path.join(p, f)).read())
            except (OSError, ValueError, TypeError):
                continue
    return None


def mib(b):
    return f"{b / 2**20:.2f}"


def is_python(pid):
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False


def mem_stats(bin_, state_dir, daemon_pid, profile=None):
    """Memory of the idle pooled sandboxes (of `profile`), summed (`n` of them), and of the
    daemon's other descendants; None when there is no idle pooled sandbox."""
    sbs = ready(bin_, state_dir, profile)
    if not sbs:
        return None
    in_sandboxes = set()
    tot = {"rss": 0, "pss": 0, "tmpfs": 0, "cg": 0, "procs": 0, "py_procs": 0, "py_pss": 0}
    tmpfs_missing = cg_missing = 0
    for sb in sbs:
        pids, cg = procs_of(sb["pid"], sb["id"])
        in_sandboxes.update(pids)
        rss = pss = 0
        for p in pids:
            r, s = mem_of(p)
            rss, pss = rss + r, pss + s
            if is_python(p):
                tot["py_procs"] += 1
                tot["py_pss"] += s
        t = tmpfs_used(daemon_pid, state_dir, sb["id"])
        c = mem_cgroup(cg, sb["id"])
        tmpfs_missing += t is None
        cg_missing += c is None
        tot["rss"] += rss
        tot["pss"] += pss
        tot["tmpfs"] += t or 0
        tot["cg"] += c or 0
        tot["procs"] += len(pids)
    host = [p for p in descendants(daemon_pid) if p not in in_sandboxes]
    hrss = hpss = 0
    for p in host:
        r, s = mem_of(p)
        hrss, hpss = hrss + r, hpss + s
    return {"n": len(sbs), "tot": tot, "tmpfs_missing": tmpfs_missing,
            "cg_missing": cg_missing, "host": len(host), "hrss": hrss, "hpss": hpss}


def mem_row(label, bin_, state_dir, daemon_pid, profile=None):
    m = mem_stats(bin_, state_dir, daemon_pid, profile)
    if m is None:
        print(f"| {label} | unavailable: no idle pooled sandbox found | | | | | | | | |")
        return
    n, tot = m["n"], m["tot"]
    tmpfs = "n/a" if m["tmpfs_missing"] == n else mib(tot["tmpfs"] / n)
    cg = "n/a" if m["cg_missing"] == n else mib(tot["cg"] / n)
    print(f"| {label} | {n} | {tot['procs'] / n:.1f} | {tot['py_procs'] / n:.1f} | "
          f"{mib(tot['rss'] / n)} | {mib(tot['pss'] / n)} | {mib(tot['py_pss'] / n)} | {tmpfs} | "
          f"**{mib((tot['pss'] + tot['tmpfs']) / n)}** | {cg} |")


def mem(bin_, state_dir, daemon_pid, profile=None):
    m = mem_stats(bin_, state_dir, daemon_pid, profile)
    if m is None:
        print("unavailable: no idle pooled sandbox found")
        return
    n, tot, tmpfs_missing, cg_missing = m["n"], m["tot"], m["tmpfs_missing"], m["cg_missing"]
    host, hrss, hpss = m["host"], m["hrss"], m["hpss"]
    print(f"{n} idle pooled sandboxes, {tot['procs']} processes in them "
          f"({tot['procs'] / n:.1f} per sandbox).\n")
    print("| per idle pooled sandbox | MiB |")
    print("|---|---:|")
    print(f"| RSS of its processes | {mib(tot['rss'] / n)} |")
    print(f"| PSS of its processes (shared pages split) | {mib(tot['pss'] / n)} |")
    print(f"| tmpfs (writable layer) used | "
          f"{'n/a' if tmpfs_missing == n else mib(tot['tmpfs'] / n)} |")
    print(f"| **PSS + tmpfs** | **{mib((tot['pss'] + tot['tmpfs']) / n)}** |")
    print(f"| RSS + tmpfs | {mib((tot['rss'] + tot['tmpfs']) / n)} |")
    if cg_missing < n:
        print(f"| memory cgroup usage (kernel's charge: incl. page cache, kernel memory) | "
              f"{mib(tot['cg'] / n)} |")
    print(f"\nHost side, not per sandbox: the daemon and its helpers ({host} processes) "
          f"RSS {mib(hrss)} MiB, PSS {mib(hpss)} MiB.")


def proc_cpu(pid):
    """utime + stime (s) of a process, all its threads."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def cgroup_cpu(id_):
    """CPU (s) used in a shell's cgroup so far (its init, its cells, their commands)."""
    for path, scale in ((f"{CG}/cpuacct/agentrun/{id_}/cpuacct.usage", 1e-9),
                        (f"{CG}/cpu,cpuacct/agentrun/{id_}/cpuacct.usage", 1e-9)):
        try:
            with open(path) as f:
                return int(f.read()) * scale
        except (OSError, ValueError):
            pass
    try:
        with open(f"{CG}/agentrun/{id_}/cpu.stat") as f:
            for line in f:
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) * 1e-6
    except (OSError, ValueError):
        pass
    return None


def children_cpu():
    r = __import__("resource").getrusage(__import__("resource").RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu(bin_, daemon_pid, n, opts):
    """CPU per run, back to back: warm (the daemon and its factories, the shells' cgroups:
    shell inits, cells, the command; and the client), the command run bare, agentrun's own
    (server side less the bare command) and cold (everything: the CLI reaps its shell, which
    reaped the cell)."""
    cmd = [bin_, "exec", *opts, "--", "/bin/true"]
    def in_shell(pid):
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                return "/agentrun/" in f.read()
        except OSError:
            return True
    # The daemon and its factories (shell inits and cells are counted by their cgroups).
    helpers = [p for p in descendants(daemon_pid) if not in_shell(p)]
    before = {s["id"]: s.get("cells", 0) for s in (run_json(bin_, "ps", "--json") or [])}
    shells = list(before)
    d0 = sum(proc_cpu(p) for p in helpers)
    s0 = {i: cgroup_cpu(i) for i in shells}
    c0 = children_cpu()
    env = {k: v for k, v in os.environ.items() if k != "AGENTRUN_NO_DAEMON"}
    for _ in range(n):
        subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
                       check=False)
    client = (children_cpu() - c0) / n
    daemon = (sum(proc_cpu(p) for p in helpers) - d0) / n
    after = {s["id"]: s.get("cells", 0) for s in (run_json(bin_, "ps", "--json") or [])}
    # Per cell of the shells that were there throughout (a shell discarded meanwhile, at
    # --shell-max-runs, and its replacement are left out with the cells they served).
    kept = [i for i in shells if s0[i] is not None and i in after
            and cgroup_cpu(i) is not None]
    used = sum(cgroup_cpu(i) - s0[i] for i in kept)
    cells = sum(after[i] - before[i] for i in kept)
    lost = [i for i in shells if i not in after]
    shell = used / cells if cells else float("nan")
    # The command's own CPU, run bare the same number of times: its exec and run (for
    # /bin/true mostly the dynamic loader, which on this VM pays for trapped CPUID
    # instructions) are the command's, not agentrun's; the server side less this is what
    # agentrun itself spends per run (daemon, factories, shell inits and cells).
    c0 = children_cpu()
    for _ in range(n):
        subprocess.run(["/bin/true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       check=False)
    bare = (children_cpu() - c0) / n
    env["AGENTRUN_NO_DAEMON"] = "1"
    c0 = children_cpu()
    m = max(10, n // 5)
    for _ in range(m):
        subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env,
                       check=False)
    cold = (children_cpu() - c0) / m
    label = " ".join(opts) or "(plain)"
    note = (f" (per cell of the {len(kept)} shells there throughout: {cells} of the {n} runs;"
            f" {len(lost)} discarded meanwhile)") if lost or cells != n else ""
    server = daemon + shell
    print(f"| `{label}` | {daemon * 1e3:.2f} | {shell * 1e3:.2f} | {server * 1e3:.2f} | "
          f"{bare * 1e3:.2f} | **{(server - bare) * 1e3:.2f}** | {client * 1e3:.2f} | "
          f"{cold * 1e3:.2f} |{note}")


def wait_socket(path, pid, secs):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    raise ProcessLookupError
        except (ProcessLookupError, OSError):
            print("agentrun serve exited")
            return 1
        for kind in (socket.SOCK_SEQPACKET, socket.SOCK_STREAM):
            s = socket.socket(socket.AF_UNIX, kind)
            try:
                s.settimeout(1)
                s.connect(path)
                return 0
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.05)
    print(f"socket {path} did not answer within {secs} s")
    return 1


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "wait-socket":
        sys.exit(wait_socket(args[0], int(args[1]), float(args[2])))
    elif cmd == "status":
        print(json.dumps(status(*args[:2])))
    elif cmd == "ready":
        print(json.dumps(ready(*args[:3])))
    elif cmd == "wait-full":
        n, how = wait_full(args[0], args[1], float(args[2]), *args[3:4])
        print(n, how)
    elif cmd == "mem":
        mem(args[0], args[1], int(args[2]), *args[3:4])
    elif cmd == "mem-row":
        mem_row(args[0], args[1], args[2], int(args[3]), *args[4:5])
    elif cmd == "cpu":
        cpu(args[0], int(args[1]), int(args[2]), args[3:])
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
