"""OpenSandbox snapshots with the official SDK (sync and async): a sandbox's files kept as a
snapshot and sandboxes made from it (`snapshotId`), listed, filtered, paged, deleted; the
files-only pause to disk (snapshot, delete, create from it); `agentrun snapshot`; and the
failures (gone sandbox, deleted snapshot, another key's snapshot, the size limit, a pause
during a snapshot, a full disk). Run as `sdk_e2e.py snapshots:SCENARIO` by
tests/tests/opensandbox_snapshots.rs.

Environment (besides sdk_e2e's): OSB_SNAPSHOT_ID (for the scenarios that look at a snapshot
another daemon made), OSB_STORE (the daemon's image store root).
"""

import asyncio
import hashlib
import json
import os
import subprocess
import time

import httpx
from opensandbox import Sandbox, SandboxSync
from opensandbox.manager import SandboxManager
from opensandbox.models.sandboxes import SnapshotFilter
from opensandbox.sync.manager import SandboxManagerSync

from sdk_e2e import (
    BASE,
    async_config,
    check,
    expect_api_error,
    lifecycle_headers,
    sync_config,
)

# What a sandbox writes before its snapshot (where the default profile lets it write).
FILES = {
    "/workspace/notes.txt": "kept by the snapshot\n",
    "/tmp/deep/dir/data.bin": "x" * 70000,
    "/var/tmp/other": "in /var/tmp too\n",
}


def agentrun(*args):
    out = subprocess.run([os.environ["OSB_AGENTRUN"], *args], capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout, out.stderr


def run(sbx, cmd):
    ex = sbx.commands.run(cmd)
    out = "\n".join(m.text for m in ex.logs.stdout)
    err = "\n".join(m.text for m in ex.logs.stderr)
    return ex.exit_code, out, err


async def arun(sbx, cmd):
    ex = await sbx.commands.run(cmd)
    out = "\n".join(m.text for m in ex.logs.stdout)
    return ex.exit_code, out


def write_files(sbx):
    for path, content in FILES.items():
        d = os.path.dirname(path)
        code, _, err = run(sbx, f"mkdir -p {d} && printf %s '{content}' > {path}")
        check(code == 0, f"write {path}: {err}")


def check_files(sbx, what):
    for path, content in FILES.items():
        code, out, err = run(sbx, f"md5sum {path}")
        want = hashlib.md5(content.encode()).hexdigest()
        check(code == 0 and out.split()[:1] == [want], f"{what}: {path}: {code} {out!r} {err}")


def wait_ready(get, sid, secs=60):
    deadline = time.monotonic() + secs
    while True:
        info = get(sid)
        if info.status.state == "Ready":
            return info
        check(info.status.state == "Creating", f"snapshot {sid}: {info.status}")
        check(time.monotonic() < deadline, f"snapshot {sid} not ready in {secs}s: {info.status}")
        time.sleep(0.05)


def raw_get(sid):
    return httpx.get(f"{BASE}/snapshots/{sid}", headers=lifecycle_headers(), timeout=30)


def sync_flow():
    """Sandbox.create_snapshot, then the manager's get/list/delete_snapshot and a create with
    snapshot_id: the new sandbox has the files (written, removed) and copies are
    independent; after the delete it is a 404 and no create from it works."""
    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    src = SandboxSync.create("host", connection_config=cfg, metadata={"role": "source"})
    write_files(src)
    snap = src.create_snapshot(name="before-import")
    check(snap.status.state == "Creating", f"create answers Creating: {snap.status}")
    check(snap.sandbox_id == src.id and snap.name == "before-import", f"{snap}")
    info = wait_ready(mgr.get_snapshot, snap.id)
    check(info.id == snap.id and info.name == "before-import", f"{info}")
    # The source keeps running, unchanged.
    check(run(src, "echo alive")[1] == "alive", "the source runs after the snapshot")
    check_files(src, "source")
    # Listed, filtered by sandbox and state, paged.
    second = mgr.create_snapshot(src.id)
    wait_ready(mgr.get_snapshot, second.id)
    page = mgr.list_snapshots(SnapshotFilter(sandbox_id=src.id))
    ids = [s.id for s in page.snapshot_infos]
    check(set(ids) == {snap.id, second.id}, f"list by sandbox: {ids}")
    check(page.pagination.total_items == 2, f"{page.pagination}")
    one = mgr.list_snapshots(SnapshotFilter(sandbox_id=src.id, page_size=1, page=2))
    check(len(one.snapshot_infos) == 1 and one.pagination.total_pages == 2, f"paged: {one}")
    check(one.pagination.has_next_page is False, f"{one.pagination}")
    ready = mgr.list_snapshots(SnapshotFilter(states=["Ready"], sandbox_id=src.id))
    check(len(ready.snapshot_infos) == 2, f"state filter: {ready}")
    none = mgr.list_snapshots(SnapshotFilter(states=["Failed"], sandbox_id=src.id))
    check(len(none.snapshot_infos) == 0, f"state filter Failed: {none}")
    named = mgr.list_snapshots(SnapshotFilter(name="before-import"))
    check([s.id for s in named.snapshot_infos] == [snap.id], f"name filter: {named}")
    # A sandbox from it has the files; a write in it is its own.
    a = SandboxSync.create(snapshot_id=snap.id, connection_config=cfg)
    check(a.id != src.id, "a new sandbox")
    check_files(a, "restored")
    got = a.get_info()
    check(got.snapshot_id == snap.id if hasattr(got, "snapshot_id") else True, f"{got}")
    raw = httpx.get(f"{BASE}/sandboxes/{a.id}", headers=lifecycle_headers(), timeout=30).json()
    check(raw.get("snapshotId") == snap.id and "image" not in raw, f"GET sandbox: {raw}")
    check(raw["entrypoint"][-3:] == ["tail", "-f", "/dev/null"], f"entrypoint: {raw}")
    check(run(a, "echo changed > /workspace/notes.txt")[0] == 0, "write in the copy")
    b = SandboxSync.create(snapshot_id=snap.id, connection_config=cfg)
    check_files(b, "second restore")
    check(run(src, "cat /workspace/notes.txt")[1] == "kept by the snapshot", "source unchanged")
    # A snapshot of a restored sandbox: what it removed from the snapshot below stays
    # removed (whiteouts), a directory made again holds only its new files (opaque).
    code, _, err = run(b, "rm /var/tmp/other && rm -r /tmp/deep && mkdir -p /tmp/deep && echo new > /tmp/deep/only")
    check(code == 0, f"changes in the copy: {err}")
    layered = b.create_snapshot(name="layered")
    wait_ready(mgr.get_snapshot, layered.id)
    c = SandboxSync.create(snapshot_id=layered.id, connection_config=cfg)
    code, out, _ = run(c, "cat /workspace/notes.txt; ls /tmp/deep; test -e /var/tmp/other || echo removed")
    check(out.split("\n") == ["kept by the snapshot", "only", "removed"], f"snapshot of a snapshot: {out!r}")
    # The CLI sees it, as the image store does.
    code, out, err = agentrun("snapshot", "ls", "--json")
    check(code == 0 and snap.id in [s["id"] for s in json.loads(out)], f"snapshot ls: {code} {out} {err}")
    code, out, err = agentrun("image", "ls")
    check(code == 0 and any(l.split()[:2] == ["agentrun.local/snapshot", snap.id] for l in out.splitlines()), f"image ls: {out} {err}")
    # Deleted: 404, no create from it; the sandboxes made from it keep running.
    mgr.delete_snapshot(snap.id)
    expect_api_error(lambda: mgr.get_snapshot(snap.id), 404)
    expect_api_error(lambda: mgr.delete_snapshot(snap.id), 404)
    r = httpx.post(
        f"{BASE}/sandboxes",
        json={"snapshotId": snap.id, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 600},
        headers=lifecycle_headers(),
        timeout=60,
    )
    check(r.status_code == 404 and r.json()["code"] == "SNAPSHOT::NOT_FOUND", f"create from a deleted snapshot: {r.status_code} {r.text}")
    check(run(a, "cat /workspace/notes.txt")[1] == "changed", "a copy outlives its snapshot")
    code, out, _ = agentrun("snapshot", "ls", "--json")
    check(snap.id not in [s["id"] for s in json.loads(out)], f"deleted snapshot listed: {out}")
    mgr.delete_snapshot(second.id)
    mgr.delete_snapshot(layered.id)
    for s in (src, a, b, c):
        s.kill()
    mgr.close()


async def async_flow_inner():
    cfg = async_config()
    mgr = await SandboxManager.create(cfg)
    src = await Sandbox.create("host", connection_config=cfg)
    code, _ = await arun(src, "mkdir -p /var/tmp/app && echo async-state > /var/tmp/app/state && echo gone > /var/tmp/tmpfile && rm /var/tmp/tmpfile")
    check(code == 0, "write")
    snap = await src.create_snapshot()
    check(snap.status.state == "Creating" and snap.name is None, f"{snap}")
    deadline = time.monotonic() + 60
    while (info := await mgr.get_snapshot(snap.id)).status.state != "Ready":
        check(info.status.state == "Creating" and time.monotonic() < deadline, f"{info.status}")
        await asyncio.sleep(0.05)
    listed = await mgr.list_snapshots(SnapshotFilter(sandbox_id=src.id))
    check([s.id for s in listed.snapshot_infos] == [snap.id], f"{listed}")
    copy = await Sandbox.create(snapshot_id=snap.id, connection_config=cfg)
    code, out = await arun(copy, "cat /var/tmp/app/state; ls /var/tmp")
    check(code == 0 and out.split("\n") == ["async-state", "app"], f"restored: {out!r}")
    await mgr.delete_snapshot(snap.id)
    try:
        await mgr.get_snapshot(snap.id)
        raise AssertionError("a deleted snapshot is still there")
    except Exception as e:  # noqa: BLE001 (the SDK's exception, checked by its status)
        check(getattr(e, "status_code", None) == 404, f"{e!r}")
    for s in (src, copy):
        await s.kill()
        await s.close()
    await mgr.close()


def async_flow():
    asyncio.run(async_flow_inner())


def pause_to_disk():
    """The files-only pause to disk: an idle sandbox is snapshotted and deleted (its memory
    and shell given back), and later comes back from its snapshot with its files. Prints
    how long each step took."""
    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    src = SandboxSync.create("host", connection_config=cfg)
    write_files(src)
    src.pause()
    t0 = time.monotonic()
    snap = src.create_snapshot(name="paused")
    wait_ready(mgr.get_snapshot, snap.id)
    t1 = time.monotonic()
    raw = httpx.get(f"{BASE}/sandboxes/{src.id}", headers=lifecycle_headers(), timeout=30).json()
    check(raw["status"]["state"] == "Paused", f"still paused after its snapshot: {raw['status']}")
    src.kill()
    t2 = time.monotonic()
    back = SandboxSync.create(snapshot_id=snap.id, connection_config=cfg)
    check_files(back, "resumed")
    t3 = time.monotonic()
    print(f"SNAPSHOT_MS {int((t1 - t0) * 1000)}")
    print(f"RESUME_MS {int((t3 - t2) * 1000)}")
    back.kill()
    mgr.delete_snapshot(snap.id)
    mgr.close()


def pause_to_disk_same_id():
    """`pause?toDisk=true` (agentrun's option of pause): the sandbox's files go to a snapshot,
    its processes and shell away; `resume` (the SDK's) brings it back with the same id,
    endpoints (the SDK object in hand keeps working) and metadata, and its files. A delete
    while on disk removes its snapshot."""
    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    sbx = SandboxSync.create("host", connection_config=cfg, metadata={"kept": "yes"})
    write_files(sbx)
    before = sbx.get_endpoint(44772)
    from sdk_e2e import ps
    check(any(e.get("sandbox") == sbx.id for e in ps()), "a shell serves it")
    t0 = time.monotonic()
    r = httpx.post(f"{BASE}/sandboxes/{sbx.id}/pause?toDisk=true", headers=lifecycle_headers(), timeout=60)
    check(r.status_code == 202, f"pause to disk: {r.status_code} {r.text}")
    t1 = time.monotonic()
    raw = httpx.get(f"{BASE}/sandboxes/{sbx.id}", headers=lifecycle_headers(), timeout=30).json()
    check(raw["status"]["state"] == "Paused", f"{raw['status']}")
    deadline = time.monotonic() + 30
    while any(e.get("sandbox") == sbx.id for e in ps()):
        check(time.monotonic() < deadline, f"its shell is still there: {ps()}")
        time.sleep(0.05)
    on_disk = mgr.list_snapshots(SnapshotFilter(sandbox_id=sbx.id)).snapshot_infos
    check(len(on_disk) == 1 and on_disk[0].name == f"paused:{sbx.id}", f"{on_disk}")
    r = httpx.post(f"{BASE}/sandboxes/{sbx.id}/pause?toDisk=true", headers=lifecycle_headers(), timeout=60)
    check(r.status_code == 409, f"paused twice: {r.status_code}")
    t2 = time.monotonic()
    mgr.resume_sandbox(sbx.id)
    check_files(sbx, "resumed from disk")
    t3 = time.monotonic()
    after = sbx.get_endpoint(44772)
    check(after.endpoint == before.endpoint and after.headers == before.headers, f"endpoints: {before} {after}")
    raw = httpx.get(f"{BASE}/sandboxes/{sbx.id}", headers=lifecycle_headers(), timeout=30).json()
    check(raw["status"]["state"] == "Running" and raw["metadata"] == {"kept": "yes"} and raw["id"] == sbx.id, f"{raw}")
    check(mgr.list_snapshots(SnapshotFilter(sandbox_id=sbx.id)).snapshot_infos == [], "its snapshot went")
    print(f"PAUSE_TO_DISK_MS {int((t1 - t0) * 1000)}")
    print(f"RESUME_FROM_DISK_MS {int((t3 - t2) * 1000)}")
    # On disk, then deleted: its snapshot goes with it.
    r = httpx.post(f"{BASE}/sandboxes/{sbx.id}/pause?toDisk=true", headers=lifecycle_headers(), timeout=60)
    check(r.status_code == 202, f"{r.status_code} {r.text}")
    sbx.kill()
    check(mgr.list_snapshots(SnapshotFilter(sandbox_id=sbx.id)).snapshot_infos == [], "deleted with the sandbox")
    r = httpx.post(f"{BASE}/sandboxes/no-such/pause?toDisk=maybe", headers=lifecycle_headers(), timeout=30)
    check(r.status_code == 400, f"{r.status_code} {r.text}")
    mgr.close()


def cli():
    """`agentrun snapshot create|ls|inspect|rm` on a sandbox of the daemon, and a sandbox
    made from the CLI's snapshot through the API (a CLI snapshot has no owner: any key)."""
    cfg = sync_config()
    src = SandboxSync.create("host", connection_config=cfg)
    write_files(src)
    code, out, err = agentrun("snapshot", "create", src.id, "--name", "from-cli")
    check(code == 0, f"snapshot create: {code} {out} {err}")
    sid = out.strip()
    code, out, err = agentrun("snapshot", "inspect", sid)
    v = json.loads(out)[0]
    check(code == 0 and v["sandbox_id"] == src.id and v["name"] == "from-cli" and v["size"] > 70000, f"inspect: {out} {err}")
    code, out, err = agentrun("snapshot", "ls")
    check(code == 0 and sid in out and "from-cli" in out, f"ls: {out} {err}")
    back = SandboxSync.create(snapshot_id=sid, connection_config=cfg)
    check_files(back, "from the CLI's snapshot")
    code, out, err = agentrun("snapshot", "create", "no-such-sandbox")
    check(code != 0 and "no sandbox no-such-sandbox" in err and len(err.strip().splitlines()) == 1, f"unknown sandbox: {code} {err}")
    code, out, err = agentrun("snapshot", "rm", sid)
    check(code == 0, f"rm: {err}")
    code, out, err = agentrun("snapshot", "rm", sid)
    check(code != 0 and err.strip() == f"agentrun: no snapshot {sid} (see `agentrun snapshot ls`)", f"rm twice: {code} {err}")
    code, out, err = agentrun("snapshot", "inspect", sid)
    check(code != 0 and f"no snapshot {sid}" in err, f"inspect after rm: {out} {err}")
    for s in (src, back):
        s.kill()


def bad_input():
    """Refusals: unknown and deleted sandboxes (404), a bad body (400), a create naming both
    image and snapshotId or an unknown snapshot (400/404)."""
    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    expect_api_error(lambda: mgr.create_snapshot("no-such-sandbox"), 404)
    sbx = SandboxSync.create("host", connection_config=cfg)
    h = {**lifecycle_headers(), "content-type": "application/json"}
    for body, what in ((b'{"name": 5}', "name"), (b'{"nme": "x"}', "unknown field"), (b"[1]", "object")):
        r = httpx.post(f"{BASE}/sandboxes/{sbx.id}/snapshots", content=body, headers=h, timeout=30)
        check(r.status_code == 400 and what in r.json()["message"], f"{body}: {r.status_code} {r.text}")
    for body, status in (
        ({"snapshotId": "snap-none", "entrypoint": ["true"]}, 404),
        ({"snapshotId": "../../etc", "entrypoint": ["true"]}, 404),
        ({"snapshotId": "", "entrypoint": ["true"]}, 400),
        ({"snapshotId": "snap-x", "image": {"uri": "host"}, "entrypoint": ["true"]}, 400),
    ):
        r = httpx.post(f"{BASE}/sandboxes", json={**body, "timeout": 600}, headers=lifecycle_headers(), timeout=60)
        check(r.status_code == status and set(r.json()) == {"code", "message"}, f"{body}: {r.status_code} {r.text}")
    expect_api_error(lambda: mgr.get_snapshot("snap-none"), 404)
    sbx.kill()
    # Gone: deleted before the request.
    expect_api_error(lambda: mgr.create_snapshot(sbx.id), 404)
    mgr.close()


def size_limit():
    """A snapshot over `serve --max-snapshot 1M` is a 400 that says the size; nothing is
    stored and the sandbox runs on."""
    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    sbx = SandboxSync.create("host", connection_config=cfg)
    check(run(sbx, "head -c 3000000 /dev/zero > /workspace/big")[0] == 0, "write 3 MB")
    e = expect_api_error(lambda: sbx.create_snapshot(), 400)
    msg = str(e)
    check("3000" in msg and "1048576" in msg, f"the 400 says the size and the limit: {msg}")
    check(run(sbx, "echo alive")[1] == "alive", "the sandbox runs on")
    listed = mgr.list_snapshots(SnapshotFilter(sandbox_id=sbx.id))
    check(listed.snapshot_infos == [], f"nothing listed: {listed}")
    # Under the limit again: it works.
    check(run(sbx, "rm /workspace/big")[0] == 0, "rm")
    ok = sbx.create_snapshot()
    wait_ready(mgr.get_snapshot, ok.id)
    mgr.delete_snapshot(ok.id)
    sbx.kill()
    mgr.close()


def pause_during_snapshot():
    """A pause asked while a snapshot is under way waits for it: the snapshot is Ready, the
    sandbox ends Paused (the snapshot's thaw does not undo the pause) and resumes."""
    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    sbx = SandboxSync.create("host", connection_config=cfg)
    check(run(sbx, "head -c 50000000 /dev/urandom > /workspace/big && echo done > /workspace/small")[0] == 0, "write")
    snap = sbx.create_snapshot()
    sbx.pause()
    wait_ready(mgr.get_snapshot, snap.id)
    raw = httpx.get(f"{BASE}/sandboxes/{sbx.id}", headers=lifecycle_headers(), timeout=30).json()
    check(raw["status"]["state"] == "Paused", f"{raw['status']}")
    cg = None
    from sdk_e2e import shell_of
    shell = shell_of(sbx.id)
    for p in (f"/sys/fs/cgroup/agentrun/{shell}/cgroup.freeze", f"/sys/fs/cgroup/freezer/agentrun/{shell}/freezer.state"):
        if os.path.exists(p):
            cg = open(p).read().strip()
    check(cg in ("1", "FROZEN"), f"the sandbox's cgroup is frozen: {cg}")
    mgr.resume_sandbox(sbx.id)
    check(run(sbx, "cat /workspace/small")[1] == "done", "resumed")
    copy = SandboxSync.create(snapshot_id=snap.id, connection_config=cfg)
    check(run(copy, "wc -c < /workspace/big")[1].strip() == "50000000", "the snapshot has the file whole")
    mgr.delete_snapshot(snap.id)
    for s in (sbx, copy):
        s.kill()
    mgr.close()


def disk_full():
    """The store is a small tmpfs: a snapshot that does not fit fails (Failed, with why),
    leaves nothing in the store, and the sandbox runs on with its files."""
    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    store = os.environ["OSB_STORE"]
    before = sorted(os.listdir(os.path.join(store, "blobs/sha256")))
    sbx = SandboxSync.create("host", connection_config=cfg)
    check(run(sbx, "head -c 40000000 /dev/urandom > /workspace/big && echo ok")[1] == "ok", "write 40 MB")
    snap = sbx.create_snapshot()
    deadline = time.monotonic() + 60
    while (info := mgr.get_snapshot(snap.id)).status.state == "Creating":
        check(time.monotonic() < deadline, "still Creating")
        time.sleep(0.05)
    check(info.status.state == "Failed" and "No space left" in (info.status.message or ""), f"{info.status}")
    check(run(sbx, "wc -c < /workspace/big")[1].strip() == "40000000", "the sandbox keeps its files")
    check(run(sbx, "echo alive")[1] == "alive", "and runs on")
    check(os.listdir(os.path.join(store, "tmp")) == [], f"temp files left: {os.listdir(os.path.join(store, 'tmp'))}")
    check(sorted(os.listdir(os.path.join(store, "blobs/sha256"))) == before, "no blob added")
    code, out, _ = agentrun("snapshot", "ls", "--json")
    check(json.loads(out) == [], f"listed: {out}")
    listed = mgr.list_snapshots(SnapshotFilter(states=["Failed"]))
    check([s.id for s in listed.snapshot_infos] == [snap.id], f"the failure is listed: {listed}")
    mgr.delete_snapshot(snap.id)
    expect_api_error(lambda: mgr.get_snapshot(snap.id), 404)
    sbx.kill()
    mgr.close()


def make_for_another_key():
    """Makes a snapshot with this daemon's key and prints its id (OWNED_SNAPSHOT)."""
    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    sbx = SandboxSync.create("host", connection_config=cfg)
    write_files(sbx)
    snap = sbx.create_snapshot(name="owned")
    wait_ready(mgr.get_snapshot, snap.id)
    sbx.kill()
    mgr.close()
    print(f"OWNED_SNAPSHOT {snap.id}")


def other_key_sees_nothing():
    """Another API key: the snapshot is a 404 to get, delete or create from, and not listed."""
    sid = os.environ["OSB_SNAPSHOT_ID"]
    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    expect_api_error(lambda: mgr.get_snapshot(sid), 404)
    expect_api_error(lambda: mgr.delete_snapshot(sid), 404)
    check(mgr.list_snapshots(SnapshotFilter()).snapshot_infos == [], "listed for another key")
    r = httpx.post(f"{BASE}/sandboxes", json={"snapshotId": sid, "entrypoint": ["true"], "timeout": 600}, headers=lifecycle_headers(), timeout=60)
    check(r.status_code == 404, f"create from another key's snapshot: {r.status_code} {r.text}")
    mgr.close()


def owner_sees_it():
    """The key that made it (after a restart of the daemon): restore, then delete."""
    sid = os.environ["OSB_SNAPSHOT_ID"]
    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    check(mgr.get_snapshot(sid).status.state == "Ready", "ready after a restart")
    sbx = SandboxSync.create(snapshot_id=sid, connection_config=cfg)
    check_files(sbx, "after a restart")
    sbx.kill()
    mgr.delete_snapshot(sid)
    mgr.close()


def start_big_snapshot():
    """Starts a snapshot of a sandbox with 200 MB written and prints its id at once (the test
    kills the daemon while it is taken)."""
    cfg = sync_config()
    sbx = SandboxSync.create("host", connection_config=cfg)
    check(run(sbx, "head -c 200000000 /dev/zero > /workspace/big && echo ok")[1] == "ok", "write 200 MB")
    snap = sbx.create_snapshot()
    print(f"STARTED_SNAPSHOT {snap.id}", flush=True)


def nothing_listed():
    """After a restart: no snapshot listed or found (OSB_SNAPSHOT_ID)."""
    sid = os.environ["OSB_SNAPSHOT_ID"]
    mgr = SandboxManagerSync.create(sync_config())
    check(mgr.list_snapshots(SnapshotFilter()).snapshot_infos == [], "a snapshot is listed")
    expect_api_error(lambda: mgr.get_snapshot(sid), 404)
    mgr.close()


def observed():
    """A snapshot and a restore whose spans and audit records the test checks: prints
    SOURCE, SNAPSHOT_ID, RESTORED; then a refused snapshot (unknown sandbox is no record)."""
    cfg = sync_config()
    mgr = SandboxManagerSync.create(cfg)
    src = SandboxSync.create("host", connection_config=cfg)
    write_files(src)
    snap = src.create_snapshot(name="observed")
    wait_ready(mgr.get_snapshot, snap.id)
    copy = SandboxSync.create(snapshot_id=snap.id, connection_config=cfg)
    check_files(copy, "restored")
    print(f"SOURCE {src.id}")
    print(f"SNAPSHOT_ID {snap.id}")
    print(f"RESTORED {copy.id}")
    mgr.delete_snapshot(snap.id)
    for s in (src, copy):
        s.kill()
    mgr.close()


SCENARIOS = {
    "observed": observed,
    "sync_flow": sync_flow,
    "async_flow": async_flow,
    "pause_to_disk": pause_to_disk,
    "pause_to_disk_same_id": pause_to_disk_same_id,
    "cli": cli,
    "bad_input": bad_input,
    "size_limit": size_limit,
    "pause_during_snapshot": pause_during_snapshot,
    "disk_full": disk_full,
    "make_for_another_key": make_for_another_key,
    "other_key_sees_nothing": other_key_sees_nothing,
    "owner_sees_it": owner_sees_it,
    "start_big_snapshot": start_big_snapshot,
    "nothing_listed": nothing_listed,
}
