"""Fork (agentrun's extension `POST /v1/sandboxes/{id}/fork`, `agentrun fork`) with the official
SDK around it: a live sandbox copied into N sandboxes that start with its files. Run as
`sdk_e2e.py fork:SCENARIO` by tests/tests/opensandbox_fork.rs.

- big_context: a code context computes a 100 MB object and keeps it in a file; the sandbox is
  forked into 10; every copy has the file (checksum), is a sandbox of its own (its own shell,
  pid namespace, writable layer), and the copies are independent (a write in one is seen by
  no other copy nor the parent, a write in the parent after the fork by no copy). The
  copies outlive the parent; a copy forked again (its frozen layer over the first) carries
  both, and its deletions of the first layer's files (a whiteout, a directory replaced: an
  opaque one) stay deleted in its copy and in no other. One frozen
  layer per fork under the daemon's `<state>/frozen`, gone once its last sandbox is. The
  context's memory is not carried (a copy's context has no `big`): said by the API
  (`carried == ["files"]`) and checked here, so that the day it is carried this fails.
- bad_input: counts that are not an integer >= 1, unknown fields, a count over the room under
  --max-sandboxes (the daemon runs with a small one), over the host's memory, a layer over
  --max-snapshot, an unknown sandbox, a paused one: 400 / 404 / 409 JSON errors, and nothing
  made (no sandbox, no frozen layer).
- cli: `agentrun fork ID --count 2 --url ...` prints the copies' ids; a bad count is a
  one-line error and a non-zero exit.
- copy_snapshot: a snapshot of a fork copy, and a copy paused to disk, hold the parent's
  files (the copy's frozen layer) as well as the copy's own changes.
"""

import hashlib
import os
import subprocess
import time
from datetime import timedelta

import httpx
from opensandbox import SandboxSync

from sdk_e2e import BASE, check, lifecycle_headers, ps, shell_of, sync_config

BIG_MB = 100


def fork(sid, count, expect=201):
    r = httpx.post(f"{BASE}/sandboxes/{sid}/fork", json={"count": count}, headers=lifecycle_headers(), timeout=600)
    check(r.status_code == expect, f"fork {sid} x{count}: {r.status_code} {r.text}")
    return r.json()


def run(sbx, cmd):
    ex = sbx.commands.run(cmd)
    out = "\n".join(m.text for m in ex.logs.stdout)
    err = "\n".join(m.text for m in ex.logs.stderr)
    return ex.exit_code, out, err


def frozen_layers():
    """The fork layers the daemon keeps (`<state dir>/frozen/<layerId>`)."""
    d = os.path.join(os.environ["AGENTRUN_STATE_DIR"], "frozen")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def sandbox_ids():
    return {e["sandbox"] for e in ps() if e.get("sandbox")}


def big_context():
    from code_interpreter.sync.code_interpreter import CodeInterpreterSync

    cfg = sync_config()
    parent = SandboxSync.create(
        "host", connection_config=cfg, timeout=timedelta(minutes=10), resource={"cpu": "1", "memory": "512Mi"}
    )
    copies = []
    try:
        ci = CodeInterpreterSync.create(sandbox=parent, skip_health_check=True)
        # The state: 100 MB computed once (a pattern no file of the image has).
        r = ci.codes.run(
            "import hashlib\n"
            f"big = bytes((i * 7 + 3) % 251 for i in range(256)) * ({BIG_MB} * 4096)\n"
            "open('/tmp/big.bin', 'wb').write(big)\n"
            "hashlib.sha256(big).hexdigest()"
        )
        check(r.error is None, f"parent's context: {r.error}")
        digest = r.result[0].text.strip("'")
        check(len(digest) == 64, f"digest {r.result}")
        want = hashlib.sha256(bytes((i * 7 + 3) % 251 for i in range(256)) * (BIG_MB * 4096)).hexdigest()
        check(digest == want, "the parent's object is what the test computes")
        code, out, _ = run(parent, "echo parent > /tmp/who; readlink /proc/self/ns/pid")
        check(code == 0, out)
        check(run(parent, "mkdir /tmp/d && echo a > /tmp/d/a && echo b > /tmp/d/b")[0] == 0, "the parent's dir")
        parent_pidns = out.strip()
        parent_shell = shell_of(parent.id)

        t = time.monotonic()
        answer = fork(parent.id, 10)
        took = time.monotonic() - t
        check(answer["sandboxId"] == parent.id, f"{answer}")
        check(answer["carried"] == ["files"], f"what is carried: {answer}")
        ids = [s["id"] for s in answer["sandboxes"]]
        check(len(ids) == 10 and len(set(ids)) == 10 and parent.id not in ids, f"ids {ids}")
        for s in answer["sandboxes"]:
            check(s["status"]["state"] == "Running", f"{s}")
        # One frozen layer, shared by the copies (nothing copied per copy).
        check(frozen_layers() == [answer["layerId"]], f"frozen layers {frozen_layers()} / {answer}")
        copies = [SandboxSync.connect(i, connection_config=cfg) for i in ids]
        # Each copy's state, first print included.
        first = []
        pidns, shells = set(), set()
        for c in copies:
            t0 = time.monotonic()
            code, out, err = run(c, "sha256sum /tmp/big.bin | cut -d' ' -f1; cat /tmp/who; readlink /proc/self/ns/pid")
            first.append(time.monotonic() - t0)
            check(code == 0, f"copy {c.id}: {err}")
            lines = out.split("\n")
            check(lines[0] == digest, f"copy {c.id} has the parent's 100 MB: {lines}")
            check(lines[1] == "parent", f"copy {c.id}: {lines}")
            pidns.add(lines[2])
            shells.add(shell_of(c.id))
        check(len(pidns) == 10 and parent_pidns not in pidns, f"pid namespaces {pidns} / {parent_pidns}")
        check(len(shells) == 10 and parent_shell not in shells, f"shells {shells} / {parent_shell}")
        # Independent: a write in copy 0 is in no other copy nor the parent; the parent's
        # after the fork is in no copy.
        check(run(copies[0], "echo mine > /tmp/only-0 && echo changed > /tmp/who")[0] == 0, "write in copy 0")
        check(run(parent, "echo later > /tmp/after-fork")[0] == 0, "write in the parent")
        for c in copies[1:]:
            code, out, _ = run(c, "cat /tmp/who; ls /tmp")
            check(out.split("\n")[0] == "parent", f"copy {c.id} sees copy 0's write: {out}")
            check("only-0" not in out and "after-fork" not in out, f"copy {c.id}: {out}")
        code, out, _ = run(parent, "cat /tmp/who; ls /tmp")
        check(out.split("\n")[0] == "parent" and "only-0" not in out, f"parent: {out}")
        code, out, _ = run(copies[0], "cat /tmp/who; ls /tmp")
        check(out.split("\n")[0] == "changed" and "after-fork" not in out, f"copy 0: {out}")
        # The context's memory is not carried (see docs/opensandbox-compat.md#fork).
        cc = CodeInterpreterSync.create(sandbox=copies[1], skip_health_check=True)
        r = cc.codes.run("big")
        check(r.error is not None and r.error.name == "NameError", f"a copy's context has the parent's memory?! {r.result} {r.error}")
        # The copies outlive the parent.
        parent.kill()
        code, out, _ = run(copies[2], "sha256sum /tmp/big.bin | cut -d' ' -f1")
        check(code == 0 and out == digest, f"copy 2 after the parent is gone: {out}")
        # A copy forked again: its layer (copy 0's changes, a deletion of the first layer's
        # file among them) over the first.
        # (deletions of the first layer's files in copy 0's upper: a whiteout, an opaque dir)
        code, out, err = run(
            copies[0], "rm /tmp/big.bin && rm -rf /tmp/d && mkdir /tmp/d && echo c > /tmp/d/c && echo two > /tmp/gen2"
        )
        check(code == 0, f"copy 0's changes: {out} {err}")
        again = fork(copies[0].id, 1)
        g = SandboxSync.connect(again["sandboxes"][0]["id"], connection_config=cfg)
        copies.append(g)
        check(sorted(frozen_layers()) == sorted([answer["layerId"], again["layerId"]]), f"frozen layers {frozen_layers()}")
        code, out, err = run(g, "test ! -e /tmp/big.bin && echo gone; cat /tmp/who /tmp/gen2; ls /tmp/d")
        check(out == "gone\nchanged\ntwo\nc", f"the copy of a copy: {out} {err}")
        code, out, _ = run(copies[1], "test -e /tmp/big.bin && echo kept; ls /tmp/d")
        check(out == "kept\na\nb", f"copy 1 keeps the first layer's files: {out}")
        print("FORK_S", f"{took:.3f}", flush=True)
        print("FIRST_PRINT_MAX_S", f"{max(first):.3f}", flush=True)
        print("LAYER", answer["layerId"], flush=True)
    finally:
        for c in copies:
            try:
                c.kill()
            except Exception:
                pass
        try:
            parent.kill()
        except Exception:
            pass
    # Every frozen layer goes with its last sandbox.
    deadline = time.monotonic() + 30
    while frozen_layers() and time.monotonic() < deadline:
        time.sleep(0.05)
    check(frozen_layers() == [], f"frozen layers left after every sandbox was killed: {frozen_layers()}")


def bad_input():
    cfg = sync_config()
    sbx = SandboxSync.create("host", connection_config=cfg, timeout=timedelta(minutes=5))
    try:
        before = sandbox_ids()
        for body in [{"count": 0}, {"count": -2}, {"count": 1.5}, {"count": "3"}, {}, {"count": 1, "memory": True}]:
            r = httpx.post(f"{BASE}/sandboxes/{sbx.id}/fork", json=body, headers=lifecycle_headers(), timeout=60)
            check(r.status_code == 400, f"{body}: {r.status_code} {r.text}")
            check(r.json().get("message"), f"{body}: {r.text}")
        # Over the room under --max-sandboxes (the daemon runs with 4).
        r = httpx.post(f"{BASE}/sandboxes/{sbx.id}/fork", json={"count": 50}, headers=lifecycle_headers(), timeout=60)
        check(r.status_code == 400 and "--max-sandboxes" in r.json()["message"], f"room: {r.status_code} {r.text}")
        # Over the host's memory: copies as large as the parent's limit.
        big = SandboxSync.create(
            "host", connection_config=cfg, timeout=timedelta(minutes=5),
            resource={"cpu": "1", "memory": "4096Gi"},
        )
        try:
            r = httpx.post(f"{BASE}/sandboxes/{big.id}/fork", json={"count": 2}, headers=lifecycle_headers(), timeout=60)
            check(r.status_code == 400 and "memory" in r.json()["message"], f"memory: {r.status_code} {r.text}")
        finally:
            big.kill()
        # A layer over --max-snapshot (the daemon runs with 4m): refused before anything is
        # made or copied.
        check(run(sbx, "head -c 6000000 /dev/zero > /tmp/six-mb")[0] == 0, "6 MB written")
        r = httpx.post(f"{BASE}/sandboxes/{sbx.id}/fork", json={"count": 1}, headers=lifecycle_headers(), timeout=60)
        check(r.status_code == 400 and "--max-snapshot" in r.json()["message"], f"size: {r.status_code} {r.text}")
        check(run(sbx, "rm /tmp/six-mb")[0] == 0, "6 MB removed")
        r = httpx.post(f"{BASE}/sandboxes/nosuch/fork", json={"count": 1}, headers=lifecycle_headers(), timeout=60)
        check(r.status_code == 404, f"unknown: {r.status_code} {r.text}")
        sbx.pause()
        r = httpx.post(f"{BASE}/sandboxes/{sbx.id}/fork", json={"count": 1}, headers=lifecycle_headers(), timeout=60)
        check(r.status_code == 409, f"paused: {r.status_code} {r.text}")
        sbx = SandboxSync.resume(sbx.id, connection_config=cfg)
        check(sandbox_ids() - before <= set(), f"a refused fork made sandboxes: {sandbox_ids() - before}")
        check(frozen_layers() == [], f"a refused fork left frozen layers: {frozen_layers()}")
    finally:
        sbx.kill()


def cli():
    cfg = sync_config()
    sbx = SandboxSync.create("host", connection_config=cfg, timeout=timedelta(minutes=5))
    ids = []
    try:
        check(run(sbx, "echo from-cli-parent > /tmp/cli")[0] == 0, "write")
        agentrun = os.environ["OSB_AGENTRUN"]
        url = f"http://{os.environ['OSB_DOMAIN']}"
        env = dict(os.environ)
        if os.environ.get("OSB_API_KEY"):
            env["OPEN_SANDBOX_API_KEY"] = os.environ["OSB_API_KEY"]
        out = subprocess.run([agentrun, "fork", sbx.id, "--count", "2", "--url", url], capture_output=True, text=True, timeout=300, env=env)
        check(out.returncode == 0, f"agentrun fork: {out.returncode} {out.stderr}")
        ids = out.stdout.split()
        check(len(ids) == 2, f"ids {out.stdout}")
        for i in ids:
            c = SandboxSync.connect(i, connection_config=cfg)
            check(run(c, "cat /tmp/cli")[1] == "from-cli-parent", f"copy {i}")
        out = subprocess.run([agentrun, "fork", sbx.id, "--count", "0", "--url", url], capture_output=True, text=True, timeout=60, env=env)
        check(out.returncode != 0, f"count 0 accepted: {out.stdout}")
        check(len(out.stderr.strip().splitlines()) == 1 and "count" in out.stderr, f"one line: {out.stderr!r}")
    finally:
        for i in ids:
            try:
                SandboxSync.connect(i, connection_config=cfg).kill()
            except Exception:
                pass
        sbx.kill()


def copy_snapshot():
    """A fork copy's files are its frozen layer and its own upper: a snapshot of a copy holds
    both (a sandbox made from it has the parent's files, the copy's, and the copy's deletion
    of a parent's file), and a copy paused to disk comes back with both."""
    from opensandbox.sync.manager import SandboxManagerSync

    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    parent = SandboxSync.create("host", connection_config=cfg, timeout=timedelta(minutes=5))
    made = []
    try:
        check(run(parent, "echo p > /tmp/p && mkdir /tmp/d && echo a > /tmp/d/a && echo b > /tmp/d/b")[0] == 0, "write")
        answer = fork(parent.id, 2)
        c0, c1 = (SandboxSync.connect(s["id"], connection_config=cfg) for s in answer["sandboxes"])
        made += [c0, c1]
        check(run(c0, "echo own > /tmp/own && rm /tmp/d/a")[0] == 0, "copy 0's changes")
        snap = c0.create_snapshot(name="of-a-copy")
        deadline = time.monotonic() + 60
        while mgr.get_snapshot(snap.id).status.state != "Ready":
            check(time.monotonic() < deadline, f"snapshot {snap.id} not ready")
            time.sleep(0.05)
        back = SandboxSync.create(snapshot_id=snap.id, connection_config=cfg)
        made.append(back)
        code, out, err = run(back, "cat /tmp/p /tmp/own; ls /tmp/d")
        check(out == "p\nown\nb", f"a sandbox from a copy's snapshot: {out!r} {err}")
        mgr.delete_snapshot(snap.id)
        # Paused to disk and back: the same files.
        r = httpx.post(f"{BASE}/sandboxes/{c1.id}/pause?toDisk=true", headers=lifecycle_headers(), timeout=60)
        check(r.status_code == 202, f"pause to disk: {r.status_code} {r.text}")
        mgr.resume_sandbox(c1.id)
        code, out, err = run(c1, "cat /tmp/p; ls /tmp/d")
        check(out == "p\na\nb", f"a copy resumed from disk: {out!r} {err}")
    finally:
        for c in made:
            try:
                c.kill()
            except Exception:
                pass
        parent.kill()
        mgr.close()


def leave_copies():
    """A parent and 2 fork copies left running (the test then kills the daemon): prints the
    frozen layer's id."""
    cfg = sync_config()
    parent = SandboxSync.create("host", connection_config=cfg, timeout=timedelta(minutes=5))
    check(run(parent, "echo p > /tmp/p")[0] == 0, "write")
    answer = fork(parent.id, 2)
    check(frozen_layers() == [answer["layerId"]], f"frozen layers {frozen_layers()}")
    print("LAYER", answer["layerId"], flush=True)


SCENARIOS = {
    "big_context": big_context,
    "bad_input": bad_input,
    "cli": cli,
    "copy_snapshot": copy_snapshot,
    "leave_copies": leave_copies,
}
