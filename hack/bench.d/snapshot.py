"""`hack/bench snapshot`'s client (hack/bench.d/snapshot.sh): the official OpenSandbox SDK
against `agentrun serve --listen`. Per round: a sandbox writes SIZE_MB MB, is snapshotted
(POST to Ready), a sandbox is made from the snapshot (create -> first command result: the
files-only resume), then a plain create of the same image for comparison; the source's
memory (its shell's cgroup) before and after the files-only pause to disk (snapshot +
delete). Prints a markdown table.

    python snapshot.py HOST:PORT ROUNDS SIZE_MB
"""

import os
import statistics
import subprocess
import sys
import time

from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync
from opensandbox.sync.manager import SandboxManagerSync

domain, rounds, size_mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = ConnectionConfigSync(domain=domain, api_key=os.environ.get("OSB_API_KEY"), protocol="http")
mgr = SandboxManagerSync.create(cfg)
agentrun = os.environ["AGENTRUN"]


def ms(t):
    return (time.monotonic() - t) * 1000


def first_result(sbx, cmd="true"):
    ex = sbx.commands.run(cmd)
    assert ex.exit_code == 0, ex


def cgroup_memory(sid):
    import json
    ps = json.loads(subprocess.run([agentrun, "ps", "--json"], capture_output=True, text=True, check=True).stdout)
    shell = next(e["id"] for e in ps if e.get("sandbox") == sid)
    for p in (f"/sys/fs/cgroup/memory/agentrun/{shell}/memory.usage_in_bytes", f"/sys/fs/cgroup/agentrun/{shell}/memory.current"):
        if os.path.exists(p):
            return int(open(p).read()), shell
    return None, shell


def shell_gone(shell, secs=10):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if not any(os.path.exists(p) for p in (f"/sys/fs/cgroup/memory/agentrun/{shell}", f"/sys/fs/cgroup/agentrun/{shell}")):
            return True
        time.sleep(0.01)
    return False


snap_ms, restore_ms, plain_ms, frozen = [], [], [], []
mem_before, mem_after = [], []
for i in range(rounds):
    src = SandboxSync.create("host", connection_config=cfg)
    first_result(src, f"head -c {size_mb * 1000000} /dev/urandom > /workspace/data && sync")
    t = time.monotonic()
    snap = src.create_snapshot()
    while mgr.get_snapshot(snap.id).status.state == "Creating":
        time.sleep(0.002)
    assert mgr.get_snapshot(snap.id).status.state == "Ready"
    snap_ms.append(ms(t))
    before, shell = cgroup_memory(src.id)
    src.kill()
    gone = shell_gone(shell)
    if before is not None:
        mem_before.append(before)
        mem_after.append(0 if gone else before)
    t = time.monotonic()
    back = SandboxSync.create(snapshot_id=snap.id, connection_config=cfg)
    first_result(back, f"test $(wc -c < /workspace/data) = {size_mb * 1000000}")
    restore_ms.append(ms(t))
    back.kill()
    t = time.monotonic()
    plain = SandboxSync.create("host", connection_config=cfg)
    first_result(plain)
    plain_ms.append(ms(t))
    plain.kill()
    mgr.delete_snapshot(snap.id)


def p50(v):
    return f"{statistics.median(v):.0f}" if v else "-"


print(f"| step ({rounds} rounds, {size_mb} MB written) | p50 ms | min ms | max ms |")
print("|---|---|---|---|")
for name, v in (
    (f"snapshot of a sandbox with {size_mb} MB written (POST -> Ready)", snap_ms),
    ("create from the snapshot -> first command (files-only resume; a shell made for the snapshot's image)", restore_ms),
    ("plain create of `host` -> first command (pooled shell)", plain_ms),
):
    print(f"| {name} | {p50(v)} | {min(v):.0f} | {max(v):.0f} |")
if mem_before:
    print()
    print(f"Pause to disk (snapshot + delete): the sandbox's cgroup memory {statistics.median(mem_before) / 2**20:.1f} MiB before, "
          f"{statistics.median(mem_after) / 2**20:.1f} MiB after (its shell gone: {all(a == 0 for a in mem_after)}).")
mgr.close()
