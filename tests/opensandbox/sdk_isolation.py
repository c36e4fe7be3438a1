"""The run-to-run isolation corpus through the official clients (tests/tests/isolation.rs):
sandbox/container A gets marked secrets and plants them (tests/isolation/scan.py, role
"plant"), is deleted, then B, made on A's shell, scans for them (role "scan").

    python sdk_e2e.py isolation:osb       OpenSandbox SDK: commands, a bash session, a code context
    python sdk_e2e.py isolation:docker    docker-py: a container's main process and `exec`
    python sdk_e2e.py isolation:osb_snapshot   OpenSandbox SDK: B made from a snapshot of P
    python sdk_e2e.py isolation:osb_fork       OpenSandbox SDK: B a fork copy of P (POST .../fork)

ISO_MANIFEST names a JSON file the test wrote: the codes and markers of A and B. Prints
`RESULT <label> <json>` for every plant report and verdict, then `OK <scenario>`; the Rust
side judges them. The scenario itself checks what the harness must guarantee: B ran on A's
shell (OpenSandbox: `agentrun ps` names the shell of each sandbox).
"""

import os
import sys
import time
from datetime import timedelta

from sdk_e2e import check, ps, shell_of, sync_config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "isolation"))
from iso_client import command, manifest, result, wait_back  # noqa: E402


def lines(execution):
    out = "\n".join(m.text for m in execution.logs.stdout)
    err = "\n".join(m.text for m in execution.logs.stderr)
    return out + "\n--- stderr ---\n" + err + "\n--- error ---\n" + repr(execution.error)


def osb():
    from code_interpreter.sync.code_interpreter import CodeInterpreterSync
    from opensandbox import SandboxSync

    m = manifest()
    cfg = sync_config()
    a = SandboxSync.create("host", connection_config=cfg, env=m["a"]["env"], timeout=timedelta(minutes=5))
    try:
        shell = shell_of(a.id)
        path, data = m["a"]["upload"]
        a.files.write_file(path, data)
        result("a.cmd", lines(a.commands.run(command(*m["a"]["cmd"]))))
        s = a.commands.create_session()
        result("a.session", lines(a.commands.run_in_session(s, command(*m["a"]["session"]))))
        ci = CodeInterpreterSync.create(sandbox=a, skip_health_check=True)
        result("a.code", lines(ci.codes.run(m["a"]["code"])))
    finally:
        a.kill()
        a.close()
    wait_back(shell, ps)
    b = SandboxSync.create("host", connection_config=cfg, env=m["b"]["env"], timeout=timedelta(minutes=5))
    try:
        check(shell_of(b.id) == shell, f"sandbox B is not in A's shell {shell}")
        result("b.cmd", lines(b.commands.run(command(*m["b"]["cmd"]))))
        s = b.commands.create_session()
        result("b.session", lines(b.commands.run_in_session(s, command(*m["b"]["session"]))))
        ci = CodeInterpreterSync.create(sandbox=b, skip_health_check=True)
        result("b.code", lines(ci.codes.run(m["b"]["code"])))
        check(shell_of(b.id) == shell, f"sandbox B left A's shell {shell}")
    finally:
        b.kill()
        b.close()
    print("SHELL", shell, flush=True)


def docker_logs(c, key, secs=120):
    """The container's output once it printed `key` (its main process then lingers)."""
    deadline = time.monotonic() + secs
    while True:
        text = c.logs().decode(errors="replace")
        if key in text:
            return text
        c.reload()
        check(c.status == "running", f"container {c.id} ended before it printed {key}: {c.status}\n{text[-4000:]}")
        check(time.monotonic() < deadline, f"container {c.id} printed no {key} within {secs} s\n{text[-4000:]}")
        time.sleep(0.1)


def idle_shells(profile, want=None, secs=30):
    """The shells of `profile`'s pool once all are idle (ready, serving no sandbox) and,
    given `want`, exactly those."""
    deadline = time.monotonic() + secs
    while True:
        entries = [e for e in ps() if e["profile"] == profile]
        idle = sorted(e["id"] for e in entries if e["state"] == "ready" and not e.get("sandbox"))
        if idle and len(idle) == len(entries) and (want is None or idle == want):
            return idle
        check(time.monotonic() < deadline, f"the {profile} shells are not idle {want}: {entries}")
        time.sleep(0.05)


def shell_serving(profile):
    """The shell of `profile` serving a sandbox now."""
    busy = [e["id"] for e in ps() if e["profile"] == profile and e.get("sandbox")]
    check(len(busy) == 1, f"one busy {profile} shell: {ps()}")
    return busy[0]


def docker():
    import docker as dockerpy

    m = manifest()
    client = dockerpy.from_env(timeout=300)
    shells = idle_shells("container")
    for side, key in (("a", "ISO-PLANTED "), ("b", "ISO-VERDICT ")):
        s = m[side]
        c = client.containers.run(m["image"], s["main"], environment=s["env"], detach=True)
        try:
            result(f"{side}.main", docker_logs(c, key))
            check([shell_serving("container")] == shells, f"container {side} is not on shell {shells}: {ps()}")
            code, out = c.exec_run(s["exec"]["argv"], environment=s["exec"]["env"])
            text = out.decode(errors="replace")
            check(code == 0, f"{side} exec exited {code}:\n{text[-4000:]}")
            result(f"{side}.exec", text)
        finally:
            c.remove(force=True)
        # Its shell back in the pool, where the next container takes it.
        idle_shells("container", shells)
    print("SHELLS", " ".join(shells), flush=True)


def osb_snapshot():
    """Sandbox A plants and is deleted; sandbox P, on A's shell, writes the carried marker (a
    file a snapshot keeps by design) and is snapshotted and deleted; B, made from P's
    snapshot, scans (commands and a bash session) and finds P's file and nothing of A."""
    from opensandbox import SandboxSync
    from opensandbox.sync.manager import SandboxManagerSync

    m = manifest()
    cfg = sync_config()
    a = SandboxSync.create("host", connection_config=cfg, env=m["a"]["env"], timeout=timedelta(minutes=5))
    try:
        shell = shell_of(a.id)
        path, data = m["a"]["upload"]
        a.files.write_file(path, data)
        result("a.cmd", lines(a.commands.run(command(*m["a"]["cmd"]))))
        s = a.commands.create_session()
        result("a.session", lines(a.commands.run_in_session(s, command(*m["a"]["session"]))))
    finally:
        a.kill()
        a.close()
    wait_back(shell, ps)
    mgr = SandboxManagerSync.create(cfg)
    p = SandboxSync.create("host", connection_config=cfg, timeout=timedelta(minutes=5))
    try:
        check(shell_of(p.id) == shell, f"sandbox P is not in A's shell {shell}")
        carried = m["carried"]
        ex = p.commands.run(f"echo {carried} > /workspace/carried.txt && echo {carried} > /tmp/carried.txt")
        check(ex.exit_code == 0, f"P's write: {lines(ex)}")
        snap = p.create_snapshot(name="isolation")
        deadline = time.monotonic() + 60
        while (info := mgr.get_snapshot(snap.id)).status.state != "Ready":
            check(info.status.state == "Creating" and time.monotonic() < deadline, f"{info.status}")
            time.sleep(0.05)
    finally:
        p.kill()
        p.close()
    b = SandboxSync.create(snapshot_id=snap.id, connection_config=cfg, env=m["b"]["env"], timeout=timedelta(minutes=5))
    try:
        ex = b.commands.run("cat /workspace/carried.txt /tmp/carried.txt")
        got = [x.text for x in ex.logs.stdout]
        check(got == [m["carried"], m["carried"]], f"B has P's files: {got}")
        result("b.cmd", lines(b.commands.run(command(*m["b"]["cmd"]))))
        s = b.commands.create_session()
        result("b.session", lines(b.commands.run_in_session(s, command(*m["b"]["session"]))))
    finally:
        b.kill()
        b.close()
        mgr.delete_snapshot(snap.id)
        mgr.close()
    print("SHELL", shell, flush=True)


def osb_fork():
    """Sandbox A plants (commands, a bash session, a code context) and is deleted; sandbox P,
    on A's shell, writes the carried marker in files and in a global of its code context and
    is forked (agentrun's `POST /v1/sandboxes/{id}/fork`, count 1); B, the copy, scans
    (commands, a bash session, and its copy of P's context) while P still runs, and finds P's
    file and global and nothing of A."""
    import httpx
    from code_interpreter.sync.code_interpreter import CodeInterpreterSync
    from opensandbox import SandboxSync

    from sdk_e2e import BASE, lifecycle_headers

    m = manifest()
    cfg = sync_config()
    a = SandboxSync.create("host", connection_config=cfg, env=m["a"]["env"], timeout=timedelta(minutes=5))
    try:
        shell = shell_of(a.id)
        path, data = m["a"]["upload"]
        a.files.write_file(path, data)
        result("a.cmd", lines(a.commands.run(command(*m["a"]["cmd"]))))
        s = a.commands.create_session()
        result("a.session", lines(a.commands.run_in_session(s, command(*m["a"]["session"]))))
        ci = CodeInterpreterSync.create(sandbox=a, skip_health_check=True)
        result("a.code", lines(ci.codes.run(m["a"]["code"])))
    finally:
        a.kill()
        a.close()
    wait_back(shell, ps)
    # P carries B's environment (a copy starts with its parent's).
    p = SandboxSync.create("host", connection_config=cfg, env=m["b"]["env"], timeout=timedelta(minutes=5))
    b = None
    answer = {}
    try:
        check(shell_of(p.id) == shell, f"sandbox P is not in A's shell {shell}")
        carried = m["carried"]
        ex = p.commands.run(f"echo {carried} > /workspace/carried.txt && echo {carried} > /tmp/carried.txt")
        check(ex.exit_code == 0, f"P's write: {lines(ex)}")
        pci = CodeInterpreterSync.create(sandbox=p, skip_health_check=True)
        ex = pci.codes.run(f"carried_global = {carried!r}")
        check(ex.error is None, f"P's context: {lines(ex)}")
        r = httpx.post(f"{BASE}/sandboxes/{p.id}/fork", json={"count": 1}, headers=lifecycle_headers(), timeout=300)
        check(r.status_code == 201, f"fork: {r.status_code} {r.text}")
        answer = r.json()
        check(answer["carried"] == ["files", "contexts"], f"fork: {answer}")
        check(answer["contexts"][0]["carried"] == ["carried_global"], f"fork: {answer}")
        b = SandboxSync.connect(answer["sandboxes"][0]["id"], connection_config=cfg)
        check(shell_of(b.id) != shell, "the copy runs in P's shell")
        ex = b.commands.run("cat /workspace/carried.txt /tmp/carried.txt")
        got = [x.text for x in ex.logs.stdout]
        check(got == [m["carried"], m["carried"]], f"B has P's files: {got}")
        result("b.cmd", lines(b.commands.run(command(*m["b"]["cmd"]))))
        s = b.commands.create_session()
        result("b.session", lines(b.commands.run_in_session(s, command(*m["b"]["session"]))))
        # B's copy of P's context (its default one): P's global, and nothing else of P's
        # (the scan's code runs there).
        bci = CodeInterpreterSync.create(sandbox=b, skip_health_check=True)
        ex = bci.codes.run("print(carried_global, sorted(k for k in globals() if not k.startswith('__')))")
        got = [x.text for x in ex.logs.stdout]
        check(got == [f"{carried} ['carried_global']"], f"B's context: {lines(ex)}")
        result("b.code", lines(bci.codes.run(m["b"]["code"])))
    finally:
        if b is not None:
            b.kill()
            b.close()
        p.kill()
        p.close()
    print("SHELL", shell, flush=True)


SCENARIOS = {"osb": osb, "docker": docker, "osb_snapshot": osb_snapshot, "osb_fork": osb_fork}
