#!/usr/bin/python3
"""`hack/bench fork`'s client (hack/bench.d/fork.sh runs it with .venv/test's python):

    fork.py DOMAIN AGENTRUN STATE_DIR DAEMON_PID COPIES MB

1. A sandbox whose code context computes an MB-megabyte numpy array (and keeps it in a file
   too), a small dict and a function is forked into COPIES (`POST /v1/sandboxes/{id}/fork`);
   the times are taken from the POST to the last copy's first print (`echo` through each
   copy's commands API, side by side), to the last copy's first execution in its context
   (each copy's right after its print; it asserts the state carried: the array's size and
   last byte, the dict, the function), and the POST alone.
2. Memory: the COPIES copies, each context having read its whole array (their shells'
   processes' PSS, and their memory cgroups, which count their tmpfs writable layers)
   against COPIES independent sandboxes that each computed the array themselves (a context
   holding it, and the file).
Prints a markdown table. What a fork carries (files, and a context's globals by a semantic
fork, not its memory): docs/opensandbox-compat.md#fork.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import httpx
from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pool  # noqa: E402

DOMAIN, BIN, STATE, DAEMON = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
COPIES, MB = int(sys.argv[5]), int(sys.argv[6])
KEY = os.environ.get("OSB_API_KEY")
# One transport shared by every sandbox's client, as a program making many sandboxes would
# (the SDK's default builds a transport, SSL context included, per sandbox: ~17 ms of the
# client's CPU each, docs/benchmarks.md).
CFG = ConnectionConfigSync(domain=DOMAIN, api_key=KEY, protocol="http",
                           transport=httpx.HTTPTransport())
HEADERS = {"OPEN-SANDBOX-API-KEY": KEY} if KEY else {}
BIG = (
    "import numpy as np\n"
    f"big = np.frombuffer(bytes(range(256)) * ({MB} * 4096), dtype=np.uint8).copy()\n"
    "big.tofile('/tmp/big.bin')\n"
    "small = {'n': 1}\n"
    "def f(x):\n    return x + small['n']\n"
    "len(big)"
)
# What a copy's context prints of the state (cheap: its first execution is timed).
CHECK = "print(big.nbytes, int(big[-1]), small, f(1))"
WANT = f"{MB << 20} 255 {{'n': 1}} 2"


def shells():
    out = subprocess.run([BIN, "ps", "--json"], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, AGENTRUN_STATE_DIR=STATE))
    assert out.returncode == 0, f"agentrun ps: {out.returncode} {out.stderr}"
    return {e["sandbox"]: e for e in json.loads(out.stdout) if e.get("sandbox")}


def memory(ids):
    """(PSS of the shells' processes, memory cgroups), bytes, summed over `ids`."""
    by = shells()
    pss = cg = 0
    for sid in ids:
        e = by[sid]
        pids, path = pool.procs_of(e.get("pid"), e["id"])
        pss += sum(pool.mem_of(p)[1] for p in pids)
        cg += pool.mem_cgroup(path, e["id"]) or 0
    return pss, cg


def first_print(sid):
    s = SandboxSync.connect(sid, connection_config=CFG)
    ex = s.commands.run("echo 1")
    assert [m.text for m in ex.logs.stdout] == ["1"], ex.logs.stdout
    return time.monotonic()


def first_exec(sid):
    """A copy's first execution in its context (the parent's, carried), its state checked;
    then the whole array read (so that the memory measured holds it)."""
    from code_interpreter.sync.code_interpreter import CodeInterpreterSync

    s = SandboxSync.connect(sid, connection_config=CFG)
    ci = CodeInterpreterSync.create(sandbox=s, skip_health_check=True)
    r = ci.codes.run(CHECK)
    t = time.monotonic()
    assert r.error is None and [m.text for m in r.logs.stdout] == [WANT], (r.logs.stdout, r.error)
    r = ci.codes.run("int(big.sum())")
    assert r.error is None, r.error
    return t


def with_context(sbx):
    from code_interpreter.sync.code_interpreter import CodeInterpreterSync

    ci = CodeInterpreterSync.create(sandbox=sbx, skip_health_check=True)
    r = ci.codes.run(BIG)
    assert r.error is None, r.error
    return ci


def main():
    parent = SandboxSync.create("host", connection_config=CFG, timeout=timedelta(minutes=30),
                                resource={"cpu": "1", "memory": f"{max(256, 4 * MB)}Mi"})
    made, independent = [], []
    try:
        with_context(parent)
        t0 = time.monotonic()
        r = httpx.post(f"http://{DOMAIN}/v1/sandboxes/{parent.id}/fork", json={"count": COPIES},
                       headers=HEADERS, timeout=600)
        t_post = time.monotonic()
        assert r.status_code == 201, r.text
        answer = r.json()
        assert answer["carried"] == ["files", "contexts"], answer
        made = [s["id"] for s in answer["sandboxes"]]
        with concurrent.futures.ThreadPoolExecutor(COPIES) as ex:
            # Each copy: its first print, then its first execution in its context.
            both = list(ex.map(lambda sid: (first_print(sid), first_exec(sid)), made))
        prints, execs = [p for p, _ in both], [e for _, e in both]
        fork_ms, post_ms = (max(prints) - t0) * 1000, (t_post - t0) * 1000
        exec_ms = (max(execs) - t0) * 1000
        fork_mem = memory(made)
        for _ in range(COPIES):
            s = SandboxSync.create("host", connection_config=CFG, timeout=timedelta(minutes=30),
                                   resource={"cpu": "1", "memory": f"{max(256, 4 * MB)}Mi"})
            independent.append(s)
            with_context(s)
        ind_mem = memory([s.id for s in independent])
        mib = 1 << 20
        print(f"| fork of a sandbox holding {MB} MB into {COPIES} | ms |")
        print("|---|---|")
        print(f"| POST /fork answered | {post_ms:.0f} |")
        print(f"| POST to every copy's first print | {fork_ms:.0f} |")
        print(f"| POST to every copy's first execution in its context (state checked) | {exec_ms:.0f} |")
        print()
        print(f"| memory of {COPIES} sandboxes | PSS of their processes (MiB) | their memory cgroups (MiB) |")
        print("|---|---|---|")
        print(f"| {COPIES} fork copies (each context's array mapped from the fork's layer, read whole) | {fork_mem[0] / mib:.1f} | {fork_mem[1] / mib:.1f} |")
        print(f"| {COPIES} independent, each computing the object in a context | {ind_mem[0] / mib:.1f} | {ind_mem[1] / mib:.1f} |")
    finally:
        for sid in made:
            try:
                SandboxSync.connect(sid, connection_config=CFG).kill()
            except Exception:
                pass
        for s in independent:
            s.kill()
        parent.kill()


main()
