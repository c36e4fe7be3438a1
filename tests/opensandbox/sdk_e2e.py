"""End-to-end scenarios of the official OpenSandbox Python SDK (opensandbox==1.1.1) against
`agentrun serve --listen`. Run by tests/tests/opensandbox.rs, one scenario per process:

    python sdk_e2e.py SCENARIO
    python sdk_e2e.py AREA:SCENARIO     (a scenario of sdk_AREA.py, beside this file)

Environment: OSB_DOMAIN (host:port of agentrun's API), OSB_API_KEY (optional), OSB_AGENTRUN
(the agentrun binary, with AGENTRUN_STATE_DIR naming the daemon's state: `agentrun ps --json`
maps a sandbox's id to the shell it runs in, whose cgroup holds its processes), and for the
escape scenario OSB_HOST_SECRET (a host file the sandbox must never reach) and OSB_HOST_PROBE
(a host path that must never be created). Prints "OK SCENARIO" at the end; any failed check
raises (non-zero exit, traceback).
"""

import asyncio
import io
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import httpx
from opensandbox import Sandbox, SandboxSync
from opensandbox.config import ConnectionConfig, ConnectionConfigSync
from opensandbox.exceptions import SandboxApiException, SandboxException
from opensandbox.manager import SandboxManager
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.filesystem import (
    ContentReplaceEntry,
    DirectoryListEntry,
    MoveEntry,
    SearchEntry,
    SetPermissionEntry,
    WriteEntry,
)
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule, SandboxFilter
from opensandbox.sync.manager import SandboxManagerSync

DOMAIN = os.environ["OSB_DOMAIN"]
API_KEY = os.environ.get("OSB_API_KEY") or None
BASE = f"http://{DOMAIN}/v1"


def sync_config(api_key=API_KEY):
    return ConnectionConfigSync(domain=DOMAIN, api_key=api_key, protocol="http")


def async_config(api_key=API_KEY):
    return ConnectionConfig(domain=DOMAIN, api_key=api_key, protocol="http")


def lifecycle_headers():
    return {"OPEN-SANDBOX-API-KEY": API_KEY} if API_KEY else {}


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def ps():
    """`agentrun ps --json`: one entry a shell (`id`), with the long-lived sandbox it serves
    (`sandbox`), if any."""
    agentrun = os.environ.get("OSB_AGENTRUN")
    check(agentrun, "OSB_AGENTRUN is not set")
    out = subprocess.run([agentrun, "ps", "--json"], capture_output=True, text=True, timeout=30)
    check(out.returncode == 0, f"agentrun ps --json: {out.returncode} {out.stderr}")
    return json.loads(out.stdout)


def shell_of(sid):
    """The shell a sandbox runs in (the name of its cgroup): a sandbox's id is its own."""
    entries = ps()
    for e in entries:
        if e.get("sandbox") == sid:
            return e["id"]
    raise AssertionError(f"no shell serves sandbox {sid}: {entries}")


def cgroup_procs(shell):
    """The processes in a shell's cgroup; None once the cgroup is gone."""
    for p in ("/sys/fs/cgroup/pids/agentrun", "/sys/fs/cgroup/agentrun"):
        f = f"{p}/{shell}/cgroup.procs"
        if os.path.exists(f):
            try:
                return [int(x) for x in open(f).read().split()]
            except FileNotFoundError:
                return None
    return None


def is_spare_cell(pid, init):
    """Whether `pid` is a shell's spare cell: a child of the shell's init in a pid namespace
    of its own, with no process of its own (a cell made ahead of the next run, nothing of an
    earlier one)."""
    try:
        status = open(f"/proc/{pid}/status").read()
        ppid = int(next(l.split()[1] for l in status.splitlines() if l.startswith("PPid:")))
        own_ns = os.readlink(f"/proc/{pid}/ns/pid") != os.readlink(f"/proc/{init}/ns/pid")
        children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except (OSError, StopIteration, ValueError):
        return False
    return ppid == init and own_ns and not children


def wait_shell_released(shell, secs=10):
    """Waits until the shell of a sandbox that ended is either gone (discarded, its cgroup
    removed) or back in its pool with nothing of the sandbox left: listed as ready, serving
    no sandbox, its cgroup holding its init and at most its spare cell. Returns "gone" or
    "reused"."""
    deadline = time.monotonic() + secs
    while True:
        procs = cgroup_procs(shell)
        if procs is None:
            return "gone"
        entry = next((e for e in ps() if e["id"] == shell), None)
        idle = entry and entry["state"] == "ready" and entry.get("sandbox") is None
        others = [p for p in procs if entry and p != entry["pid"]]
        if idle and entry["pid"] in procs and len(others) <= 1 and all(
            is_spare_cell(p, entry["pid"]) for p in others
        ):
            return "reused"
        check(time.monotonic() < deadline, f"shell {shell} neither gone nor idle: {entry} procs {procs}")
        time.sleep(0.05)


def cgroup_file(sid, v1, v2):
    shell = shell_of(sid)
    for p in (f"/sys/fs/cgroup/memory/agentrun/{shell}/{v1}", f"/sys/fs/cgroup/agentrun/{shell}/{v2}"):
        if os.path.exists(p):
            return open(p).read().strip()
    raise AssertionError(f"no memory cgroup file for {sid} (shell {shell})")


def expect_api_error(fn, status, code=None):
    try:
        fn()
    except SandboxApiException as e:
        check(e.status_code == status, f"status {e.status_code} != {status}: {e}")
        if code is not None:
            got = e.error.code if e.error else None
            check(got == code, f"error code {got!r} != {code!r}: {e}")
        return e
    raise AssertionError(f"expected an API error {status}")


def sync_flow():
    cfg = sync_config()
    sbx = SandboxSync.create(
        "host",
        connection_config=cfg,
        timeout=timedelta(minutes=10),
        resource={"cpu": "500m", "memory": "512Mi"},
        env={"GREETING": "hello"},
        metadata={"project": "demo"},
        network_policy=NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target="pypi.org")]),
    )
    try:
        # The policy is stored (and served by the egress endpoint); the sandbox has no network.
        pol = sbx.get_egress_policy()
        check(pol.default_action == "deny" and [r.target for r in pol.egress] == ["pypi.org"], f"policy {pol}")
        check(sbx.commands.run("exec 3<>/dev/tcp/1.1.1.1/80").exit_code != 0, "network reachable")
        # Commands: output lines, exit codes, env from create, per-command env and cwd.
        ex = sbx.commands.run("echo $GREETING; echo oops 1>&2; exit 3")
        check([m.text for m in ex.logs.stdout] == ["hello"], f"stdout {ex.logs.stdout}")
        check([m.text for m in ex.logs.stderr] == ["oops"], f"stderr {ex.logs.stderr}")
        check(ex.exit_code == 3, f"exit code {ex.exit_code}")
        ex = sbx.commands.run("echo done")
        check(ex.text == "done" and ex.exit_code == 0, f"echo done: {ex.text!r} {ex.exit_code}")
        ex = sbx.commands.run(
            "pwd; echo $EXTRA",
            opts=RunCommandOpts(working_directory="/tmp", envs={"EXTRA": "x1"}),
        )
        check([m.text for m in ex.logs.stdout] == ["/tmp", "x1"], f"cwd/env {ex.logs.stdout}")
        ex = sbx.commands.run("printf 'a\\n\\nb'")
        check([m.text for m in ex.logs.stdout] == ["a", "\n", "b"], f"lines {ex.logs.stdout}")
        ex = sbx.commands.run(["/bin/sh", "-c", "echo argv-mode"])
        check(ex.text == "argv-mode", f"argv {ex.text!r}")
        ex = sbx.commands.run("no-such-command-xyz")
        check(ex.exit_code == 127, f"not found: {ex.exit_code}")

        # Resource limits became cgroup limits.
        check(cgroup_file(sbx.id, "memory.limit_in_bytes", "memory.max") == str(512 << 20), "memory limit")
        m = sbx.get_metrics()
        check(m.cpu_count == 0.5, f"cpu_count {m.cpu_count}")
        check(m.memory_total_in_mib == 512.0, f"mem total {m.memory_total_in_mib}")

        # Files.
        fs = sbx.files
        fs.write_file("/tmp/hello.txt", "hi from sdk\n")
        check(fs.read_file("/tmp/hello.txt") == "hi from sdk\n", "read back")
        ex = sbx.commands.run("cat /tmp/hello.txt; stat -c '%u %g' /tmp/hello.txt")
        check([m.text for m in ex.logs.stdout] == ["hi from sdk", "0 0"], f"seen inside: {ex.logs.stdout}")
        fs.write_files(
            [
                WriteEntry(path="/work/a/one.py", data="print(1)\n", mode=644),
                WriteEntry(path="/work/a/two.txt", data=b"\x00\x01binary", mode=600),
                WriteEntry(path="/work/b/three.py", data="print(3)\n"),
            ]
        )
        check(fs.read_bytes("/work/a/two.txt") == b"\x00\x01binary", "binary round trip")
        info = fs.get_file_info(["/work/a/one.py"])["/work/a/one.py"]
        check(info.size == 9 and info.mode == 644 and info.owner == "root", f"info {info}")
        names = sorted(e.path for e in fs.list_directory(DirectoryListEntry(path="/work/a")))
        check(names == ["/work/a/one.py", "/work/a/two.txt"], f"list {names}")
        found = sorted(e.path for e in fs.search(SearchEntry(path="/work", pattern="**/*.py")))
        check(found == ["/work/a/one.py", "/work/b/three.py"], f"search {found}")
        fs.move_files([MoveEntry(src="/work/a/one.py", dest="/work/c/moved.py")])
        check(fs.read_file("/work/c/moved.py") == "print(1)\n", "moved")
        fs.replace_contents([ContentReplaceEntry(path="/work/c/moved.py", old_content="1", new_content="42")])
        check(fs.read_file("/work/c/moved.py") == "print(42)\n", "replaced")
        fs.set_permissions([SetPermissionEntry(path="/work/c/moved.py", mode=700)])
        check(sbx.commands.run("stat -c %a /work/c/moved.py").text == "700", "chmod seen inside")
        fs.delete_files(["/work/c/moved.py"])
        check(sbx.commands.run("test -e /work/c/moved.py").exit_code == 1, "deleted")
        fs.create_directories([WriteEntry(path="/work/d/e/f", mode=755)])
        check(sbx.commands.run("test -d /work/d/e/f").exit_code == 0, "mkdir -p")
        fs.delete_directories(["/work/d"])
        check(sbx.commands.run("test -e /work/d").exit_code == 1, "rm -rf")
        try:
            fs.read_file("/no/such/file")
            raise AssertionError("reading a missing file must fail")
        except SandboxException:
            pass
        # Files written inside are visible through the API.
        sbx.commands.run("seq 1 5 > /tmp/seq.txt")
        check(fs.read_file("/tmp/seq.txt") == "1\n2\n3\n4\n5\n", "file from a command")

        # Background command, logs with cursor, status.
        ex = sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.2; done", opts=RunCommandOpts(background=True))
        cid = ex.id
        check(cid and ex.exit_code is None, f"background: {ex.id} {ex.exit_code}")
        deadline = time.time() + 20
        while sbx.commands.get_command_status(cid).running:
            check(time.time() < deadline, "background command never finished")
            time.sleep(0.1)
        st = sbx.commands.get_command_status(cid)
        check(st.exit_code == 0, f"status {st}")
        logs = sbx.commands.get_background_command_logs(cid)
        check(logs.content.split() == ["line1", "line2", "line3"], f"logs {logs.content!r}")
        check(logs.cursor == 3, f"cursor {logs.cursor}")
        logs = sbx.commands.get_background_command_logs(cid, cursor=2)
        check(logs.content.split() == ["line3"], f"logs after cursor {logs.content!r}")

        # Interrupt kills the whole process group.
        ex = sbx.commands.run("sleep 1000 & echo $! > /tmp/child; wait", opts=RunCommandOpts(background=True))
        time.sleep(0.5)
        check(sbx.commands.get_command_status(ex.id).running, "still running before interrupt")
        sbx.commands.interrupt(ex.id)
        deadline = time.time() + 10
        while sbx.commands.get_command_status(ex.id).running:
            check(time.time() < deadline, "interrupted command still running")
            time.sleep(0.05)
        st = sbx.commands.get_command_status(ex.id)
        check(st.exit_code == 137, f"interrupted exit {st.exit_code}")
        check(sbx.commands.run("kill -0 $(cat /tmp/child)").exit_code != 0, "the child of the interrupted command survived")

        # Timeout.
        t = time.time()
        ex = sbx.commands.run("sleep 30", opts=RunCommandOpts(timeout=timedelta(seconds=1)))
        check(ex.exit_code == 137 and time.time() - t < 10, f"timeout: {ex.exit_code} after {time.time() - t:.1f}s")

        # Session: cwd and env persist.
        s = sbx.commands.create_session()
        ex = sbx.commands.run_in_session(s, "cd /tmp && export FOO=bar")
        check(ex.exit_code == 0, f"session 1: {ex.exit_code} {ex.error}")
        ex = sbx.commands.run_in_session(s, "pwd; echo $FOO; echo err >&2")
        check([m.text for m in ex.logs.stdout] == ["/tmp", "bar"], f"session state {ex.logs.stdout}")
        check([m.text for m in ex.logs.stderr] == ["err"], f"session stderr {ex.logs.stderr}")
        ex = sbx.commands.run_in_session(s, "false || exit_code_test=7; (exit 7)")
        check(ex.exit_code == 7, f"session exit {ex.exit_code}")
        ex = sbx.commands.run_in_session(s, "echo still $FOO")
        check(ex.text == "still bar", f"session after error {ex.text!r}")
        sbx.commands.delete_session(s)

        # Renew.
        r = sbx.renew(timedelta(minutes=30))
        exp = sbx.get_info().expires_at
        left = (exp - datetime.now(timezone.utc)).total_seconds()
        check(1700 < left <= 1800, f"renewed expiry in {left}s")

        # Pause freezes every process; resume thaws.
        sbx.commands.run("while true; do echo t >> /tmp/ticks; sleep 0.05; done", opts=RunCommandOpts(background=True))
        sid = sbx.id
        wait_for(lambda: ticks(sid) > 0, 10, "the ticker never ticked")
        sbx.pause()
        check(sbx.get_info().status.state == "Paused", "paused state")
        n1 = int(subprocess_count(sid))
        time.sleep(1.0)
        n2 = int(subprocess_count(sid))
        check(n2 == n1, f"ticks grew while paused: {n1} -> {n2}")
        sbx2 = SandboxSync.resume(sid, connection_config=cfg)
        check(sbx2.get_info().status.state == "Running", "running after resume")
        wait_for(lambda: int(sbx2.commands.run("wc -l < /tmp/ticks").text) > n2, 10,
                 f"ticks did not grow after resume (from {n2})")
        sbx2.close()
    finally:
        sbx.kill()
        sbx.close()
    expect_api_error(lambda: SandboxManagerSync.create(connection_config=sync_config()).get_sandbox_info(sbx.id), 404)


def wait_for(cond, secs, what):
    """Polls `cond` until it holds; fails with `what` after `secs`."""
    deadline = time.monotonic() + secs
    while not cond():
        check(time.monotonic() < deadline, what)
        time.sleep(0.05)


def ticks(sid):
    """Lines in the sandbox's /tmp/ticks so far (0 before it exists)."""
    try:
        return subprocess_count(sid)
    except FileNotFoundError:
        return 0


def subprocess_count(sid):
    # Counted from the host side: the API refuses file access while the sandbox is paused.
    root = f"/proc/{init_pid(sid)}/root/tmp/ticks"
    return sum(1 for _ in open(root))


def init_pid(sid):
    procs = cgroup_procs(shell_of(sid))
    check(procs, f"no cgroup for {sid}")
    # The sandbox's processes see the root of its cell, whose PID 1 is the child of the
    # shell's init (the process whose parent is outside the sandbox).
    parent = {pid: int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]) for pid in procs}
    shell = [pid for pid, ppid in parent.items() if ppid not in procs]
    check(len(shell) == 1, f"no shell init among {procs}")
    for pid, ppid in parent.items():
        if ppid == shell[0]:
            return pid
    raise AssertionError("no cell")


async def async_flow():
    cfg = async_config()
    sbx = await Sandbox.create("host", connection_config=cfg, env={"A": "async"}, metadata={"flow": "async"})
    try:
        ex = await sbx.commands.run("echo $A; echo e >&2; exit 5")
        check([m.text for m in ex.logs.stdout] == ["async"] and [m.text for m in ex.logs.stderr] == ["e"], "async output")
        check(ex.exit_code == 5, f"async exit {ex.exit_code}")
        await sbx.files.write_file("/tmp/x.txt", "async file")
        check(await sbx.files.read_file("/tmp/x.txt") == "async file", "async read")
        names = [e.path for e in await sbx.files.list_directory(DirectoryListEntry(path="/tmp"))]
        check("/tmp/x.txt" in names, f"async list {names}")
        found = [e.path for e in await sbx.files.search(SearchEntry(path="/tmp", pattern="*.txt"))]
        check(found == ["/tmp/x.txt"], f"async search {found}")
        await sbx.files.move_files([MoveEntry(src="/tmp/x.txt", dest="/tmp/y.txt")])
        await sbx.files.delete_files(["/tmp/y.txt"])
        check((await sbx.commands.run("ls /tmp")).text == "", "async delete")
        ex = await sbx.commands.run("echo bg; sleep 100", opts=RunCommandOpts(background=True))
        deadline = time.monotonic() + 10
        while True:
            logs = await sbx.commands.get_background_command_logs(ex.id)
            if logs.content.strip() or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        check(logs.content.strip() == "bg", f"async logs {logs.content!r}")
        await sbx.commands.interrupt(ex.id)
        for _ in range(100):
            if not (await sbx.commands.get_command_status(ex.id)).running:
                break
            await asyncio.sleep(0.05)
        check((await sbx.commands.get_command_status(ex.id)).exit_code == 137, "async interrupt")
        s = await sbx.commands.create_session(working_directory="/tmp")
        await sbx.commands.run_in_session(s, "X=1; cd /")
        ex = await sbx.commands.run_in_session(s, "echo $X $(pwd)")
        check(ex.text == "1 /", f"async session {ex.text!r}")
        await sbx.renew(timedelta(minutes=5))
        await sbx.pause()
        check((await sbx.get_info()).status.state == "Paused", "async paused")
        sbx2 = await Sandbox.resume(sbx.id, connection_config=cfg)
        check((await sbx2.commands.run("echo back")).text == "back", "async resumed")
        await sbx2.close()
    finally:
        await sbx.kill()
        await sbx.close()


def list_filters():
    cfg = sync_config()
    mgr = SandboxManagerSync.create(connection_config=cfg)
    made = []
    try:
        for i in range(5):
            made.append(SandboxSync.create("host", connection_config=cfg, metadata={"team": "a" if i < 3 else "b", "n": str(i)}))
        res = mgr.list_sandbox_infos(SandboxFilter(metadata={"team": "a"}))
        check(sorted(s.metadata["n"] for s in res.sandbox_infos) == ["0", "1", "2"], f"team=a {res}")
        res = mgr.list_sandbox_infos(SandboxFilter(metadata={"team": "b", "n": "4"}))
        check([s.id for s in res.sandbox_infos] == [made[4].id], f"two keys {res}")
        seen = []
        for page in (1, 2, 3):
            res = mgr.list_sandbox_infos(SandboxFilter(page=page, page_size=2))
            check(res.pagination.total_items == 5 and res.pagination.total_pages == 3, f"pagination {res.pagination}")
            check(res.pagination.has_next_page == (page < 3), f"has_next {res.pagination}")
            seen += [s.id for s in res.sandbox_infos]
        check(sorted(seen) == sorted(s.id for s in made), "pages cover everything once")
        made[1].pause()
        res = mgr.list_sandbox_infos(SandboxFilter(states=["Paused"]))
        check([s.id for s in res.sandbox_infos] == [made[1].id], f"state=Paused {res}")
        res = mgr.list_sandbox_infos(SandboxFilter(states=["Running"], metadata={"team": "a"}))
        check(sorted(s.id for s in res.sandbox_infos) == sorted([made[0].id, made[2].id]), "state+metadata")
        info = made[3].patch_metadata({"team": "c", "n": None, "extra": "y"})
        check(info.metadata == {"team": "c", "extra": "y"}, f"patched {info.metadata}")
        res = mgr.list_sandbox_infos(SandboxFilter(metadata={"team": "c"}))
        check([s.id for s in res.sandbox_infos] == [made[3].id], "filter on patched metadata")
    finally:
        for s in made:
            s.kill()
            s.close()
    res = mgr.list_sandbox_infos(SandboxFilter())
    check(res.pagination.total_items == 0, f"left over: {res}")


def bad_requests():
    h = lifecycle_headers()
    base = {"image": {"uri": "host"}, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 600, "resourceLimits": {"cpu": "1", "memory": "2Gi"}}
    cases = [
        ({"secureAccess": True}, "secureAccess"),
        ({"volumes": [{"name": "v", "mountPath": "/data", "host": {"path": "/etc"}}]}, "--volume-root"),
        ({"resourceLimits": {"cpu": "lots"}}, "resourceLimits.cpu"),
        ({"resourceLimits": {"memory": "12parsecs"}}, "resourceLimits.memory"),
        ({"resourceLimits": {"gpu": "1"}}, "gpu"),
        ({"image": {"uri": "no-such-image:1"}}, "no such image"),
        ({"metadata": {"opensandbox.io/x": "1"}}, "reserved"),
        ({"entrypoint": []}, "entrypoint"),
        ({"platform": {"os": "windows", "arch": "amd64"}}, "platform"),
        ({"lifecycle": {"preStart": {"command": ["true"]}}}, "lifecycle"),
        ({"snapshotId": "s1"}, "snapshot"),
    ]
    for patch, word in cases:
        body = dict(base)
        body.update(patch)
        r = httpx.post(f"{BASE}/sandboxes", json=body, headers=h)
        check(r.status_code == 400, f"{patch}: status {r.status_code} {r.text}")
        j = r.json()
        check(set(j) >= {"code", "message"} and word.lower() in j["message"].lower(), f"{patch}: {j}")
    r = httpx.post(f"{BASE}/sandboxes", content=b"{not json", headers=dict(h, **{"Content-Type": "application/json"}))
    check(r.status_code == 400 and "code" in r.json(), f"bad json: {r.status_code} {r.text}")
    # JSON only as application/json: what a web page can post cross-site without a preflight
    # (text/plain, a form) is a 415, and nothing is created.
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        hh = dict(h, **({"Content-Type": ctype} if ctype else {}))
        # (httpx sends no Content-Type with raw content: the None case has none)
        r = httpx.post(f"{BASE}/sandboxes", content=json.dumps(base).encode(), headers=hh)
        check(r.status_code == 415 and r.json()["code"] == "UNSUPPORTED_MEDIA_TYPE", f"{ctype}: {r.status_code} {r.text}")
    r = httpx.get(f"{BASE}/sandboxes/nope", headers=h)
    check(r.status_code == 404 and r.json()["code"] == "SANDBOX::NOT_FOUND", f"404: {r.text}")
    r = httpx.post(f"{BASE}/sandboxes", json=dict(base, entrypoint=["/no/such/binary"]), headers=h)
    check(r.status_code == 400 and "entrypoint" in r.json()["message"], f"bad entrypoint: {r.text}")
    check(httpx.get(f"{BASE}/sandboxes", headers=h).json()["pagination"]["totalItems"] == 0, "nothing created")
    r = httpx.get(f"{BASE}/sandboxes", headers=dict(h, **{"X-Request-ID": "req-123"}))
    check(r.headers.get("x-request-id") == "req-123", f"request id {r.headers}")
    check(httpx.get(f"{BASE}/sandboxes", headers=h).headers.get("x-request-id"), "generated request id")
    r = httpx.get(f"{BASE}/no-such-endpoint", headers=h)
    check(r.status_code == 404 and set(r.json()) == {"code", "message"}, f"unknown endpoint: {r.status_code} {r.text}")
    r = httpx.put(f"{BASE}/sandboxes", headers=h)
    check(r.status_code == 405 and set(r.json()) == {"code", "message"}, f"wrong method: {r.status_code} {r.text}")


def auth():
    check(API_KEY, "the auth scenario needs OSB_API_KEY")
    e = expect_api_error(lambda: SandboxManagerSync.create(connection_config=sync_config(api_key="")).list_sandbox_infos(SandboxFilter()), 401, "MISSING_API_KEY")
    expect_api_error(lambda: SandboxManagerSync.create(connection_config=sync_config(api_key="wrong")).list_sandbox_infos(SandboxFilter()), 401, "INVALID_API_KEY")
    try:
        SandboxSync.create("host", connection_config=sync_config(api_key="wrong"))
        raise AssertionError("create with a wrong key must fail")
    except SandboxException:
        pass
    check(httpx.get(f"{BASE}/sandboxes").status_code == 401, "raw request without key")
    a = SandboxSync.create("host", connection_config=sync_config())
    b = SandboxSync.create("host", connection_config=sync_config())
    try:
        check(a.commands.run("echo ok").text == "ok", "with the key")
        ea = a.get_endpoint(44772)
        eb = b.get_endpoint(44772)
        url = f"http://{ea.endpoint}/command"
        body = {"command": "echo pwned"}
        check(httpx.post(url, json=body).status_code == 401, "execd without token")
        check(httpx.post(url, json=body, headers=eb.headers).status_code == 401, "execd with another sandbox's token")
        check(httpx.post(url, json=body, headers={"OPEN-SANDBOX-API-KEY": API_KEY}).status_code == 401, "API key is not an execd token")
        r = httpx.get(f"http://{ea.endpoint}/files/download", params={"path": "/etc/hostname"})
        check(r.status_code == 401, "files without token")
    finally:
        a.kill()
        b.kill()


def expiry():
    cfg = sync_config()
    sbx = SandboxSync.create("host", connection_config=cfg, timeout=timedelta(seconds=60))
    info = sbx.get_info()
    check((info.expires_at - info.created_at).total_seconds() == 60, f"expiresAt {info}")
    sid = sbx.id
    shell = shell_of(sid)
    renewed = time.monotonic()
    sbx.renew(timedelta(seconds=2))

    def gone():
        try:
            SandboxManagerSync.create(connection_config=cfg).get_sandbox_info(sid)
            return False
        except SandboxApiException as e:
            check(e.status_code == 404, f"status {e.status_code} != 404: {e}")
            return True

    # Gone once its 2 s are up (the daemon's expiry sweep may come a little later on a busy
    # machine: waited for, 20 s at most), not before.
    wait_for(gone, 20, "the expired sandbox is still there")
    check(time.monotonic() - renewed >= 1.9, f"expired {time.monotonic() - renewed:.1f}s after a 2 s renew")
    # Ended by its timeout: its shell is discarded, never reused (as a run's after a timeout).
    check(wait_shell_released(shell) == "gone", "the expired sandbox's shell is still there")
    try:
        sbx.commands.run("echo too late")
        raise AssertionError("an expired sandbox must not run commands")
    except SandboxException:
        pass
    sbx.close()
    # No expiry at all: timeout null.
    r = httpx.post(f"{BASE}/sandboxes", json={"image": {"uri": "host"}, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": None}, headers=lifecycle_headers())
    check(r.status_code == 202 and "expiresAt" not in r.json(), f"manual cleanup sandbox {r.text}")
    check(httpx.delete(f"{BASE}/sandboxes/{r.json()['id']}", headers=lifecycle_headers()).status_code == 204, "delete")


def wait_state(mgr, sid, states, secs=15):
    deadline = time.monotonic() + secs
    while True:
        info = mgr.get_sandbox_info(sid)
        if info.status.state in states:
            return info
        check(time.monotonic() < deadline, f"{sid} still {info.status.state}, wanted {states}")
        time.sleep(0.05)


def entrypoint_exit():
    """The entrypoint is the main process: when it exits, the sandbox stops (every process
    killed, cgroup gone) and is listed as Terminated (exit 0) or Failed (else), with why, until
    it is deleted; commands are refused with a 409, the entrypoint's log stays readable."""
    mgr = SandboxManagerSync.create(connection_config=sync_config())
    body = {"image": {"uri": "host"}, "timeout": 600, "resourceLimits": {"cpu": "1", "memory": "1Gi"}}
    ids = {}
    # Each entrypoint waits for /tmp/go (written through the file API once the test knows the
    # sandbox's shell): a fixed sleep instead let a loaded host end it before `ps` saw it.
    held = "until [ -e /tmp/go ]; do sleep 0.02; done; "
    for name, ep in (("fail", ["sh", "-c", held + "sleep 300 & echo bye; sleep 0.3; exit 3"]), ("ok", ["sh", "-c", held + "sleep 0.3"])):
        r = httpx.post(f"{BASE}/sandboxes", json=dict(body, entrypoint=ep), headers=lifecycle_headers())
        check(r.status_code == 202, f"create {r.status_code} {r.text}")
        ids[name] = r.json()["id"]
    shells = {name: shell_of(sid) for name, sid in ids.items()}
    for sid in ids.values():
        held_sbx = SandboxSync.connect(sid, connection_config=sync_config())
        held_sbx.files.write_files([WriteEntry(path="/tmp/go", data="")])
        held_sbx.close()
    failed = wait_state(mgr, ids["fail"], {"Failed"})
    check(failed.status.reason == "ENTRYPOINT_FAILED" and "code 3" in (failed.status.message or ""), f"failed status {failed.status}")
    done = wait_state(mgr, ids["ok"], {"Terminated"})
    check(done.status.reason == "ENTRYPOINT_EXITED" and "code 0" in (done.status.message or ""), f"terminated status {done.status}")
    # Still listed, with its state.
    listed = {s.id: s.status.state for s in mgr.list_sandbox_infos(SandboxFilter()).sandbox_infos}
    check(listed.get(ids["fail"]) == "Failed" and listed.get(ids["ok"]) == "Terminated", f"list {listed}")
    sid = ids["fail"]
    # Every process is gone (the background sleep too): its shell is gone, or back in the
    # pool with its init alone in its cgroup.
    wait_shell_released(shells["fail"])
    ep = httpx.get(f"{BASE}/sandboxes/{sid}/endpoints/44772", headers=lifecycle_headers()).json()
    execd = f"http://{ep['endpoint']}"
    r = httpx.post(f"{execd}/command", json={"command": "echo hi"}, headers=ep["headers"])
    check(r.status_code == 409 and "code 3" in r.json()["message"], f"command on an ended sandbox: {r.status_code} {r.text}")
    r = httpx.get(f"{execd}/command/entrypoint/logs", headers=ep["headers"])
    check(r.status_code == 200 and r.text == "bye\n", f"entrypoint log: {r.status_code} {r.text!r}")
    r = httpx.post(f"{BASE}/sandboxes/{sid}/pause", headers=lifecycle_headers())
    check(r.status_code == 409, f"pause of an ended sandbox: {r.status_code} {r.text}")
    # The SDK sees it too.
    sbx = SandboxSync.connect(sid, connection_config=sync_config(), skip_health_check=True)
    check(sbx.get_info().status.state == "Failed", "SDK get_info state")
    try:
        sbx.commands.run("echo hi")
        raise AssertionError("an ended sandbox must not run commands")
    except SandboxException:
        pass
    sbx.kill()
    sbx.close()
    mgr.kill_sandbox(ids["ok"])
    for sid in ids.values():
        expect_api_error(lambda: mgr.get_sandbox_info(sid), 404)


def log_cap():
    """A command's log is bounded (the newest 8 MiB): the cursor still counts every line."""
    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        ex = sbx.commands.run("seq 1 2000000", opts=RunCommandOpts(background=True))
        cid = ex.id
        deadline = time.monotonic() + 60
        while sbx.commands.get_command_status(cid).running:
            check(time.monotonic() < deadline, "seq still running")
            time.sleep(0.1)
        ep = httpx.get(f"{BASE}/sandboxes/{sbx.id}/endpoints/44772", headers=lifecycle_headers()).json()
        r = httpx.get(f"http://{ep['endpoint']}/command/{cid}/logs", params={"cursor": 0}, headers=ep["headers"])
        check(r.status_code == 200, f"logs {r.status_code}")
        lines = r.text.splitlines()
        check(r.headers["EXECD-COMMANDS-TAIL-CURSOR"] == "2000000", f"cursor {r.headers}")
        check(lines[-1] == "2000000" and int(lines[0]) > 1, f"kept {lines[0]}..{lines[-1]}")
        check(len(r.content) <= 8 * 1024 * 1024 and int(lines[0]) + len(lines) - 1 == 2000000, f"{len(r.content)} bytes, {len(lines)} lines from {lines[0]}")
        # A cursor inside what is kept gives what follows it.
        r = httpx.get(f"http://{ep['endpoint']}/command/{cid}/logs", params={"cursor": 1999998}, headers=ep["headers"])
        check(r.text == "1999999\n2000000\n", f"tail {r.text!r}")
    finally:
        sbx.kill()


def metrics_watch():
    """/metrics/watch streams the metrics JSON every second; CPU use is that of the interval."""
    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        sbx.commands.run("while :; do :; done", opts=RunCommandOpts(background=True))
        ep = httpx.get(f"{BASE}/sandboxes/{sbx.id}/endpoints/44772", headers=lifecycle_headers()).json()
        got = []
        with httpx.stream("GET", f"http://{ep['endpoint']}/metrics/watch", headers=ep["headers"], timeout=10) as r:
            check(r.status_code == 200, f"watch {r.status_code}")
            for line in r.iter_lines():
                if line.strip():
                    got.append(json.loads(line))
                if len(got) == 3:
                    break
        keys = {"cpu_count", "cpu_used_pct", "mem_total_mib", "mem_used_mib", "timestamp"}
        check(all(keys <= set(m) for m in got), f"metrics keys {got}")
        gaps = [b["timestamp"] - a["timestamp"] for a, b in zip(got, got[1:])]
        check(all(800 <= g <= 1500 for g in gaps), f"one a second: gaps {gaps}")
        check(got[-1]["cpu_used_pct"] > 20, f"a busy loop shows: {got}")
    finally:
        sbx.kill()


PROXY_SERVER = r"""
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        if self.headers.get("Upgrade") == "echo":
            self.send_response(101)
            self.send_header("Upgrade", "echo")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            while True:
                b = self.connection.recv(4096)
                if not b:
                    return
                self.connection.sendall(b.upper())
        body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Set-Cookie", "agentrun_ui=planted; Path=/")
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        n = int(self.headers["Content-Length"])
        body = self.rfile.read(n)[::-1]
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
"""


def port_proxy():
    """The endpoint of any other port proxies HTTP (and upgrades) to 127.0.0.1:port inside the
    sandbox; agentrun's credentials are not forwarded; nothing listening gives a 502."""
    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        sbx.files.write_file("/tmp/server.py", PROXY_SERVER)
        sbx.commands.run("python3 /tmp/server.py", opts=RunCommandOpts(background=True))
        ep = sbx.get_endpoint(8000)
        url = f"http://{ep.endpoint}"
        deadline = time.monotonic() + 15
        while True:
            r = httpx.get(f"{url}/hello/there?x=1", headers=ep.headers)
            if r.status_code == 200:
                break
            check(time.monotonic() < deadline and r.status_code == 502, f"proxy {r.status_code} {r.text}")
            time.sleep(0.2)
        seen = r.json()
        check(seen["path"] == "/hello/there?x=1", f"path {seen}")
        # The sandbox's answer is served at the API's origin: no cookie of its own, its
        # HTML confined to an opaque origin.
        check("set-cookie" not in r.headers, f"a sandbox set a cookie: {r.headers}")
        check("sandbox" in r.headers.get_list("content-security-policy"), f"CSP {r.headers}")
        check(r.headers.get("x-content-type-options") == "nosniff", f"nosniff {r.headers}")
        lower = {k.lower() for k in seen["headers"]}
        check("x-execd-access-token" not in lower and "open-sandbox-api-key" not in lower, f"credentials forwarded: {seen}")
        r = httpx.post(f"{url}/echo", content=b"abc" * 100000, headers=ep.headers)
        check(r.status_code == 201 and r.content == (b"abc" * 100000)[::-1], f"post {r.status_code} {len(r.content)}")
        # Without the sandbox's token: refused.
        check(httpx.get(f"{url}/x").status_code == 401, "the proxy needs the token")
        # An upgrade: raw bytes both ways after the 101.
        host, path = ep.endpoint.split("/", 1)
        h, p = host.rsplit(":", 1)
        with socket.create_connection((h, int(p)), timeout=10) as c:
            hdrs = "".join(f"{k}: {v}\r\n" for k, v in ep.headers.items())
            c.sendall(f"GET /{path}/ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: echo\r\nConnection: Upgrade\r\n{hdrs}\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = c.recv(4096)
                check(chunk, f"closed before the 101: {head!r}")
                head += chunk
            check(head.startswith(b"HTTP/1.1 101"), f"upgrade answer {head!r}")
            c.sendall(b"ping")
            got = b""
            while len(got) < 4:
                got += c.recv(4096)
            check(got == b"PING", f"upgraded stream {got!r}")
        # Nothing on that port: 502 with the OpenSandbox error shape.
        other = sbx.get_endpoint(8009)
        r = httpx.get(f"http://{other.endpoint}/", headers=other.headers)
        check(r.status_code == 502 and "8009" in r.json()["message"], f"no server: {r.status_code} {r.text}")
    finally:
        sbx.kill()


def run_as_user():
    """uid/gid run the command as that user inside the sandbox (ids of the sandbox, not the
    host's): it cannot write what the sandbox's root owns."""
    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        ex = sbx.commands.run("id -u; id -g; touch /workspace/x 2>&1 || echo denied", opts=RunCommandOpts(uid=1000, gid=1001))
        lines = [m.text for m in ex.logs.stdout]
        check(lines[:2] == ["1000", "1001"] and lines[-1] == "denied", f"as 1000:1001: {lines} {ex.logs.stderr}")
        ex = sbx.commands.run("id -u", opts=RunCommandOpts(uid=1000))
        check(ex.text == "1000", f"uid only: {ex.text!r}")
        check(sbx.commands.run("id -u").text == "0", "default: the sandbox's root")
        ep = httpx.get(f"{BASE}/sandboxes/{sbx.id}/endpoints/44772", headers=lifecycle_headers()).json()
        r = httpx.post(f"http://{ep['endpoint']}/command", json={"command": "id", "gid": 5}, headers=ep["headers"])
        check(r.status_code == 400 and "uid" in r.json()["message"], f"gid without uid: {r.status_code} {r.text}")
    finally:
        sbx.kill()


def escape():
    secret_path = os.environ["OSB_HOST_SECRET"]
    probe = os.environ["OSB_HOST_PROBE"]
    secret = open(secret_path).read()
    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        fs = sbx.files
        # Writes with .. stay inside.
        fs.write_file("/../../../../.." + probe, "escaped?")
        check(not os.path.exists(probe), "a write with .. reached the host")
        check(fs.read_file(probe) == "escaped?", "the .. write landed inside the sandbox")
        # Absolute and relative symlinks made inside resolve inside.
        ex = sbx.commands.run(
            f"mkdir -p /tmp/l && ln -s / /tmp/l/root && ln -s {secret_path} /tmp/l/abs && "
            f"ln -s ../../../../../../..{secret_path} /tmp/l/rel && ln -s /proc/1/root /tmp/l/magic"
        )
        check(ex.exit_code == 0, f"symlinks: {ex.logs.stderr}")
        for p in ["/tmp/l/abs", "/tmp/l/rel", "/tmp/l/root" + secret_path, secret_path, "/proc/self/root" + secret_path, "/tmp/l/magic" + secret_path, "/proc/1/root" + secret_path]:
            try:
                got = fs.read_file(p)
            except SandboxException:
                continue
            check(secret not in got, f"host secret read through {p}")
        for p in ["/tmp/l/abs", "/tmp/l/root" + probe, "/proc/self/root" + probe, "/tmp/l/magic" + probe]:
            try:
                fs.write_file(p, "escaped?")
            except SandboxException:
                pass
            check(not os.path.exists(probe), f"a write through {p} reached the host")
        check(open(secret_path).read() == secret, "host secret modified")
        # Host-owned pseudo files stay out of reach (the API acts as the sandbox's root).
        for p in ["/proc/sys/kernel/hostname", "/sys/kernel/mm/transparent_hugepage/enabled"]:
            before = open(p).read() if os.path.exists(p) else None
            try:
                fs.write_file(p, "pwned\n")
            except SandboxException:
                pass
            if before is not None:
                check(open(p).read() == before, f"host {p} changed")
        # Moves and deletes with .. stay inside too.
        fs.write_file("/tmp/m.txt", "m")
        fs.move_files([MoveEntry(src="/tmp/m.txt", dest="/../../.." + probe)])
        check(not os.path.exists(probe), "a move reached the host")
        try:
            fs.delete_files(["/../../../.." + secret_path])
        except SandboxException:
            pass
        try:
            fs.delete_directories(["/tmp/l/root/etc"])
        except SandboxException:
            pass
        check(os.path.exists(secret_path), "a delete reached the host")
        check(os.path.exists("/etc/passwd"), "host /etc touched")
        # Reading devices and FIFOs is refused, never hangs.
        sbx.commands.run("mkfifo /tmp/fifo")
        for p in ["/tmp/fifo", "/dev/zero"]:
            try:
                fs.read_bytes(p)
                raise AssertionError(f"{p} was read")
            except SandboxException:
                pass
    finally:
        sbx.kill()


async def many():
    cfg = async_config()
    n = 20

    async def one(i):
        sbx = await Sandbox.create("host", connection_config=cfg, env={"I": str(i)})
        try:
            ex = await sbx.commands.run("echo $I; echo $I > /tmp/i; cat /tmp/i")
            check([m.text for m in ex.logs.stdout] == [str(i), str(i)], f"sandbox {i}: {ex.logs.stdout}")
            return sbx.id
        finally:
            await sbx.kill()
            await sbx.close()

    ids = await asyncio.gather(*(one(i) for i in range(n)))
    check(len(set(ids)) == n, f"ids {ids}")


def traces():
    tp = os.environ["OSB_TRACEPARENT"]
    cfg = ConnectionConfigSync(domain=DOMAIN, api_key=API_KEY, protocol="http", headers={"traceparent": tp})
    sbx = SandboxSync.create("host", connection_config=cfg)
    try:
        ex = sbx.commands.run("echo $TRACEPARENT")
        got = ex.text.split("-")
        check(len(got) == 4 and got[1] == tp.split("-")[1], f"TRACEPARENT in the sandbox: {ex.text!r}")
        check(sbx.commands.run("exit 4").exit_code == 4, "exit 4")
    finally:
        sbx.kill()


def code():
    from code_interpreter.sync.code_interpreter import CodeInterpreterSync
    from code_interpreter.models.code_sync import SupportedLanguageSync

    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        # Its readiness probe looks for a Jupyter port inside the sandbox; agentrun serves /code
        # itself (no Jupyter), so the probe is skipped.
        ci = CodeInterpreterSync.create(sandbox=sbx, skip_health_check=True)
        # The default Python context keeps its globals.
        r = ci.codes.run("x = 40\nprint('hello')\nx + 2")
        check([m.text for m in r.logs.stdout] == ["hello"], f"stdout {r.logs.stdout}")
        check([res.text for res in r.result] == ["42"], f"result {r.result}")
        check(r.error is None, f"error {r.error}")
        r = ci.codes.run("x * 2")
        check([res.text for res in r.result] == ["80"], f"globals kept: {r.result}")
        # A context of its own does not see the default one's globals.
        ctx = ci.codes.create_context(SupportedLanguageSync.PYTHON)
        check(ctx.id and ctx.language == "python", f"context {ctx}")
        r = ci.codes.run("import sys\nprint('to err', file=sys.stderr)\nx", context=ctx)
        check([m.text for m in r.logs.stderr] == ["to err"], f"stderr {r.logs.stderr}")
        check(r.error is not None and r.error.name == "NameError", f"NameError expected: {r.error}")
        check(any(c.id == ctx.id for c in ci.codes.list_contexts(SupportedLanguageSync.PYTHON)), "listed")
        check(ci.codes.get_context(ctx.id).id == ctx.id, "get context")
        r = ci.codes.run("1/0", context=ctx)
        check(r.error is not None and r.error.name == "ZeroDivisionError", f"{r.error}")
        # It runs inside the sandbox.
        r = ci.codes.run("import os\nos.getuid(), open('/etc/hostname').read().strip()", context=ctx)
        check([res.text for res in r.result] == ["(0, 'sandbox')"], f"inside: {r.result}")
        ci.codes.delete_context(ctx.id)
        try:
            ci.codes.get_context(ctx.id)
            raise AssertionError("deleted context still there")
        except SandboxException:
            pass
        # Other languages are refused clearly.
        try:
            ci.codes.create_context("javascript")
            raise AssertionError("javascript context created")
        except SandboxException as e:
            check("python only" in str(e), f"{e}")
    finally:
        sbx.kill()


def code_zygote():
    """The daemon's OpenSandbox profile has a Python zygote: a code context is a fork of it
    (its parent, the zygote, is outside the sandbox's pid namespace: getppid() is 0 where an
    exec'd interpreter sees 1) and keeps its state."""
    from code_interpreter.sync.code_interpreter import CodeInterpreterSync
    from code_interpreter.models.code_sync import SupportedLanguageSync

    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        ci = CodeInterpreterSync.create(sandbox=sbx, skip_health_check=True)
        deadline = time.time() + 60
        while True:
            # A shell's zygote imports its preload list in the background: the first
            # contexts of a fresh shell may be exec'd.
            ctx = ci.codes.create_context(SupportedLanguageSync.PYTHON)
            r = ci.codes.run("import os\nos.getppid()", context=ctx)
            if [res.text for res in r.result] == ["0"]:
                break
            check([res.text for res in r.result] == ["1"], f"ppid: {r.result} {r.error}")
            check(time.time() < deadline, "no context forked by the zygote within 60 s")
            ci.codes.delete_context(ctx.id)
            time.sleep(0.5)
        r = ci.codes.run("y = 20", context=ctx)
        r = ci.codes.run("print('state', y * 2)\ny + 1", context=ctx)
        check([m.text for m in r.logs.stdout] == ["state 40"], f"stdout {r.logs.stdout}")
        check([res.text for res in r.result] == ["21"], f"state kept: {r.result}")
        r = ci.codes.run("import json\njson.dumps({'a': [1, 2]})", context=ctx)
        check([res.text for res in r.result] == ["'{\"a\": [1, 2]}'"], f"{r.result}")
        ci.codes.delete_context(ctx.id)
        # A command string runs under the image's shell, which execs python3: not forked.
        ex = sbx.commands.run("python3 -c 'import os; print(os.getppid())'")
        check([m.text for m in ex.logs.stdout] == ["1"], f"python3 command: {ex.logs.stdout} {ex.logs.stderr}")
    finally:
        sbx.kill()


FETCH = r"""
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=15)
    print("status", r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print("status", e.code, e.read().decode().strip())
"""


TUNNEL = r"""
import os, socket, sys, time
up = sys.argv[1]
s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
s.sendall(f"CONNECT {up} HTTP/1.1\r\nHost: {up}\r\n\r\n".encode())
f = s.makefile("rb")
print("connect", f.readline().decode().strip(), flush=True)
while f.readline() not in (b"\r\n", b""):
    pass
def get(path):
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status = f.readline().decode().strip()
    n = 0
    while True:
        line = f.readline()
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":")[1])
        if line in (b"\r\n", b""):
            break
    return status, f.read(n).decode()
print("first", *get("/tunnel-1"), flush=True)
while not os.path.exists("/tmp/go"):
    time.sleep(0.05)
try:
    status, body = get("/tunnel-2")
    print("second", status or "cut", body, flush=True)
except OSError as e:
    print("second cut", e.errno, flush=True)
"""


def wait_logs(sbx, cid, want, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        text = sbx.commands.get_background_command_logs(cid).content
        if want in text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"no {want!r} in the logs of {cid}: {sbx.commands.get_background_command_logs(cid).content!r}")


def fetch(sbx, url):
    """GET `url` with Python's urllib inside the sandbox (it honours HTTP_PROXY)."""
    ex = sbx.commands.run(f"python3 -c {shlex.quote(FETCH)} {shlex.quote(url)}")
    check(ex.exit_code == 0, f"fetch {url}: exit {ex.exit_code} {ex.logs.stderr}")
    return ex.text


def upstream():
    """A loopback HTTP server on the host standing in for an allowed host; returns
    (host:port, list of paths it served)."""
    import http.server
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a tunnel can carry several requests

        def do_GET(self):
            seen.append(self.path)
            body = f"upstream says {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"127.0.0.1:{srv.server_address[1]}", seen


def egress():
    up, seen = upstream()
    port = up.split(":")[1]
    print("UPSTREAM", up)
    cfg = sync_config()
    # Ordered rules, first match wins: a deny before a wildcard allow wins; the upstream is
    # allowed by name (its literal address).
    a = SandboxSync.create("host", connection_config=cfg, network_policy=NetworkPolicy(
        default_action="deny",
        egress=[
            NetworkRule(action="deny", target="blocked.agentrun.test"),
            NetworkRule(action="allow", target="*.agentrun.test"),
            NetworkRule(action="allow", target="127.0.0.1"),
        ]))
    b = SandboxSync.create("host", connection_config=cfg, network_policy=NetworkPolicy(
        default_action="deny", egress=[NetworkRule(action="allow", target="pypi.org")]))
    c = SandboxSync.create("host", connection_config=cfg)
    print("SANDBOX_A", a.id)
    print("SANDBOX_B", b.id)
    try:
        env = a.commands.run("echo $HTTP_PROXY $https_proxy").text
        check(env == "http://127.0.0.1:3128 http://127.0.0.1:3128", f"proxy env {env!r}")
        got = fetch(a, f"http://{up}/from-a")
        check(got == "status 200 upstream says /from-a", f"allowed host: {got!r}")
        check(seen == ["/from-a"], f"upstream saw {seen}")
        got = fetch(a, "http://blocked.agentrun.test/x")
        check(got.startswith("status 403") and "rule networkPolicy.egress[0]" in got, f"deny before wildcard: {got!r}")
        # The wildcard allows the name; agentrun then resolves it itself, and there is no such
        # name: an error (502 with the reason), not a denial.
        got = fetch(a, "http://ok.agentrun.test/x")
        check(got.startswith("status 502") and "cannot resolve ok.agentrun.test" in got, f"wildcard: {got!r}")
        got = fetch(a, "http://other.example.org/x")
        check(got.startswith("status 403") and "rule network.default" in got, f"default deny: {got!r}")
        # Nothing but the proxy leads out: the host's loopback is not the sandbox's, no route elsewhere.
        check(a.commands.run(f"exec 3<>/dev/tcp/127.0.0.1/{port}").exit_code != 0, "direct connect to the upstream")
        check(a.commands.run("exec 3<>/dev/tcp/1.1.1.1/80").exit_code != 0, "direct connect outside")

        # Live changes through the egress endpoint: B does not allow the upstream yet.
        got = fetch(b, f"http://{up}/b-before")
        check(got.startswith("status 403") and "rule network.default" in got, f"B before patch: {got!r}")
        b.patch_egress_rules([NetworkRule(action="allow", target="127.0.0.1")])
        pol = b.get_egress_policy()
        check([(r.action, r.target) for r in pol.egress] == [("allow", "127.0.0.1"), ("allow", "pypi.org")], f"after patch {pol}")
        got = fetch(b, f"http://{up}/b-patched")
        check(got == "status 200 upstream says /b-patched", f"B after patch: {got!r}")
        # Incoming rules win over existing ones for the same target.
        b.patch_egress_rules([NetworkRule(action="deny", target="127.0.0.1")])
        pol = b.get_egress_policy()
        check([(r.action, r.target) for r in pol.egress] == [("deny", "127.0.0.1"), ("allow", "pypi.org")], f"after deny patch {pol}")
        got = fetch(b, f"http://{up}/b-denied")
        check(got.startswith("status 403") and "rule networkPolicy.egress[0]" in got, f"B after deny patch: {got!r}")
        b.patch_egress_rules([NetworkRule(action="allow", target="127.0.0.1")])
        check(fetch(b, f"http://{up}/b-again").startswith("status 200"), "B allowed again")
        # A tunnel open while the policy changes: it is cut when the change denies it.
        tun = b.commands.run(f"python3 -c {shlex.quote(TUNNEL)} {up}", opts=RunCommandOpts(background=True))
        logs = wait_logs(b, tun.id, "first ")
        check("connect HTTP/1.1 200 Connection established" in logs and "first HTTP/1.1 200 OK upstream says /tunnel-1" in logs, f"tunnel {logs!r}")
        # DELETE removes the rule: denied again (the default).
        b.delete_egress_rules(["127.0.0.1", "not-there.example"])
        b.commands.run("touch /tmp/go")
        logs = wait_logs(b, tun.id, "second ")
        check("second cut" in logs, f"tunnel after the rule was deleted: {logs!r}")
        pol = b.get_egress_policy()
        check(pol.default_action == "deny" and [r.target for r in pol.egress] == ["pypi.org"], f"after delete {pol}")
        got = fetch(b, f"http://{up}/b-deleted")
        check(got.startswith("status 403") and "rule network.default" in got, f"B after delete: {got!r}")
        check(seen == ["/from-a", "/b-patched", "/b-again", "/tunnel-1"], f"upstream saw {seen}")
        # A's policy was not touched by B's changes.
        check(fetch(a, f"http://{up}/a-still").startswith("status 200"), "A unchanged")

        # The egress endpoint wants B's own token; bad bodies are refused and change nothing.
        ep = b.get_endpoint(18080)
        url = f"http://{ep.endpoint}/policy"
        check(httpx.patch(url, json=[{"action": "allow", "target": "127.0.0.1"}]).status_code == 401, "patch without token")
        other = a.get_endpoint(18080).headers
        check(httpx.patch(url, json=[{"action": "allow", "target": "127.0.0.1"}], headers=other).status_code == 401, "patch with A's token")
        r = httpx.patch(url, json=[{"action": "allow", "target": "10.0.0.0/8"}], headers=ep.headers)
        check(r.status_code == 400 and "only FQDNs" in r.json()["message"], f"CIDR patch {r.status_code} {r.text}")
        check(httpx.request("DELETE", url, json=[], headers=ep.headers).status_code == 400, "empty delete")
        check([r.target for r in b.get_egress_policy().egress] == ["pypi.org"], "unchanged after bad requests")

        # No networkPolicy: no proxy, no route, and nothing to change.
        check(c.commands.run("echo -n $HTTP_PROXY").text == "", "no proxy env without networkPolicy")
        check(c.commands.run("exec 3<>/dev/tcp/127.0.0.1/3128").exit_code != 0, "no bridge without networkPolicy")
        check(c.commands.run(f"exec 3<>/dev/tcp/127.0.0.1/{port}").exit_code != 0, "no route without networkPolicy")
        pol = c.get_egress_policy()
        check(pol.default_action == "deny" and not pol.egress, f"C policy {pol}")
        try:
            c.patch_egress_rules([NetworkRule(action="allow", target="127.0.0.1")])
            raise AssertionError("patching a sandbox without networkPolicy must fail")
        except SandboxException as e:
            check("without a networkPolicy" in str(e), f"{e}")
        # A policy agentrun cannot enforce is refused at create.
        expect_api_error(lambda: SandboxSync.create("host", connection_config=cfg, network_policy=NetworkPolicy(
            default_action="deny", egress=[NetworkRule(action="allow", target="10.0.0.0/8")])), 400, "INVALID_PARAMETER")
    finally:
        a.kill()
        b.kill()
        c.kill()


def pooled_shapes():
    """A sandbox with a networkPolicy and resourceLimits (issue 13): the Rust side checks that a
    pooled shell served it (`sandbox.pool_hit`, `agentrun pool status`); here, that it works:
    the policy allows the upstream and denies another host, the limits are in force and the
    memory limit is enforced (the OOM killer ends a command over it: 137) without taking the
    sandbox down."""
    up, seen = upstream()
    cfg = sync_config()
    sbx = SandboxSync.create(
        "host",
        connection_config=cfg,
        timeout=timedelta(minutes=10),
        resource={"cpu": "500m", "memory": "96Mi"},
        network_policy=NetworkPolicy(default_action="deny", egress=[NetworkRule(action="allow", target="127.0.0.1")]),
    )
    print("SANDBOX", sbx.id, flush=True)
    try:
        got = fetch(sbx, f"http://{up}/pooled")
        check(got == "status 200 upstream says /pooled", f"allowed host: {got!r}")
        got = fetch(sbx, "http://other.example.org/x")
        check(got.startswith("status 403") and "rule network.default" in got, f"another host: {got!r}")
        check(seen == ["/pooled"], f"upstream saw {seen}")
        check(sbx.commands.run(f"exec 3<>/dev/tcp/{up.replace(':', '/')}").exit_code != 0, "direct connect to the upstream")
        check(cgroup_file(sbx.id, "memory.limit_in_bytes", "memory.max") == str(96 << 20), "memory limit")
        m = sbx.get_metrics()
        check(m.cpu_count == 0.5 and m.memory_total_in_mib == 96.0, f"metrics {m}")
        ex = sbx.commands.run("python3 -c 'b = b\"x\" * (256 << 20); print(len(b))'")
        check(ex.exit_code == 137 and not ex.text, f"over the memory limit: exit {ex.exit_code} {ex.text!r}")
        check(sbx.commands.run("echo alive").text == "alive", "the sandbox after the OOM")
        check(fetch(sbx, f"http://{up}/after").startswith("status 200"), "the proxy after the OOM")
    finally:
        sbx.kill()


# --- Memory bounds of the daemon (issue 15, item 4) ------------------------------------------
# The attacks below come from one sandbox or one client; the daemon must stay within a bound of
# the memory it had when they began (OSB_DAEMON_PID: `agentrun serve`), and another sandbox must
# keep answering. The bound: every buffer an attack can fill here is at most a few MiB (a run's
# queue of 16 events of at most 64 KiB of text, 16 queued lines of 64 KiB per stream, 64 KiB
# file chunks, a 4 MiB JSON body, a command log's 8 MiB); 64 MiB leaves room for the allocator
# and a busy tokio runtime, and the unbounded daemon (before the fix) passes it within seconds.
RSS_BOUND_MIB = 64


def daemon_memory():
    """(VmRSS, VmHWM) of the daemon, in MiB."""
    fields = {}
    with open(f"/proc/{os.environ['OSB_DAEMON_PID']}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                fields[k] = int(v.split()[0]) // 1024
    return fields["VmRSS"], fields["VmHWM"]


class Rss:
    """The daemon's resident memory stays within RSS_BOUND_MIB of what it was at the start."""

    def __init__(self):
        self.base, self.base_hwm = daemon_memory()
        self.peak = self.base
        print(f"RSS_BASE_MIB {self.base}", flush=True)

    def check(self, what):
        rss, hwm = daemon_memory()
        self.peak = max(self.peak, rss)
        check(rss - self.base <= RSS_BOUND_MIB, f"{what}: the daemon's RSS grew {self.base} -> {rss} MiB (bound +{RSS_BOUND_MIB})")
        # The peak between two looks, too.
        check(hwm <= max(self.base_hwm, self.base + RSS_BOUND_MIB), f"{what}: the daemon's peak RSS reached {hwm} MiB (base {self.base}, bound +{RSS_BOUND_MIB})")

    def report(self):
        rss, hwm = daemon_memory()
        print(f"RSS_MIB base {self.base} now {rss} peak_seen {self.peak} hwm {hwm}", flush=True)


def alive(sbx, what):
    ex = sbx.commands.run("echo alive")
    check(ex.text == "alive" and ex.exit_code == 0, f"the other sandbox stopped answering ({what}): {ex.text!r} {ex.exit_code}")


def execd_endpoint(sbx):
    ep = httpx.get(f"{BASE}/sandboxes/{sbx.id}/endpoints/44772", headers=lifecycle_headers()).json()
    return ep["endpoint"], ep["headers"]


def output_flood():
    """Output nobody reads (a session's background job, a code context's thread, a
    foreground command whose client stopped reading) waits in bounded queues: the process
    blocks, the daemon's memory does not grow."""
    from code_interpreter.sync.code_interpreter import CodeInterpreterSync

    cfg = sync_config()
    a = SandboxSync.create("host", connection_config=cfg)
    b = SandboxSync.create("host", connection_config=cfg)
    client = httpx.Client(timeout=None)
    try:
        ci = CodeInterpreterSync.create(sandbox=a, skip_health_check=True)
        ci.codes.run("1")
        alive(b, "before")
        rss = Rss()
        s = a.commands.create_session()
        ex = a.commands.run_in_session(s, "(yes session-out &); (yes session-err >&2 &); echo started")
        # (the jobs' first lines may come with it)
        check(ex.exit_code == 0 and "started" in [m.text for m in ex.logs.stdout], f"session: {ex.exit_code} {ex.logs.stdout[-3:]}")
        r = ci.codes.run(
            "import os, threading\nflooding = True\n"
            "def flood():\n    while flooding:\n        os.write(1, b'context-out\\n' * 100)\n"
            "threading.Thread(target=flood, daemon=True).start()\n'flooding'"
        )
        check([x.text for x in r.result] == ["'flooding'"], f"context: {r.result} {r.error}")
        endpoint, headers = execd_endpoint(a)
        stream = client.send(
            client.build_request("POST", f"http://{endpoint}/command", json={"command": "yes stream-out"}, headers=headers),
            stream=True,
        )
        lines = stream.iter_lines()
        init = json.loads(next(line for line in lines if line.strip()))
        check(init["type"] == "init", f"first event {init}")
        # Nobody reads any of it now.
        for i in range(15):
            time.sleep(1)
            rss.check(f"output flood, {i + 1} s")
            alive(b, f"output flood, {i + 1} s")
        stream.close()
        a.commands.interrupt(init["text"])
        # Each still works afterwards, its backlog delivered first.
        ex = a.commands.run_in_session(s, "pkill yes; echo done")
        # (a killed `yes` may leave half a line, which "done" then ends, as on a terminal)
        check(ex.exit_code == 0 and ex.logs.stdout[-1].text.endswith("done"), f"session after: {ex.exit_code} {ex.logs.stdout[-3:]}")
        r = ci.codes.run("flooding = False\nimport time; time.sleep(0.2)\n'stopped'")
        check([x.text for x in r.result] == ["'stopped'"], f"context after: {r.result} {r.error}")
        check(a.commands.run("echo fine").text == "fine", "a command after the flood")
        rss.check("after the flood")
        alive(b, "after the flood")
        rss.report()
    finally:
        client.close()
        a.kill()
        b.kill()


def big_files():
    """A 1 TiB sparse file made inside a sandbox: downloads (whole, Range, lines) stream it,
    replace works in bounded memory (and fails cleanly when the sandbox has no room for the
    copy), the daemon's memory does not grow."""
    cfg = sync_config()
    a = SandboxSync.create("host", connection_config=cfg)
    b = SandboxSync.create("host", connection_config=cfg)
    tib = 1 << 40
    try:
        ex = a.commands.run("truncate -s 1T /tmp/big && printf 'x one\\ny two\\nz three\\n' > /tmp/small && ls -ls /tmp/big")
        check(ex.exit_code == 0, f"truncate: {ex.logs.stderr}")
        alive(b, "before")
        rss = Rss()
        fs = a.files
        # The whole file, streamed: the first 64 MiB of it, then the client hangs up.
        got = 0
        stream = fs.read_bytes_stream("/tmp/big", chunk_size=1 << 20)
        for chunk in stream:
            check(chunk == bytes(len(chunk)), "a sparse file reads as zeros")
            got += len(chunk)
            if got % (16 << 20) == 0:
                rss.check(f"download, {got >> 20} MiB in")
            if got >= 64 << 20:
                break
        stream.close()
        check(got >= 64 << 20, f"download stopped at {got}")
        alive(b, "after the download")
        # Ranges, at the far end of the file and in a small one.
        check(fs.read_bytes("/tmp/big", range_header=f"bytes={tib - 6}-") == bytes(6), "Range at the end")
        check(fs.read_bytes("/tmp/big", range_header="bytes=-4") == bytes(4), "suffix Range")
        check(fs.read_bytes("/tmp/small", range_header="bytes=2-4") == b"one", "Range in a small file")
        # Lines: the 1 TiB file is one line; its first 8 MiB, then the client hangs up.
        got = 0
        stream = fs.read_bytes_stream("/tmp/big", offset=1, limit=1)
        for chunk in stream:
            got += len(chunk)
            if got >= 8 << 20:
                break
        stream.close()
        check(got >= 8 << 20, f"line download stopped at {got}")
        check(fs.read_file("/tmp/small", offset=2, limit=1) == "y two", "line 2")
        check(fs.read_file("/tmp/small", offset=2) == "y two\nz three", "lines 2-")
        rss.check("after the downloads")
        # Replace in the 1 TiB file: streamed into a copy next to it, which the sandbox's
        # writable layer has no room for: a clean error, the file as it was, no copy left.
        t = time.monotonic()
        try:
            fs.replace_contents([ContentReplaceEntry(path="/tmp/big", old_content="x", new_content="y")])
            raise AssertionError("replace in a 1 TiB file must fail for want of room")
        except SandboxApiException as e:
            check(e.status_code == 507, f"replace status {e.status_code}: {e}")
        print(f"REPLACE_1TIB_S {time.monotonic() - t:.1f}", flush=True)
        rss.check("after the replace")
        info = fs.get_file_info(["/tmp/big"])["/tmp/big"]
        check(info.size == tib, f"size after the failed replace: {info.size}")
        left = a.commands.run("ls -A /tmp").text.split()
        check(sorted(left) == ["big", "small"], f"/tmp after the failed replace: {left}")
        # ... and in a small one, as before.
        fs.replace_contents([ContentReplaceEntry(path="/tmp/small", old_content="two", new_content="2")])
        check(fs.read_file("/tmp/small") == "x one\ny 2\nz three\n", "replaced")
        alive(b, "after the replace")
        rss.check("at the end")
        rss.report()
    finally:
        a.kill()
        b.kill()


def hostile_body(path, headers, rss, what, total=20 * 10**9):
    """POSTs `path` announcing a `total`-byte body and sends it as fast as the daemon reads,
    checking its memory every 16 MiB. Returns (status of the answer or None, bytes sent)."""
    host, port = DOMAIN.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    head = f"POST {path} HTTP/1.1\r\nHost: {DOMAIN}\r\nContent-Type: application/json\r\nContent-Length: {total}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    s.sendall(head.encode())
    chunk = b" " * (1 << 20)
    sent = 0
    s.settimeout(5)
    try:
        while sent < total:
            s.sendall(chunk)
            sent += len(chunk)
            if sent % (16 << 20) == 0:
                rss.check(f"{what}: {sent >> 20} MiB sent")
    except OSError:
        pass  # the daemon stopped reading (answered, closed)
    s.settimeout(10)
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            more = s.recv(65536)
            if not more:
                break
            data += more
    except OSError:
        pass
    s.close()
    status = int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else None
    print(f"HOSTILE {what}: status {status} after {sent >> 20} MiB", flush=True)
    return status, sent


def body_limits():
    """Huge bodies: refused (401) before a byte of them is read without the right token or
    key, 413 past the JSON limit with them; the daemon's memory does not grow."""
    check(API_KEY, "the body_limits scenario needs OSB_API_KEY")
    cfg = sync_config()
    a = SandboxSync.create("host", connection_config=cfg)
    b = SandboxSync.create("host", connection_config=cfg)
    try:
        endpoint, token = execd_endpoint(a)
        prefix = endpoint[endpoint.index("/"):]
        alive(b, "before")
        rss = Rss()
        cases = [
            (f"{prefix}/files/permissions", {}, 401, "permissions without a token"),
            (f"{prefix}/files/permissions", token, 413, "permissions with the token"),
            (f"{prefix}/command", token, 413, "command with the token"),
            (f"{prefix}/files/upload", {}, 401, "upload without a token"),
            ("/v1/sandboxes", {}, 401, "create without the API key"),
            ("/v1/sandboxes", {"OPEN-SANDBOX-API-KEY": API_KEY}, 413, "create with the API key"),
        ]
        for path, headers, want, what in cases:
            status, sent = hostile_body(path, headers, rss, what)
            check(sent <= 64 << 20, f"{what}: the daemon read {sent >> 20} MiB of the body")
            check(status == want, f"{what}: status {status}, expected {want}")
            alive(b, what)
        rss.check("at the end")
        rss.report()
        # The 413 is a JSON error, as every other.
        r = httpx.post(f"http://{endpoint}/command", content=b" " * (5 << 20), headers={**token, "Content-Type": "application/json"})
        check(r.status_code == 413 and r.json()["code"] == "REQUEST_TOO_LARGE", f"{r.status_code} {r.text}")
    finally:
        a.kill()
        b.kill()


class Zeros(io.RawIOBase):
    """`n` zero bytes, made as they are read."""

    def __init__(self, n):
        self.left = n

    def readable(self):
        return True

    def readinto(self, b):
        k = min(len(b), self.left)
        b[:k] = bytes(k)
        self.left -= k
        return k


def upload_limit():
    """`--max-upload 8M --max-request-body 64K`: an upload under the limit works, one over
    it is answered 413 and leaves nothing (the old file intact); a JSON body over 64 KiB is
    413 too."""
    import hashlib

    sbx = SandboxSync.create("host", connection_config=sync_config())
    try:
        fs = sbx.files
        data = os.urandom(4 << 20)
        fs.write_file("/tmp/up/ok.bin", data)
        check(hashlib.sha256(fs.read_bytes("/tmp/up/ok.bin")).digest() == hashlib.sha256(data).digest(), "4 MiB round trip")
        e = expect_api_error(lambda: fs.write_file("/tmp/up/big.bin", Zeros(64 << 20)), 413)
        print(f"UPLOAD_413 {e}", flush=True)
        e = expect_api_error(lambda: fs.write_file("/tmp/up/ok.bin", Zeros(64 << 20)), 413)
        check(hashlib.sha256(fs.read_bytes("/tmp/up/ok.bin")).digest() == hashlib.sha256(data).digest(), "the old file after a refused upload")
        left = sbx.commands.run("ls -A /tmp/up").text.split()
        check(left == ["ok.bin"], f"/tmp/up after refused uploads: {left}")
        e = expect_api_error(lambda: sbx.commands.run("echo " + "x" * (100 << 10)), 413, "REQUEST_TOO_LARGE")
        check("--max-request-body" in str(e), f"{e}")
        check(sbx.commands.run("echo small").text == "small", "a small command")
    finally:
        sbx.kill()


def log_flood():
    """16 background commands writing as fast as they can, 4 of them short lines (what a line
    costs beyond its text counts), 12 of them 60 KB lines (their logs together go over the
    sandbox's budget): the logs stay within the budget (64 MiB of text; a ring buffer may
    hold up to twice what it keeps), the oldest lines go (the cursor still counts every line),
    another sandbox keeps answering."""
    cfg = sync_config()
    a = SandboxSync.create("host", connection_config=cfg)
    b = SandboxSync.create("host", connection_config=cfg)
    bound = 64 * 2 + RSS_BOUND_MIB
    long_line = "L" * 60000
    try:
        alive(b, "before")
        rss = Rss()
        run = lambda cmd: a.commands.run(cmd, opts=RunCommandOpts(background=True)).id
        ids = [run("yes s") for _ in range(4)] + [run(f"yes {long_line}") for _ in range(12)]
        endpoint, headers = execd_endpoint(a)

        def logs(cid):
            r = httpx.get(f"http://{endpoint}/command/{cid}/logs", params={"cursor": 0}, headers=headers, timeout=60)
            check(r.status_code == 200, f"logs {r.status_code}")
            return r.text.splitlines(), int(r.headers["EXECD-COMMANDS-TAIL-CURSOR"])

        trimmed = False
        for i in range(40):
            time.sleep(1)
            now, hwm = daemon_memory()
            check(now - rss.base <= bound and hwm <= max(rss.base_hwm, rss.base + bound),
                  f"log flood, {i + 1} s: the daemon's RSS went {rss.base} -> {now} MiB (peak {hwm}; bound +{bound})")
            alive(b, f"log flood, {i + 1} s")
            if i >= 5 and i % 3 == 0:
                lines, tail = logs(ids[4])
                if tail > len(lines):
                    trimmed = True
                    break
        check(trimmed, "the logs never went over the sandbox's budget: the scenario proves nothing")
        for cid in ids:
            a.commands.interrupt(cid)
        lines, tail = logs(ids[-1])
        check(lines and all(l == long_line for l in lines[-10:]), f"logs {[l[:20] for l in lines[-3:]]}")
        now, hwm = daemon_memory()
        print(f"RSS_MIB base {rss.base} now {now} hwm {hwm} after {i + 1} s; a log keeps {len(lines)} of {tail} lines", flush=True)
        alive(b, "after")
    finally:
        a.kill()
        b.kill()

def reuse():
    """Two sandboxes one after the other on a pool of one shell: each has an id of its own,
    both run in the same shell (pool hits), and the second sees nothing of the first (its
    files in / and /tmp, its processes)."""
    cfg = sync_config()
    a = SandboxSync.create("host", connection_config=cfg, timeout=timedelta(minutes=5))
    try:
        # (The default profile lets commands write /tmp but not /: the file API writes both.)
        a.files.write_file("/left", "one")
        a.commands.run("echo one > /tmp/left2; sleep 7331003", opts=RunCommandOpts(background=True))
        a.files.write_file("/tmp/left", "one")
        deadline = time.monotonic() + 10
        while a.commands.run("test -e /left && test -e /tmp/left && test -e /tmp/left2 && echo there").text != "there":
            check(time.monotonic() < deadline, "the first sandbox's files were not written")
            time.sleep(0.05)
        shell = shell_of(a.id)
        check(a.id != shell, f"sandbox id {a.id} is its shell's")
    finally:
        a.kill()
        a.close()
    check(wait_shell_released(shell) == "reused", f"shell {shell} was not given back to its pool")
    b = SandboxSync.create("host", connection_config=cfg, timeout=timedelta(minutes=5))
    try:
        check(b.id != a.id, f"the second sandbox has the first's id {a.id}")
        check(shell_of(b.id) == shell, f"the second sandbox is not in shell {shell}: {ps()}")
        r = b.commands.run("test -e /left || test -e /tmp/left || test -e /tmp/left2 || echo clean")
        check(r.text == "clean", f"the first sandbox's files are there: {r.text!r}")
        r = b.commands.run("ls -a / /tmp | grep -cx 'left2*'")
        check(r.text == "0", f"the first sandbox's files are listed: {r.text!r}")
        r = b.commands.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        check("cat" in r.text, f"no process list: {r.text!r}")
        check("sleep 7331003" not in r.text, f"the first sandbox's process is there: {r.text!r}")
    finally:
        b.kill()
        b.close()
    print("SHELL", shell, flush=True)
    print("IDS", a.id, b.id, flush=True)


SCENARIOS = {
    "reuse": reuse,
    "egress": egress,
    "pooled_shapes": pooled_shapes,
    "code": code,
    "code_zygote": code_zygote,
    "traces": traces,
    "sync_flow": sync_flow,
    "async_flow": lambda: asyncio.run(async_flow()),
    "list_filters": list_filters,
    "bad_requests": bad_requests,
    "auth": auth,
    "expiry": expiry,
    "escape": escape,
    "entrypoint_exit": entrypoint_exit,
    "log_cap": log_cap,
    "metrics_watch": metrics_watch,
    "port_proxy": port_proxy,
    "run_as_user": run_as_user,
    "many": lambda: asyncio.run(many()),
    "output_flood": output_flood,
    "log_flood": log_flood,
    "big_files": big_files,
    "body_limits": body_limits,
    "upload_limit": upload_limit,
}

if __name__ == "__main__":
    os.environ.setdefault("OPENSANDBOX_DISABLE_METRICS", "1")
    name = sys.argv[1]
    if ":" in name:
        # AREA:SCENARIO: a scenario of tests/opensandbox/sdk_AREA.py (which imports its
        # helpers from this module).
        import importlib

        area, scenario_name = name.split(":", 1)
        importlib.import_module(f"sdk_{area}").SCENARIOS[scenario_name]()
    else:
        SCENARIOS[name]()
    print(f"OK {name}")
