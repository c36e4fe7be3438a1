"""Fork (agentrun's extension `POST /v1/sandboxes/{id}/fork`, `agentrun fork`) with the official
SDK around it: a live sandbox copied into N sandboxes that start with its files. Run as
`sdk_e2e.py fork:SCENARIO` by tests/tests/opensandbox_fork.rs.

- big_context: a code context computes a 100 MB numpy array (and keeps it in a file too), a
  small dict, a module alias and a function; the sandbox is forked into 10; every copy's
  context (the same id, the copy's default context as the parent's) has the array, the
  dict, the alias and the function (a semantic fork: `carried == ["files", "contexts"]`), a
  write in one copy's context is seen by no other nor the parent; every copy has the file
  (checksum), is a sandbox of its own (its own shell,
  pid namespace, writable layer), and the copies are independent (a write in one is seen by
  no other copy nor the parent, a write in the parent after the fork by no copy). The
  copies outlive the parent; a copy forked again (its frozen layer over the first) carries
  both, and its deletions of the first layer's files (a whiteout, a directory replaced: an
  opaque one) stay deleted in its copy and in no other. One frozen
  layer per fork under the daemon's `<state>/frozen`, gone once its last sandbox is. The
  saved state is in neither the parent nor a copy once the fork is answered.
- contexts: what a context's globals cannot carry (an open file, a generator, a class of the
  context and its instance) is named with its reason, the rest carried (a lambda and a
  closure by value among it); two contexts, each its own state, and a busy one; a fork of
  a sandbox with no context answers as before (`carried == ["files"]`, no `contexts`).
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
import json
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


def kill_all(sandboxes):
    """Kills each of `sandboxes` that is still there (a test's clean-up: one already gone is
    no error)."""
    for c in sandboxes:
        try:
            c.kill()
        except Exception:
            pass


def frozen_layers():
    """The fork layers the daemon keeps (`<state dir>/frozen/<layerId>`)."""
    d = os.path.join(os.environ["AGENTRUN_STATE_DIR"], "frozen")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def sandbox_ids():
    return {e["sandbox"] for e in ps() if e.get("sandbox")}


# What a copy's context prints of the parent's state (the array's checksum computed in it).
STATE = (
    "print(__import__('json').dumps([hl.sha256(big).hexdigest(), big.nbytes, str(big.dtype), small, scaled(2),"
    " hl.__name__, np.__name__, big.flags.writeable]))"
)


def context_state(ci):
    """The parent's state as a context shows it ([STATE])."""
    r = ci.codes.run(STATE)
    check(r.error is None, f"{r.error}")
    return json.loads(r.logs.stdout[0].text)


def state_dirs(sbx):
    """The saved-state directories of a fork in `sbx` (none once a fork is answered)."""
    code, out, _ = run(sbx, "ls -a /tmp | grep agentrun-fork || true")
    check(code == 0, out)
    return out


def big_context():
    from code_interpreter.sync.code_interpreter import CodeInterpreterSync

    cfg = sync_config()
    parent = SandboxSync.create(
        "host", connection_config=cfg, timeout=timedelta(minutes=10), resource={"cpu": "1", "memory": "768Mi"}
    )
    copies = []
    try:
        ci = CodeInterpreterSync.create(sandbox=parent, skip_health_check=True)
        # The state: 100 MB computed once (a pattern no file of the image has), a small dict,
        # a module alias and a function of the context's.
        r = ci.codes.run(
            "import hashlib as hl\n"
            "import numpy as np\n"
            f"big = np.frombuffer(bytes((i * 7 + 3) % 251 for i in range(256)) * ({BIG_MB} * 4096), dtype=np.uint8).copy()\n"
            "big.tofile('/tmp/big.bin')\n"
            "small = {'answer': 42, 'names': ['a', 'b']}\n"
            "def scaled(x, k=3):\n    return x * k + small['answer']\n"
            "hl.sha256(big).hexdigest()"
        )
        check(r.error is None, f"parent's context: {r.error}")
        digest = r.result[0].text.strip("'")
        check(len(digest) == 64, f"digest {r.result}")
        parent_state = context_state(ci)
        want_state = [digest, BIG_MB << 20, "uint8", {"answer": 42, "names": ["a", "b"]}, 48, "hashlib", "numpy", True]
        check(parent_state == want_state, f"the parent's context: {parent_state}")
        parent_ctx = ci.codes.list_contexts("python")
        check(len(parent_ctx) == 1, f"the parent's contexts: {parent_ctx}")
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
        check(answer["carried"] == ["files", "contexts"], f"what is carried: {answer}")
        ctxs = answer.get("contexts", [])
        check(len(ctxs) == 1 and ctxs[0]["id"] == parent_ctx[0].id, f"contexts: {ctxs} / {parent_ctx}")
        check(sorted(ctxs[0]["carried"]) == ["big", "hl", "np", "scaled", "small"], f"carried: {ctxs}")
        check(ctxs[0]["notCarried"] == [] and "error" not in ctxs[0], f"not carried: {ctxs}")
        check(state_dirs(parent) == "", f"the saved state is left in the parent: {state_dirs(parent)}")
        ids = [s["id"] for s in answer["sandboxes"]]
        check(len(ids) == 10 and len(set(ids)) == 10 and parent.id not in ids, f"ids {ids}")
        for s in answer["sandboxes"]:
            check(s["status"]["state"] == "Running", f"{s}")
        # One frozen layer, shared by the copies (nothing copied per copy).
        check(frozen_layers() == [answer["layerId"]], f"frozen layers {frozen_layers()} / {answer}")
        copies = [SandboxSync.connect(i, connection_config=cfg) for i in ids]
        # Each copy's context: the parent's (same id, the default one), its state there, the
        # first execution's time included.
        first_exec = []
        cis = []
        for c in copies:
            cc = CodeInterpreterSync.create(sandbox=c, skip_health_check=True)
            t0 = time.monotonic()
            got = context_state(cc)
            first_exec.append(time.monotonic() - t0)
            check(got == want_state, f"copy {c.id}'s context: {got}")
            listed = [x.id for x in cc.codes.list_contexts("python")]
            check(listed == [parent_ctx[0].id], f"copy {c.id}'s contexts: {listed}")
            check(state_dirs(c) == "", f"the saved state is left in copy {c.id}: {state_dirs(c)}")
            cis.append(cc)
        # A write in copy 0's context is seen by no other copy nor the parent.
        r = cis[0].codes.run("small['answer'] = -1\nbig[:] = 0\nscaled = None")
        check(r.error is None, f"copy 0's write: {r.error}")
        for cc in cis[1:]:
            check(context_state(cc) == want_state, "a copy sees copy 0's write")
        check(context_state(ci) == want_state, "the parent sees copy 0's write")
        r = cis[0].codes.run("print(small['answer'], int(big.sum()), scaled)")
        check(r.logs.stdout[0].text == "-1 0 None", f"copy 0: {r.logs.stdout}")
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
        # ... with copy 0's context as it is now (its array mapped from the first layer and
        # written to, saved again).
        check(again["carried"] == ["files", "contexts"], f"the copy of a copy: {again}")
        r = CodeInterpreterSync.create(sandbox=g, skip_health_check=True).codes.run(
            "print(small['answer'], int(big.sum()), scaled, big.nbytes)"
        )
        check(r.error is None and r.logs.stdout[0].text == f"-1 0 None {BIG_MB << 20}", f"{r.logs.stdout} {r.error}")
        check(sorted(frozen_layers()) == sorted([answer["layerId"], again["layerId"]]), f"frozen layers {frozen_layers()}")
        code, out, err = run(g, "test ! -e /tmp/big.bin && echo gone; cat /tmp/who /tmp/gen2; ls /tmp/d")
        check(out == "gone\nchanged\ntwo\nc", f"the copy of a copy: {out} {err}")
        code, out, _ = run(copies[1], "test -e /tmp/big.bin && echo kept; ls /tmp/d")
        check(out == "kept\na\nb", f"copy 1 keeps the first layer's files: {out}")
        print("FORK_S", f"{took:.3f}", flush=True)
        print("FIRST_PRINT_MAX_S", f"{max(first):.3f}", flush=True)
        print("FIRST_EXEC_MAX_S", f"{max(first_exec):.3f}", flush=True)
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


def contexts():
    import threading

    from code_interpreter.sync.code_interpreter import CodeInterpreterSync

    cfg = sync_config()
    parent = SandboxSync.create("host", connection_config=cfg, timeout=timedelta(minutes=5))
    made = []
    try:
        ci = CodeInterpreterSync.create(sandbox=parent, skip_health_check=True)
        a = ci.codes.create_context("python")
        b = ci.codes.create_context("python")
        r = ci.codes.run(
            "fh = open('/etc/hostname')\n"
            "gen = (i for i in range(3))\n"
            "class C:\n    pass\n"
            "c = C()\n"
            "lam = lambda z: z * 3\n"
            "def outer():\n    k = 5\n    def inner():\n        return k\n    return inner\n"
            "clo = outer()\n"
            "kept = [1, 2, 3]\n"
            "ba = bytearray(b'q' * 300000)\n",
            context=a,
        )
        check(r.error is None, f"context a: {r.error}")
        check(ci.codes.run("mine = 'b'", context=b).error is None, "context b")
        answer = fork(parent.id, 2)
        made += [SandboxSync.connect(x["id"], connection_config=cfg) for x in answer["sandboxes"]]
        check(answer["carried"] == ["files", "contexts"], f"{answer}")
        by = {x["id"]: x for x in answer["contexts"]}
        check(set(by) == {a.id, b.id}, f"contexts {answer['contexts']} / {a.id} {b.id}")
        not_carried = {x["name"]: x["reason"] for x in by[a.id]["notCarried"]}
        check(set(not_carried) == {"fh", "gen", "C", "c"}, f"not carried: {by[a.id]}")
        check("pickle" in not_carried["fh"] and "generator" in not_carried["gen"], f"reasons: {not_carried}")
        check(sorted(by[a.id]["carried"]) == ["ba", "clo", "kept", "lam", "outer"], f"carried: {by[a.id]}")
        check(by[b.id]["carried"] == ["mine"] and by[b.id]["notCarried"] == [], f"b: {by[b.id]}")
        for c in made:
            cc = CodeInterpreterSync.create(sandbox=c, skip_health_check=True)
            r = cc.codes.run(
                "print(lam(2), clo(), outer()(), kept, len(ba), ba[:2], [n in globals() for n in ('fh', 'gen', 'C', 'c', 'mine')])",
                context=cc.codes.get_context(a.id),
            )
            check(r.error is None, f"copy {c.id}'s context a: {r.error}")
            check(r.logs.stdout[0].text == "6 5 5 [1, 2, 3] 300000 bytearray(b'qq') [False, False, False, False, False]",
                  f"copy {c.id}'s context a: {r.logs.stdout}")
            r = cc.codes.run("print(mine, 'kept' in globals())", context=cc.codes.get_context(b.id))
            check(r.error is None and r.logs.stdout[0].text == "b False", f"copy {c.id}'s context b: {r.logs.stdout} {r.error}")
        # A context busy with an execution longer than the fork waits for (10 s): forked
        # without its state, said so; the other one carried.
        busy = threading.Thread(
            target=lambda: ci.codes.run("import time\nopen('/tmp/busy', 'w').close()\ntime.sleep(20)", context=b)
        )
        busy.start()
        deadline = time.monotonic() + 30
        while run(parent, "test -e /tmp/busy && echo yes")[1] != "yes":
            check(time.monotonic() < deadline, "the busy execution did not start")
            time.sleep(0.05)
        answer = fork(parent.id, 1)
        made += [SandboxSync.connect(x["id"], connection_config=cfg) for x in answer["sandboxes"]]
        busy.join(60)
        by = {x["id"]: x for x in answer["contexts"]}
        check(answer["carried"] == ["files", "contexts"] and "lam" in by[a.id]["carried"], f"{answer}")
        check("still running" in by[b.id].get("error", "") and by[b.id]["carried"] == [], f"busy b: {by[b.id]}")
        cc = CodeInterpreterSync.create(sandbox=made[-1], skip_health_check=True)
        r = cc.codes.run("print('mine' in globals())", context=cc.codes.get_context(b.id))
        check(r.error is None and r.logs.stdout[0].text == "False", f"the busy context's copy: {r.logs.stdout} {r.error}")
        # A sandbox with no context: the answer as before.
        plain = SandboxSync.create("host", connection_config=cfg, timeout=timedelta(minutes=5))
        made.append(plain)
        answer = fork(plain.id, 1)
        made += [SandboxSync.connect(x["id"], connection_config=cfg) for x in answer["sandboxes"]]
        check(answer["carried"] == ["files"] and "contexts" not in answer, f"no contexts: {answer}")
    finally:
        kill_all(made)
        parent.kill()


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
        kill_all(made)
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
    "contexts": contexts,
    "bad_input": bad_input,
    "cli": cli,
    "copy_snapshot": copy_snapshot,
    "leave_copies": leave_copies,
}
