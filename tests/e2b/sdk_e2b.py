"""Scenarios of the official E2B SDKs (e2b==2.63.0, e2b-code-interpreter==2.11.5, from
.venv/e2b) against `agentrun serve --e2b ADDR`, unchanged: only E2B_API_URL and
E2B_SANDBOX_URL point at agentrun.

Usage: sdk_e2b.py SCENARIO. Environment: E2B_ADDR (host:port of agentrun's E2B API),
E2B_API_KEY (the daemon's API key). Prints "OK SCENARIO" at the end; any failed check raises
(non-zero exit).
"""

import json
import os
import sys
import time
import uuid

import httpx

ADDR = os.environ["E2B_ADDR"]
BASE = f"http://{ADDR}"
os.environ["E2B_API_URL"] = BASE
os.environ["E2B_SANDBOX_URL"] = BASE
os.environ.pop("E2B_DEBUG", None)
os.environ.pop("E2B_DOMAIN", None)
KEY = os.environ["E2B_API_KEY"]

from e2b import (  # noqa: E402
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def wait_until(what, timeout, f):
    """Polls `f` (bounded) until it is true; raises naming `what` otherwise."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if f():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def sync_flow():
    nonce = uuid.uuid4().hex[:8]
    sbx = Sandbox.create(timeout=120, metadata={"suite": nonce, "note": "free form: ok"},
                         envs={"GREETING": "hi"})
    try:
        info = sbx.get_info()
        check(info.sandbox_id == sbx.sandbox_id, f"info {info}")
        check(info.template_id == "base", f"template {info.template_id}")
        check(info.metadata.get("suite") == nonce, f"metadata {info.metadata}")
        check(sbx.is_running(), "is_running")

        # Exit codes, stdout and stderr.
        r = sbx.commands.run("echo hello")
        check(r.exit_code == 0 and r.stdout == "hello\n", f"echo: {r}")
        try:
            sbx.commands.run("echo out; echo oops >&2; exit 3")
            raise AssertionError("exit 3 did not raise")
        except CommandExitException as e:
            check(e.exit_code == 3, f"exit code {e.exit_code}")
            check(e.stdout == "out\n" and e.stderr == "oops\n", f"{e.stdout!r} {e.stderr!r}")
        # Env (the sandbox's and the command's), cwd.
        r = sbx.commands.run("echo $GREETING $FOO; pwd", envs={"FOO": "bar"}, cwd="/tmp")
        check(r.stdout == "hi bar\n/tmp\n", f"env/cwd: {r.stdout!r}")
        r = sbx.commands.run("pwd")
        check(r.stdout == "/root\n", f"default cwd: {r.stdout!r}")
        # Output streamed as it comes: the first line arrives before the command ends.
        seen = []
        r = sbx.commands.run(
            "echo one; sleep 1; echo two",
            on_stdout=lambda line: seen.append((line, time.time())),
        )
        check([s for s, _ in seen] == ["one\n", "two\n"], f"streamed {seen}")
        check(seen[1][1] - seen[0][1] > 0.5, f"not streamed as it came: {seen}")
        # User.
        r = sbx.commands.run("id -u", user="root")
        check(r.stdout == "0\n", f"root: {r.stdout!r}")
        r = sbx.commands.run("id -un", user="nobody")
        check(r.stdout == "nobody\n", f"nobody: {r.stdout!r}")
        # Background, listed, killed.
        h = sbx.commands.run("sleep 30", background=True)
        check(any(p.pid == h.pid for p in sbx.commands.list()), "listed")
        check(sbx.commands.kill(h.pid), "killed")
        try:
            h.wait()
            raise AssertionError("a killed command ended well")
        except CommandExitException as e:
            check(e.exit_code != 0, f"killed exit {e.exit_code}")
        check(not any(p.pid == h.pid for p in sbx.commands.list()), "still listed")
        check(not sbx.commands.kill(h.pid), "killed twice")
        # Connect: a second stream of a running command's output.
        h = sbx.commands.run("sleep 1; echo late", background=True)
        h2 = sbx.commands.connect(h.pid)
        check(h2.wait().stdout == "late\n", "connected stream")
        check(h.wait().stdout == "late\n", "first stream")
        # Stdin: sent, then closed (EOF).
        h = sbx.commands.run("read line; echo got $line", background=True, stdin=True)
        sbx.commands.send_stdin(h.pid, "hello\n")
        check(h.wait().stdout == "got hello\n", "stdin line")
        h = sbx.commands.run("cat; echo done", background=True, stdin=True)
        sbx.commands.send_stdin(h.pid, "abc")
        sbx.commands.close_stdin(h.pid)
        check(h.wait().stdout == "abcdone\n", "stdin closed")

        # Files: write/read (text, bytes, relative), list, make_dir, rename, remove.
        w = sbx.files.write("/tmp/a/b.txt", "content")
        check(w.path == "/tmp/a/b.txt" and w.name == "b.txt", f"write {w}")
        check(sbx.files.read("/tmp/a/b.txt") == "content", "read text")
        check(sbx.commands.run("cat /tmp/a/b.txt").stdout == "content", "written inside")
        sbx.files.write("/tmp/a/bin", b"\x00\x01\xff")
        check(bytes(sbx.files.read("/tmp/a/bin", format="bytes")) == b"\x00\x01\xff", "bytes")
        w = sbx.files.write("rel.txt", "rel")
        check(w.path == "/root/rel.txt", f"relative {w}")
        names = sorted(e.name for e in sbx.files.list("/tmp/a"))
        check(names == ["b.txt", "bin"], f"list {names}")
        check(sbx.files.make_dir("/tmp/d"), "make_dir")
        check(not sbx.files.make_dir("/tmp/d"), "make_dir twice")
        i = sbx.files.rename("/tmp/a/b.txt", "/tmp/d/c.txt")
        check(i.path == "/tmp/d/c.txt" and i.name == "c.txt", f"rename {i}")
        check(not sbx.files.exists("/tmp/a/b.txt") and sbx.files.exists("/tmp/d/c.txt"), "moved")
        gi = sbx.files.get_info("/tmp/d/c.txt")
        check(gi.size == 7 and gi.type.value == "file", f"get_info {gi}")
        check(sbx.files.get_info("/tmp/d").type.value == "dir", "dir type")
        sbx.files.remove("/tmp/d")
        check(not sbx.files.exists("/tmp/d/c.txt"), "removed")
        try:
            sbx.files.read("/tmp/none")
            raise AssertionError("read a missing file")
        except NotFoundException:
            pass
        # A gzip upload (the SDK's gzip=True: octet-stream, Content-Encoding: gzip).
        text = "zipped line\n" * 5000
        sbx.files.write("/tmp/gz/big.txt", text, gzip=True)
        check(sbx.files.read("/tmp/gz/big.txt") == text, "gzip upload read back")
        check(sbx.commands.run("wc -c < /tmp/gz/big.txt").stdout.strip() == str(len(text)),
              "gzip upload size inside")
        envd = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token,
                "Content-Type": "application/octet-stream"}
        r = httpx.post(f"{BASE}/files", params={"path": "/tmp/gz/bad"}, content=b"not gzip",
                       headers={**envd, "Content-Encoding": "gzip"})
        check(r.status_code == 400 and "gzip" in r.json()["message"], f"bad gzip: {r.status_code} {r.text}")
        check(not sbx.files.exists("/tmp/gz/bad"), "a bad gzip upload left a file")
        r = httpx.post(f"{BASE}/files", params={"path": "/tmp/gz/br"}, content=b"x",
                       headers={**envd, "Content-Encoding": "br"})
        check(r.status_code == 400, f"br upload: {r.status_code}")

        # List by metadata.
        found = Sandbox.list(query=SandboxQuery(metadata={"suite": nonce})).next_items()
        check([s.sandbox_id for s in found] == [sbx.sandbox_id], f"list {found}")
        none = Sandbox.list(query=SandboxQuery(metadata={"suite": "other"})).next_items()
        check(none == [], f"list other {none}")
        found = Sandbox.list(query=SandboxQuery(metadata={"note": "free form: ok"})).next_items()
        check([s.sandbox_id for s in found] == [sbx.sandbox_id], f"list free-form {found}")
    finally:
        check(sbx.kill(), "kill")
    check(not Sandbox.kill(sbx.sandbox_id), "kill twice")
    check(not sbx.is_running(), "running after kill")
    try:
        Sandbox.get_info(sbx.sandbox_id)
        raise AssertionError("info of a killed sandbox")
    except NotFoundException:
        pass


def list_pages():
    """Sandbox.list: a metadata filter over several sandboxes, paged by `limit` and the
    paginator's next token."""
    nonce = uuid.uuid4().hex[:8]
    made = [Sandbox.create(timeout=120, metadata={"pages": nonce, "i": str(i)}) for i in range(3)]
    try:
        p = Sandbox.list(query=SandboxQuery(metadata={"pages": nonce}), limit=2)
        first = p.next_items()
        check(len(first) == 2 and p.has_next, f"first page {first} next {p.has_next}")
        second = p.next_items()
        check(len(second) == 1 and not p.has_next, f"second page {second} next {p.has_next}")
        ids = [s.sandbox_id for s in first + second]
        check(sorted(ids) == sorted(s.sandbox_id for s in made), f"pages {ids}")
        # Oldest first: the order they were made.
        check(ids == [s.sandbox_id for s in made], f"order {ids}")
        one = Sandbox.list(query=SandboxQuery(metadata={"pages": nonce, "i": "1"})).next_items()
        check([s.sandbox_id for s in one] == [made[1].sandbox_id], f"two keys {one}")
    finally:
        for s in made:
            s.kill()


def pause_connect():
    from e2b import SandboxState

    sbx = Sandbox.create(timeout=120, metadata={"flow": "pause"})
    try:
        sbx.files.write("/tmp/keep", "kept")
        h = sbx.commands.run("sleep 600", background=True)
        check(sbx.pause(), "pause")
        check(not sbx.pause(), "pause twice")
        check(sbx.get_info().state == SandboxState.PAUSED, "paused state")
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        check([s.sandbox_id for s in paused] == [sbx.sandbox_id], f"paused list {paused}")
        back = Sandbox.connect(sbx.sandbox_id)
        check(back.get_info().state == SandboxState.RUNNING, "running again")
        check(back.files.read("/tmp/keep") == "kept", "file kept")
        check(any(p.pid == h.pid for p in back.commands.list()), "process kept")
        check(back.commands.run("echo again").stdout == "again\n", "runs again")
    finally:
        sbx.kill()


def timeout():
    sbx = Sandbox.create(timeout=120)
    end = sbx.get_info().end_at
    sbx.set_timeout(1)
    check(sbx.get_info().end_at < end, "end moved")
    wait_until("the sandbox to expire", 30, lambda: not sbx.is_running())
    found = [s.sandbox_id for s in Sandbox.list().next_items()]
    check(sbx.sandbox_id not in found, f"listed after expiry {found}")


def code():
    from e2b_code_interpreter import Sandbox as CodeSandbox

    sbx = CodeSandbox.create(timeout=120)
    try:
        check(sbx.get_info().template_id == "code-interpreter-v1", "template")
        e = sbx.run_code("x = 40\nprint('hello')\nx + 2")
        check(e.error is None, f"error {e.error}")
        check(e.logs.stdout == ["hello\n"], f"stdout {e.logs.stdout}")
        check([r.text for r in e.results] == ["42"], f"results {e.results}")
        e = sbx.run_code("x * 2")
        check([r.text for r in e.results] == ["80"], f"state kept: {e.results}")
        out = []
        e = sbx.run_code("import sys\nprint('to err', file=sys.stderr)", on_stderr=out.append)
        check(e.logs.stderr == ["to err\n"] and len(out) == 1, f"stderr {e.logs.stderr} {out}")
        e = sbx.run_code("1/0")
        check(e.error is not None and e.error.name == "ZeroDivisionError", f"{e.error}")
        check(e.error.value == "division by zero", f"value {e.error.value}")
        check("ZeroDivisionError" in e.error.traceback, f"traceback {e.error.traceback}")
        # A chart: a display result with its PNG.
        e = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.title('sq')\nplt.show()")
        check(e.error is None, f"chart error {e.error}")
        pngs = [r.png for r in e.results if r.png]
        check(len(pngs) == 1, f"one chart: {e.results}")
        import base64
        check(base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n", "a PNG")
        check("png" in e.results[0].formats(), f"formats {e.results[0].formats()}")
        # Rich forms of the last expression: a DataFrame's HTML table; markdown and JSON of an
        # object's _repr_*_; a _repr_html_ that raises leaves the text.
        e = sbx.run_code("import pandas as pd\npd.DataFrame({'col': [1, 2]})")
        check(e.error is None and len(e.results) == 1, f"dataframe {e.error} {e.results}")
        r = e.results[0]
        check(r.is_main_result and r.html and "<table" in r.html and "col" in r.text,
              f"dataframe result {r}")
        check("html" in r.formats(), f"formats {r.formats()}")
        e = sbx.run_code(
            "class R:\n"
            "    def _repr_markdown_(self): return '**bold**'\n"
            "    def _repr_json_(self): return {'k': 1}\n"
            "    def __repr__(self): return 'R()'\n"
            "class Bad:\n"
            "    def _repr_html_(self): raise ValueError('no')\n"
            "    def __repr__(self): return 'Bad()'\n"
            "R()")
        r = e.results[0]
        check(r.is_main_result and r.markdown == "**bold**" and r.json == {"k": 1}
              and r.text == "R()", f"markdown/json result {r}")
        e = sbx.run_code("Bad()")
        r = e.results[0]
        check(r.text == "Bad()" and not r.html, f"a raising _repr_html_: {r}")
        ctx = sbx.create_code_context()
        e = sbx.run_code("x", context=ctx)
        check(e.error is not None and e.error.name == "NameError", f"own context: {e.error}")
        check(any(c.id == ctx.id for c in sbx.list_code_contexts()), "listed context")
        sbx.remove_code_context(ctx)
        check(not any(c.id == ctx.id for c in sbx.list_code_contexts()), "removed context")
        try:
            sbx.run_code("1", language="javascript")
            raise AssertionError("javascript ran")
        except SandboxException as err:
            check("python only" in str(err), f"{err}")
    finally:
        sbx.kill()


def auth():
    # A wrong or missing API key: 401 from the control plane.
    try:
        Sandbox.create(api_key="wrong-key")
        raise AssertionError("created with a wrong key")
    except AuthenticationException:
        pass
    r = httpx.get(f"{BASE}/v2/sandboxes")
    check(r.status_code == 401, f"no key: {r.status_code}")
    check(isinstance(r.json().get("message"), str), f"json error {r.text}")
    a = Sandbox.create(timeout=60)
    b = Sandbox.create(timeout=60)
    try:
        stat = {"path": "/"}
        url = f"{BASE}/filesystem.Filesystem/Stat"
        ok = httpx.post(url, json=stat, headers={"E2b-Sandbox-Id": b.sandbox_id,
                                                 "X-Access-Token": b._envd_access_token})
        check(ok.status_code == 200, f"own token {ok.status_code} {ok.text}")
        # Another sandbox's token, and none: 401.
        for h in ({"X-Access-Token": a._envd_access_token}, {}):
            r = httpx.post(url, json=stat, headers={"E2b-Sandbox-Id": b.sandbox_id, **h})
            check(r.status_code == 401, f"token {h}: {r.status_code} {r.text}")
            check(r.json()["code"] == "unauthenticated", f"connect error {r.text}")
        # Every envd RPC (unary and streaming), with another sandbox's token: 401 before its body.
        for rpc in ("process.Process/Start", "process.Process/List",
                    "process.Process/SendSignal", "process.Process/Connect",
                    "process.Process/SendInput", "process.Process/StreamInput",
                    "process.Process/CloseStdin", "process.Process/Update",
                    "filesystem.Filesystem/ListDir", "filesystem.Filesystem/MakeDir",
                    "filesystem.Filesystem/Move", "filesystem.Filesystem/Remove",
                    "filesystem.Filesystem/WatchDir", "filesystem.Filesystem/CreateWatcher",
                    "filesystem.Filesystem/GetWatcherEvents",
                    "filesystem.Filesystem/RemoveWatcher"):
            r = httpx.post(f"{BASE}/{rpc}", json={},
                           headers={"E2b-Sandbox-Id": b.sandbox_id,
                                    "X-Access-Token": a._envd_access_token})
            check(r.status_code == 401 and r.json()["code"] == "unauthenticated",
                  f"{rpc} with another token: {r.status_code} {r.text}")
        r = httpx.get(f"{BASE}/files", params={"path": "/etc/hostname"},
                      headers={"E2b-Sandbox-Id": b.sandbox_id,
                               "X-Access-Token": a._envd_access_token})
        check(r.status_code == 401, f"/files with another token: {r.status_code}")
        # The two sandboxes are apart.
        a.files.write("/tmp/mine", "a")
        check(not b.files.exists("/tmp/mine"), "a's file seen in b")
        # Bad input: 4xx JSON errors.
        h = {"X-API-Key": KEY, "Content-Type": "application/json"}
        for body in ("{", '{"templateID": ""}', '{"templateID": "base", "timeout": -1}'):
            r = httpx.post(f"{BASE}/v2/sandboxes", content=body, headers=h)
            check(r.status_code == 400 and "message" in r.json(), f"{body}: {r.status_code}")
        r = httpx.post(f"{BASE}/v2/sandboxes", json={"templateID": "no-such-image"}, headers=h)
        check(r.status_code == 400 and "no-such-image" in r.json()["message"], f"{r.text}")
        envd = {"E2b-Sandbox-Id": b.sandbox_id, "X-Access-Token": b._envd_access_token}
        js = {**envd, "Content-Type": "application/json"}
        r = httpx.post(url, content=b"{", headers=js)
        check(r.status_code == 400 and r.json()["code"] == "invalid_argument", f"{r.text}")
        # Every unary RPC: a Connect error for a bad message, never a 5xx.
        for rpc, body in [
            ("filesystem.Filesystem/Stat", {}),
            ("filesystem.Filesystem/ListDir", {"path": "/etc/hostname"}),
            ("filesystem.Filesystem/MakeDir", {"path": ""}),
            ("filesystem.Filesystem/Move", {"source": "/nope", "destination": "/tmp/x"}),
            ("filesystem.Filesystem/Remove", {"path": "/nope"}),
            ("filesystem.Filesystem/Stat", {"path": "relative/../../../../etc/shadow-none"}),
            ("process.Process/SendSignal", {"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"}),
            ("process.Process/SendSignal", {"process": {"pid": 1}, "signal": "SIGNAL_SIGHUP"}),
            ("process.Process/SendInput", {"process": {"pid": 999999}, "input": {"stdin": "eA=="}}),
            ("process.Process/CloseStdin", {}),
            ("process.Process/Update", {}),
            ("filesystem.Filesystem/CreateWatcher", {}),
            ("filesystem.Filesystem/CreateWatcher", {"path": "/etc/hostname"}),
            ("filesystem.Filesystem/CreateWatcher", {"path": "/no/such/dir"}),
            ("filesystem.Filesystem/GetWatcherEvents", {"watcherId": "nope"}),
            ("filesystem.Filesystem/RemoveWatcher", {}),
        ]:
            r = httpx.post(f"{BASE}/{rpc}", json=body, headers=envd)
            check(400 <= r.status_code < 500 or r.status_code == 501, f"{rpc} {body}: {r.status_code} {r.text}")
            check(isinstance(r.json().get("code"), str), f"{rpc}: not a Connect error: {r.text}")
        # Compressed requests: gzip is taken, bad gzip data and other encodings are refused.
        import gzip as gz
        r = httpx.post(url, content=gz.compress(b'{"path": "/"}'),
                       headers={**envd, "Content-Type": "application/json", "Content-Encoding": "gzip"})
        check(r.status_code == 200 and r.json()["entry"]["path"] == "/", f"gzip unary: {r.text}")
        for enc, body, code in (("gzip", b"not gzip", "invalid_argument"), ("br", b"{}", "unimplemented")):
            r = httpx.post(url, content=body, headers={**envd, "Content-Type": "application/json",
                                                       "Content-Encoding": enc})
            check(400 <= r.status_code < 500 or r.status_code == 501, f"{enc}: {r.status_code} {r.text}")
            check(r.json()["code"] == code, f"{enc}: {r.text}")
        # A streaming RPC: its errors end the stream (status 200, end-of-stream envelope).
        import struct
        bad_start = [b"", b"\x00\x00\x00\x00\x09{}", struct.pack(">BI", 0, 2) + b"{}",
                     struct.pack(">BI", 1, 2) + b"{}", struct.pack(">BI", 0, 0xFFFFFFFF)]
        for rpc, bodies in (("process.Process/Start", bad_start),
                            ("filesystem.Filesystem/WatchDir", bad_start)):
            for body in bodies:
                r = httpx.post(f"{BASE}/{rpc}", content=body,
                               headers={**envd, "Content-Type": "application/connect+json"})
                check(r.status_code == 200 and r.content[:1] == b"\x02", f"{rpc} {body!r}: {r.status_code} {r.content!r}")
                err = json.loads(r.content[5:])["error"]
                check(err["code"] in ("invalid_argument", "unimplemented", "resource_exhausted"),
                      f"{rpc} {body!r}: {err}")
        r = httpx.post(f"{BASE}/v2/sandboxes/none/connect", json={}, headers=h)
        check(r.status_code == 404, f"connect to none: {r.status_code}")
        r = httpx.post(f"{BASE}/sandboxes/{b.sandbox_id}/timeout", json={"timeout": "x"}, headers=h)
        check(r.status_code == 400, f"bad timeout: {r.status_code}")
        r = httpx.get(f"{BASE}/v2/sandboxes", params={"limit": "0"}, headers=h)
        check(r.status_code == 400, f"bad limit: {r.status_code}")
        r = httpx.post(f"{BASE}/execute", json={"code": "1", "env_vars": {"A=B": "1"}}, headers=envd)
        check(r.status_code == 400 and "message" in r.json(), f"execute env_vars: {r.text}")
        r = httpx.get(f"{BASE}/files", headers=envd)
        check(r.status_code == 400, f"/files without path: {r.status_code}")
    finally:
        a.kill()
        b.kill()


def async_flow():
    import asyncio

    from e2b_code_interpreter import AsyncSandbox

    async def main():
        sbx = await AsyncSandbox.create(timeout=120, metadata={"flow": "async"})
        try:
            r = await sbx.commands.run("echo $((6*7))")
            check(r.stdout == "42\n", f"async run {r.stdout!r}")
            seen = []
            await sbx.commands.run("echo a; echo b >&2", on_stdout=seen.append,
                                   on_stderr=seen.append)
            check(sorted(seen) == ["a\n", "b\n"], f"async callbacks {seen}")
            await sbx.files.write("/tmp/async.txt", "async")
            check(await sbx.files.read("/tmp/async.txt") == "async", "async read")
            check([e.name for e in await sbx.files.list("/tmp") if e.name == "async.txt"]
                  == ["async.txt"], "async list")
            e = await sbx.run_code("y = 5")
            e = await sbx.run_code("y + 1")
            check([x.text for x in e.results] == ["6"], f"async run_code {e.results}")
            found = await AsyncSandbox.list(query=SandboxQuery(metadata={"flow": "async"})).next_items()
            check([s.sandbox_id for s in found] == [sbx.sandbox_id], f"async list {found}")
        finally:
            await sbx.kill()
        check(not await sbx.is_running(), "async running after kill")

    asyncio.run(main())


def escape():
    """The file API (envd's filesystem RPCs and /files) acts inside the sandbox only: `..`,
    symlinks made inside (absolute, relative, to `/`, `/proc/1/root`), moves, removes and
    directory listings never reach the host; host pseudo files are not written; FIFOs and
    devices are refused, never hang. E2B_HOST_SECRET / E2B_HOST_PROBE: a host file with a
    secret, and a host path that must not appear."""
    secret_path = os.environ["E2B_HOST_SECRET"]
    probe = os.environ["E2B_HOST_PROBE"]
    secret = open(secret_path).read()
    sbx = Sandbox.create(timeout=120)
    try:
        fs = sbx.files
        fs.write("/../../../../.." + probe, "escaped?")
        check(not os.path.exists(probe), "a write with .. reached the host")
        check(fs.read(probe) == "escaped?", "the .. write landed inside the sandbox")
        fs.write("../../../../.." + probe + ".rel", "escaped?")
        check(not os.path.exists(probe + ".rel"), "a relative write with .. reached the host")
        r = sbx.commands.run(
            f"mkdir -p /tmp/l && ln -s / /tmp/l/root && ln -s {secret_path} /tmp/l/abs && "
            f"ln -s ../../../../../../..{secret_path} /tmp/l/rel && ln -s /proc/1/root /tmp/l/magic"
        )
        check(r.exit_code == 0, f"symlinks: {r.stderr}")
        paths = ["/tmp/l/abs", "/tmp/l/rel", "/tmp/l/root" + secret_path, secret_path,
                 "/proc/self/root" + secret_path, "/tmp/l/magic" + secret_path,
                 "/proc/1/root" + secret_path]
        for p in paths:
            try:
                got = fs.read(p)
            except SandboxException:
                continue
            check(secret not in got, f"host secret read through {p}")
        # Through the HTTP route directly too (the SDK's read is this GET).
        envd = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token}
        for p in paths:
            r = httpx.get(f"{BASE}/files", params={"path": p}, headers=envd)
            check(secret not in r.text, f"host secret read through GET /files {p}")
        parent = os.path.dirname(secret_path)
        for p in ["/tmp/l/root" + parent, "/proc/1/root" + parent, "/../../.." + parent]:
            try:
                names = [e.name for e in fs.list(p)]
            except SandboxException:
                continue
            check(os.path.basename(secret_path) not in names, f"host dir listed through {p}: {names}")
        for p in ["/tmp/l/abs", "/tmp/l/root" + probe, "/proc/self/root" + probe,
                  "/tmp/l/magic" + probe]:
            try:
                fs.write(p, "escaped?")
            except SandboxException:
                pass
            check(not os.path.exists(probe), f"a write through {p} reached the host")
            try:
                fs.make_dir(p + ".d")
            except SandboxException:
                pass
            check(not os.path.exists(probe + ".d"), f"make_dir through {p} reached the host")
        check(open(secret_path).read() == secret, "host secret modified")
        for p in ["/proc/sys/kernel/hostname", "/sys/kernel/mm/transparent_hugepage/enabled"]:
            before = open(p).read() if os.path.exists(p) else None
            try:
                fs.write(p, "pwned\n")
            except SandboxException:
                pass
            if before is not None:
                check(open(p).read() == before, f"host {p} changed")
        fs.write("/tmp/m.txt", "m")
        try:
            fs.rename("/tmp/m.txt", "/../../.." + probe)
        except SandboxException:
            pass
        check(not os.path.exists(probe), "a rename reached the host")
        for p in ["/../../../.." + secret_path, "/tmp/l/abs/", "/tmp/l/root" + secret_path,
                  "/tmp/l/magic" + secret_path]:
            try:
                fs.remove(p)
            except SandboxException:
                pass
        try:
            fs.remove("/tmp/l/root/etc")
        except SandboxException:
            pass
        check(os.path.exists(secret_path), "a remove reached the host")
        check(os.path.exists("/etc/passwd"), "host /etc touched")
        sbx.commands.run("mkfifo /tmp/fifo")
        for p in ["/tmp/fifo", "/dev/zero"]:
            t0 = time.time()
            try:
                fs.read(p, format="bytes", request_timeout=30)
                raise AssertionError(f"{p} was read")
            except SandboxException:
                pass
            check(time.time() - t0 < 20, f"reading {p} hung")
    finally:
        sbx.kill()


def watch():
    """files.watch_dir: the sync SDK's polled watcher (CreateWatcher, GetWatcherEvents,
    RemoveWatcher), recursive, errors; the async SDK's stream (WatchDir)."""
    import asyncio

    from e2b import AsyncSandbox, FilesystemEventType as T

    def collect(h, want, what):
        got = []

        def done():
            got.extend((e.type, e.name) for e in h.get_new_events())
            return all(w in got for w in want)
        wait_until(f"{what}: {want} (got {got})", 30, done)
        return got

    sbx = Sandbox.create(timeout=120)
    other = Sandbox.create(timeout=120)
    try:
        check(sbx.files.make_dir("/tmp/w"), "make_dir")
        h = sbx.files.watch_dir("/tmp/w")
        sbx.files.write("/tmp/w/a.txt", "x")
        r = sbx.commands.run("echo more >> /tmp/w/a.txt && chmod 600 /tmp/w/a.txt && "
                             "mv /tmp/w/a.txt /tmp/w/b.txt && rm /tmp/w/b.txt")
        check(r.exit_code == 0, f"changes: {r.stderr}")
        got = collect(h, [(T.CREATE, "a.txt"), (T.WRITE, "a.txt"), (T.CHMOD, "a.txt"),
                          (T.RENAME, "a.txt"), (T.CREATE, "b.txt"), (T.REMOVE, "b.txt")], "events")
        check(got.index((T.CREATE, "a.txt")) < got.index((T.REMOVE, "b.txt")), f"order {got}")
        # Outside the watched directory: nothing.
        sbx.files.write("/tmp/elsewhere.txt", "x")
        sbx.files.write("/tmp/w/marker", "x")
        got = collect(h, [(T.CREATE, "marker")], "marker")
        check(not any("elsewhere" in n for _, n in got), f"an event from outside: {got}")
        # Another sandbox cannot read or remove this watcher.
        envd = {"E2b-Sandbox-Id": other.sandbox_id, "X-Access-Token": other._envd_access_token}
        for rpc in ("GetWatcherEvents", "RemoveWatcher"):
            r = httpx.post(f"{BASE}/filesystem.Filesystem/{rpc}", json={"watcherId": h._watcher_id},
                           headers=envd)
            check(r.status_code == 404 and r.json()["code"] == "not_found",
                  f"{rpc} from another sandbox: {r.status_code} {r.text}")
        h.stop()
        try:
            h.get_new_events()
            raise AssertionError("events of a stopped watcher")
        except SandboxException:
            pass
        own = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token}
        r = httpx.post(f"{BASE}/filesystem.Filesystem/GetWatcherEvents",
                       json={"watcherId": h._watcher_id}, headers=own)
        check(r.status_code == 404, f"a removed watcher: {r.status_code} {r.text}")
        # Recursive: directories below, and those made later.
        sbx.commands.run("mkdir -p /tmp/w/old")
        h = sbx.files.watch_dir("/tmp/w", recursive=True)
        sbx.files.write("/tmp/w/old/in-old.txt", "x")
        sbx.files.make_dir("/tmp/w/new")
        collect(h, [(T.CREATE, "old/in-old.txt"), (T.CREATE, "new")], "recursive")
        sbx.files.write("/tmp/w/new/in-new.txt", "x")
        collect(h, [(T.CREATE, "new/in-new.txt")], "a directory made after the start")
        h.stop()
        # Errors: no such directory, a file.
        for p, exc in (("/tmp/none", NotFoundException), ("/tmp/w/marker", SandboxException)):
            try:
                sbx.files.watch_dir(p)
                raise AssertionError(f"watched {p}")
            except exc:
                pass
        sandbox_id = sbx.sandbox_id
    finally:
        sbx.kill()
        other.kill()

    async def main():
        a = await AsyncSandbox.create(timeout=120)
        try:
            await a.files.make_dir("/tmp/aw")
            seen = []
            h = await a.files.watch_dir("/tmp/aw", on_event=lambda e: seen.append((e.type, e.name)))
            await a.files.write("/tmp/aw/x.txt", "x")
            await a.commands.run("rm /tmp/aw/x.txt")
            deadline = time.time() + 30
            while not ((T.CREATE, "x.txt") in seen and (T.REMOVE, "x.txt") in seen):
                check(time.time() < deadline, f"async events: {seen}")
                await asyncio.sleep(0.1)
            await h.stop()
            # A watch with no time limit ends with its sandbox: of its own directory, and of
            # one bound from the host (/usr of the host image, whose inode outlives it).
            ended = []
            for d in ("/tmp/aw", "/usr/bin"):
                await a.files.watch_dir(d, on_event=lambda e: None, on_exit=ended.append,
                                        timeout=0)
            await a.kill()
            deadline = time.time() + 15
            while len(ended) < 2:
                check(time.time() < deadline, "a watch outlived its sandbox")
                await asyncio.sleep(0.1)
        finally:
            await a.kill()

    asyncio.run(main())
    check(sandbox_id, "ran")


def raw(method, path, body=None, key=None):
    """A control plane request as a plain HTTP client sends it: (status, JSON answer)."""
    r = httpx.request(method, BASE + path, json=body,
                      headers={"X-API-Key": KEY if key is None else key}, timeout=60)
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, r.text


def check_4xx_json(status, answer, code, what):
    check(status == code and isinstance(answer, dict) and answer.get("code") == code
          and answer.get("message"), f"{what}: {status} {answer}")


def snapshots():
    """create_snapshot -> list_snapshots -> Sandbox.create(snapshot_id) -> fork ->
    delete_snapshot, with the files each sandbox sees, and bad input to the routes."""
    nonce = uuid.uuid4().hex[:8]
    src = Sandbox.create(timeout=120, metadata={"snap": nonce})
    other = Sandbox.create(timeout=120)
    made = []
    try:
        src.files.write("/root/kept.txt", "before " + nonce)
        t0 = time.monotonic()
        info = src.create_snapshot(name=f"n-{nonce}")
        print(f"SNAPSHOT_MS={(time.monotonic() - t0) * 1000:.1f}", flush=True)
        check(info.snapshot_id.startswith("snap-"), f"snapshot id {info}")
        check(info.names == [f"n-{nonce}"], f"names {info}")
        # Written after the snapshot: not in it; the source runs on.
        src.files.write("/root/after.txt", "after")
        check(src.commands.run("cat /root/kept.txt").stdout == "before " + nonce, "source runs")

        listed = Sandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items()
        check([s.snapshot_id for s in listed] == [info.snapshot_id], f"listed {listed}")
        mine = src.list_snapshots().next_items()
        check([s.snapshot_id for s in mine] == [info.snapshot_id], f"src.list_snapshots {mine}")
        by_name = Sandbox.list_snapshots(name=f"n-{nonce}").next_items()
        check([s.snapshot_id for s in by_name] == [info.snapshot_id], f"by name {by_name}")
        check(Sandbox.list_snapshots(sandbox_id=other.sandbox_id).next_items() == [],
              "another sandbox's snapshots")

        t0 = time.monotonic()
        new = Sandbox.create(info.snapshot_id, timeout=120)
        print(f"RESTORE_MS={(time.monotonic() - t0) * 1000:.1f}", flush=True)
        made.append(new)
        check(new.sandbox_id != src.sandbox_id, "a new sandbox")
        check(new.files.read("/root/kept.txt") == "before " + nonce, "file from the snapshot")
        check(not new.files.exists("/root/after.txt"), "a file written after the snapshot")
        check(new.get_info().template_id == info.snapshot_id, "template of a restored sandbox")
        check(new.commands.run("echo restored").stdout == "restored\n", "runs")
        # By its name too (the newest of that name).
        named = Sandbox.create(f"n-{nonce}", timeout=60)
        made.append(named)
        check(named.files.read("/root/kept.txt") == "before " + nonce, "made by the name")
        check(named.get_info().template_id == f"n-{nonce}", "template of a named restore")
        st, ans = raw("POST", "/v2/sandboxes", {"templateID": f"no-such-{nonce}"})
        check_4xx_json(st, ans, 400, "create from no image nor snapshot name")
        new.files.write("/root/kept.txt", "changed in the copy")
        check(src.files.read("/root/kept.txt") == "before " + nonce, "copy changed the source")
        # A sandbox not made from it sees nothing of it.
        check(not other.files.exists("/root/kept.txt"), "another sandbox sees the file")

        t0 = time.monotonic()
        forks = src.fork(count=2, timeout=60)
        print(f"FORK2_MS={(time.monotonic() - t0) * 1000:.1f}", flush=True)
        check(len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), f"forks {forks}")
        made.extend(forks)
        a, b = forks
        check(len({a.sandbox_id, b.sandbox_id, src.sandbox_id}) == 3, "fork ids")
        for f in forks:
            check(f.files.read("/root/after.txt") == "after", "fork has the files")
            check(f.get_info().metadata.get("snap") == nonce, "fork keeps metadata")
            check(f.get_info().end_at < src.get_info().end_at, "fork timeout")
        a.files.write("/root/only-a", "a")
        check(not b.files.exists("/root/only-a"), "a fork sees its sibling's file")
        check(not src.files.exists("/root/only-a"), "the source sees a fork's file")

        # Bad input: 4xx JSON errors.
        sid = src.sandbox_id
        for body in ({"memory": True}, {"name": ""}, {"name": "x" * 300}, {"nope": 1}):
            st, ans = raw("POST", f"/sandboxes/{sid}/snapshots", body)
            check_4xx_json(st, ans, 400, f"snapshot body {body}")
        st, ans = raw("POST", "/sandboxes/nosuch/snapshots", {})
        check_4xx_json(st, ans, 404, "snapshot of no sandbox")
        try:
            Sandbox.create_snapshot("nosuch")
            raise AssertionError("snapshot of no sandbox did not raise")
        except NotFoundException:
            pass
        for body in ({"count": 0}, {"count": 21}, {"count": "2"}, {"timeout": 0}):
            st, ans = raw("POST", f"/sandboxes/{sid}/fork", body)
            check_4xx_json(st, ans, 400, f"fork body {body}")
        st, ans = raw("POST", "/sandboxes/nosuch/fork", {"count": 1})
        check_4xx_json(st, ans, 404, "fork of no sandbox")
        for q in ("limit=0", "limit=5000", "nextToken=x"):
            st, ans = raw("GET", f"/snapshots?{q}")
            check_4xx_json(st, ans, 400, f"list {q}")
        st, ans = raw("GET", "/snapshots", key="wrong")
        check_4xx_json(st, ans, 401, "list with a wrong key")
        st, ans = raw("POST", f"/sandboxes/{sid}/snapshots", {}, key="wrong")
        check_4xx_json(st, ans, 401, "snapshot with a wrong key")
        st, ans = raw("POST", "/v2/sandboxes", {"templateID": "snap-" + "0" * 32})
        check_4xx_json(st, ans, 404, "create from no such snapshot")
        # A paused sandbox is not snapshotted or forked (409).
        other.pause()
        st, ans = raw("POST", f"/sandboxes/{other.sandbox_id}/snapshots", {})
        check_4xx_json(st, ans, 409, "snapshot of a paused sandbox")
        st, ans = raw("POST", f"/sandboxes/{other.sandbox_id}/fork", {})
        check_4xx_json(st, ans, 409, "fork of a paused sandbox")

        check(Sandbox.delete_snapshot(info.snapshot_id) is True, "delete")
        check(Sandbox.delete_snapshot(info.snapshot_id) is False, "delete twice")
        check(Sandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items() == [],
              "listed after delete")
        st, ans = raw("POST", "/v2/sandboxes", {"templateID": info.snapshot_id})
        check_4xx_json(st, ans, 404, "create from a deleted snapshot")
        check(new.commands.run("cat /root/kept.txt").stdout == "changed in the copy",
              "a sandbox made from a deleted snapshot runs on")
    finally:
        for s in made + [src, other]:
            try:
                s.kill()
            except Exception:
                pass


def snapshot_for_other_key():
    """Makes a snapshot with this key; prints its id (SNAPSHOT=...)."""
    src = Sandbox.create(timeout=120)
    try:
        src.files.write("/root/secret.txt", "mine")
        info = src.create_snapshot()
        print(f"SNAPSHOT={info.snapshot_id}", flush=True)
    finally:
        src.kill()


def other_key_snapshot():
    """Another API key: the snapshot is not listed, not made into a sandbox, not deleted."""
    sid = os.environ["E2B_SNAPSHOT_ID"]
    check(Sandbox.list_snapshots().next_items() == [], "listed for another key")
    st, ans = raw("POST", "/v2/sandboxes", {"templateID": sid})
    check_4xx_json(st, ans, 404, "create from another key's snapshot")
    try:
        Sandbox.create(sid)
        raise AssertionError("create from another key's snapshot did not raise")
    except SandboxException:
        pass
    check(Sandbox.delete_snapshot(sid) is False, "deleted another key's snapshot")


def owner_key_snapshot():
    """The key that made it: restore (the file is there), then delete it."""
    sid = os.environ["E2B_SNAPSHOT_ID"]
    s = Sandbox.create(sid, timeout=60)
    try:
        check(s.files.read("/root/secret.txt") == "mine", "owner's restore")
    finally:
        s.kill()
    check(Sandbox.delete_snapshot(sid) is True, "owner deletes")


def pause_filesystem():
    """pause(mode="filesystem"): files kept, processes not; connect brings it back, same id."""
    from e2b import SandboxState

    sbx = Sandbox.create(timeout=120, metadata={"flow": "pause-fs"})
    try:
        sbx.files.write("/root/keep", "kept")
        h = sbx.commands.run("sleep 600", background=True)
        check(sbx.pause(mode="filesystem"), "pause to disk")
        check(not sbx.pause(mode="filesystem"), "pause twice")
        check(sbx.get_info().state == SandboxState.PAUSED, "paused state")
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        check([s.sandbox_id for s in paused] == [sbx.sandbox_id], f"paused list {paused}")
        check(Sandbox.list_snapshots().next_items() == [], "a pause's snapshot is listed")
        back = Sandbox.connect(sbx.sandbox_id)
        check(back.sandbox_id == sbx.sandbox_id, "same id")
        check(back.get_info().state == SandboxState.RUNNING, "running again")
        check(back.files.read("/root/keep") == "kept", "file kept")
        check(not any(p.pid == h.pid for p in back.commands.list()), "process kept")
        check(back.commands.run("echo again").stdout == "again\n", "runs again")
        check(back.get_info().metadata.get("flow") == "pause-fs", "metadata kept")
        st, ans = raw("POST", f"/sandboxes/{sbx.sandbox_id}/pause", {"memory": "no"})
        check_4xx_json(st, ans, 400, "pause body")
        # Killed while paused to disk: gone, its files with it (the test checks the store).
        other = Sandbox.create(timeout=120)
        other.files.write("/root/gone", "x")
        check(other.pause(mode="filesystem"), "pause another to disk")
        other.kill()
        try:
            Sandbox.get_info(other.sandbox_id)
            raise AssertionError("a killed paused sandbox is still there")
        except NotFoundException:
            pass
    finally:
        sbx.kill()


def metrics():
    """get_metrics: the sandbox's own CPU and memory, from its cgroup."""
    busy = Sandbox.create(timeout=120)
    idle = Sandbox.create(timeout=120)
    try:
        busy.commands.run(
            "python3 -c 'x = bytearray(96 << 20)\nwhile True: x[0] = 1'",
            background=True)
        got = {}

        def hot():
            m = busy.get_metrics()
            check(len(m) == 1, f"one sample: {m}")
            got["m"] = m[0]
            return m[0].cpu_used_pct > 20 and m[0].mem_used > 90 << 20

        wait_until(f"the busy sandbox's metrics ({got})", 30, hot)
        m = got["m"]
        check(m.cpu_count >= 1 and m.mem_total >= m.mem_used, f"busy {m}")
        check(m.disk_total > 0, f"disk {m}")
        i = idle.get_metrics()[0]
        check(i.mem_used < 64 << 20, f"idle sandbox charged with the busy one's memory: {i}")
        # Only this sandbox's CPU (the idle one's since its previous sample).
        wait_until("an idle sample", 10, lambda: idle.get_metrics()[0].cpu_used_pct < 10)
        st, ans = raw("GET", f"/sandboxes/metrics?sandbox_ids={busy.sandbox_id},{idle.sandbox_id},nosuch")
        check(st == 200 and set(ans["sandboxes"]) == {busy.sandbox_id, idle.sandbox_id},
              f"metrics of many: {st} {ans}")
        check(ans["sandboxes"][busy.sandbox_id]["memUsed"] > 90 << 20, f"many: {ans}")
        # Bad input.
        try:
            Sandbox.get_metrics("nosuch")
            raise AssertionError("metrics of no sandbox did not raise")
        except NotFoundException:
            pass
        for q in ("start=10&end=5", "start=x", "end=-1"):
            st, ans = raw("GET", f"/sandboxes/{busy.sandbox_id}/metrics?{q}")
            check_4xx_json(st, ans, 400, f"metrics {q}")
        for q in ("", "sandbox_ids=", "sandbox_ids=" + ",".join(["a"] * 101)):
            st, ans = raw("GET", f"/sandboxes/metrics?{q}")
            check_4xx_json(st, ans, 400, f"metrics of many {q!r}")
        st, ans = raw("GET", f"/sandboxes/{busy.sandbox_id}/metrics", key="wrong")
        check_4xx_json(st, ans, 401, "metrics with a wrong key")
        idle.pause()
        check(idle.get_metrics() == [], "a paused sandbox has no sample")
    finally:
        busy.kill()
        idle.kill()


FETCH = r"""
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=15)
    print("status", r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print("status", e.code, e.read().decode().strip())
except Exception as e:
    print("failed", type(e).__name__)
"""


def upstream():
    """A loopback HTTP server on the host (the test's stand-in for a host on the internet):
    (its port, the paths it served)."""
    import http.server
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
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
    return srv.server_address[1], seen


def network():
    """network allow_out / deny_out and allow_internet_access onto the egress allowlist
    proxy: an allowed host answers, a denied one is refused and never reached."""
    import shlex

    port, seen = upstream()

    def fetch(sbx, url):
        return sbx.commands.run(f"python3 -c {shlex.quote(FETCH)} {shlex.quote(url)}").stdout.strip()

    made = []
    try:
        # Only 127.0.0.1 (by address): the same server by another name is denied.
        a = Sandbox.create(timeout=120, network={"allow_out": ["127.0.0.1"],
                                                 "deny_out": ["0.0.0.0/0"]})
        made.append(a)
        r = fetch(a, f"http://127.0.0.1:{port}/allowed")
        check(r == "status 200 upstream says /allowed", f"allowed host: {r!r}")
        r = fetch(a, f"http://localhost:{port}/denied-a")
        check(r.startswith("status 403"), f"denied host answered: {r!r}")
        r = fetch(a, "http://example.com/")
        check(r.startswith("status 403"), f"a host not in allow_out: {r!r}")
        check(not a.get_info().allow_internet_access, "allowInternetAccess of an allowlist")
        # update_network replaces the rules at once: now only example.invalid.
        a.update_network({"allow_out": ["example.invalid"], "deny_out": ["0.0.0.0/0"]})
        r = fetch(a, f"http://127.0.0.1:{port}/denied-a")
        check(r.startswith("status 403"), f"denied by the update: {r!r}")
        r = fetch(a, "http://example.invalid/")
        check(r.startswith("status 502") and "cannot resolve" in r, f"allowed by the update: {r!r}")
        # A fork carries the rules in force.
        (fa,) = a.fork(count=1)
        made.append(fa)
        r = fetch(fa, f"http://127.0.0.1:{port}/denied-a")
        check(r.startswith("status 403"), f"fork's denial: {r!r}")
        r = fetch(fa, "http://example.invalid/")
        check(r.startswith("status 502"), f"fork's rules: {r!r}")
        a.update_network({"allow_out": ["127.0.0.1"], "deny_out": ["0.0.0.0/0"]})
        r = fetch(a, f"http://127.0.0.1:{port}/updated")
        check(r == "status 200 upstream says /updated", f"allowed again: {r!r}")
        for body in ({"allowOut": ["10.0.0.0/8"]}, {"allowInternetAccess": "yes"}, [1],
                     {"denyOut": ["x" * 300]}):
            st, ans = raw("PUT", f"/sandboxes/{a.sandbox_id}/network", body)
            check_4xx_json(st, ans, 400, f"update_network {body}")
        st, ans = raw("PUT", "/sandboxes/nosuch/network", {})
        check_4xx_json(st, ans, 404, "update_network of no sandbox")

        # Everything but localhost (the host's own addresses only when named: 127.0.0.1).
        b = Sandbox.create(timeout=120, network={"allow_out": ["127.0.0.1"],
                                                 "deny_out": ["localhost"]})
        made.append(b)
        r = fetch(b, f"http://localhost:{port}/denied-b")
        check(r.startswith("status 403"), f"deny_out host answered: {r!r}")
        r = fetch(b, f"http://127.0.0.1:{port}/open")
        check(r == "status 200 upstream says /open", f"not denied: {r!r}")

        r = fetch(b, "http://example.invalid/")
        check(r.startswith("status 502") and "cannot resolve" in r,
              f"not denied, so looked up: {r!r}")

        # allow_internet_access=True: any host, but the host's own addresses only when a
        # rule names them (agentrun's egress proxy refuses host-internal addresses).
        c = Sandbox.create(timeout=120, allow_internet_access=True)
        made.append(c)
        r = fetch(c, f"http://localhost:{port}/internal")
        check(r.startswith("status 403") and "host-internal" in r, f"internal address: {r!r}")
        r = fetch(c, "http://example.invalid/")
        check(r.startswith("status 502") and "cannot resolve" in r, f"internet access: {r!r}")
        check(c.get_info().allow_internet_access, "allowInternetAccess")
        c2 = Sandbox.create(timeout=120, allow_internet_access=True,
                            network={"allow_out": ["127.0.0.1"]})
        made.append(c2)
        r = fetch(c2, f"http://127.0.0.1:{port}/internet")
        check(r == "status 200 upstream says /internet", f"named internal address: {r!r}")

        # allow_internet_access=False (and agentrun's default): no network at all.
        for d in (Sandbox.create(timeout=120, allow_internet_access=False), Sandbox.create(timeout=120)):
            made.append(d)
            r = fetch(d, f"http://127.0.0.1:{port}/none")
            check(r.startswith("failed"), f"a sandbox without network reached the host: {r!r}")
            st, ans = raw("PUT", f"/sandboxes/{d.sandbox_id}/network", {"allowOut": ["127.0.0.1"]})
            check_4xx_json(st, ans, 409, "update_network of a sandbox without network")

        check(not {"/denied-a", "/denied-b", "/none", "/internal"} & set(seen),
              f"a denied request reached the server: {seen}")
        check({"/allowed", "/open", "/internet", "/updated"} <= set(seen),
              f"served: {seen}")

        # Bad input: 400 JSON.
        for net in ({"allowOut": ["10.0.0.0/8"]}, {"allowOut": "a.test"},
                    {"denyOut": [""]}, {"rules": {"a.test": []}}, {"egressProxy": {"url": "x"}},
                    {"allowOut": [f"h{i}.test" for i in range(300)]}, ["a.test"]):
            st, ans = raw("POST", "/v2/sandboxes", {"templateID": "base", "network": net})
            check_4xx_json(st, ans, 400, f"network {net}")
        try:
            Sandbox.create(timeout=30, network={"allow_out": ["10.0.0.0/8"]})
            raise AssertionError("a CIDR allow_out did not raise")
        except SandboxException as e:
            check("CIDR" in str(e), f"error names CIDR: {e}")
    finally:
        for s in made:
            s.kill()


def code_env_restart():
    """run_code(envs=...) for that execution only; restart_code_context clears its state,
    same id; bad input 4xx."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    sbx = CodeSandbox.create(timeout=120, envs={"BASE": "sandbox"})
    try:
        ex = sbx.run_code("import os; (os.environ.get('PER_RUN'), os.environ['BASE'])",
                          envs={"PER_RUN": "yes", "BASE": "overridden"})
        check(ex.error is None and ex.text == "('yes', 'overridden')", f"envs: {ex}")
        ex = sbx.run_code("(os.environ.get('PER_RUN'), os.environ['BASE'])")
        check(ex.text == "(None, 'sandbox')", f"envs after the execution: {ex}")
        # A subprocess of the execution sees them too.
        ex = sbx.run_code("import subprocess; subprocess.run(['sh', '-c', 'echo $PER_RUN'], "
                          "capture_output=True, text=True).stdout", envs={"PER_RUN": "child"})
        check(ex.text == "'child\\n'", f"a subprocess's env: {ex}")

        ctx = sbx.create_code_context(cwd="/tmp")
        sbx.run_code("x = 41", context=ctx)
        check(sbx.run_code("x + 1", context=ctx).text == "42", "context state")
        sbx.restart_code_context(ctx)
        ex = sbx.run_code("x", context=ctx)
        check(ex.error is not None and ex.error.name == "NameError", f"state after restart: {ex}")
        check(sbx.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'",
              "cwd after restart")
        check([c.id for c in sbx.list_code_contexts()].count(ctx.id) == 1, "same id, once")
        # The default context is untouched by another's restart.
        sbx.run_code("kept = 1")
        sbx.restart_code_context(ctx.id)
        check(sbx.run_code("kept").text == "1", "default context kept")

        # Bad input.
        tok = sbx._envd_access_token
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999",
                   "X-Access-Token": tok, "E2B-Traffic-Access-Token": tok}
        r = httpx.post(f"{BASE}/contexts/nosuch/restart", headers=headers)
        check_4xx_json(r.status_code, r.json(), 404, "restart of no context")
        for env in ({"": "x"}, {"A=B": "x"}, {"A": "x\u0000y"}, {f"V{i}": "x" for i in range(300)},
                    {"A": "x" * (33 << 10)}):
            r = httpx.post(f"{BASE}/execute", headers=headers, json={"code": "1", "env_vars": env})
            check_4xx_json(r.status_code, r.json(), 400, f"env_vars {list(env)[:2]}")
        other = CodeSandbox.create(timeout=60)
        try:
            # Another sandbox's context id is not found from this one.
            r = httpx.post(f"{BASE}/contexts/{ctx.id}/restart",
                           headers={**headers, "E2b-Sandbox-Id": other.sandbox_id,
                                    "X-Access-Token": other._envd_access_token,
                                    "E2B-Traffic-Access-Token": other._envd_access_token})
            check_4xx_json(r.status_code, r.json(), 404, "another sandbox's context")
        finally:
            other.kill()
    finally:
        sbx.kill()


def auto_pause():
    """lifecycle on_timeout "pause" (in memory, or "filesystem"): paused at the timeout, not
    killed; with auto_resume the next envd request resumes it (and it pauses again at its
    next end); without, envd refuses it until connect."""
    from e2b import SandboxState

    a = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause", "auto_resume": True})
    b = Sandbox.create(timeout=2, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    c = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause"})
    try:
        for s, name in ((a, "a"), (b, "b"), (c, "c")):
            s.files.write(f"/root/{name}", name)
        h = a.commands.run("sleep 600", background=True)
        for s in (a, b, c):
            wait_until(f"{s.sandbox_id} auto-paused", 30,
                       lambda s=s: Sandbox.get_info(s.sandbox_id).state == SandboxState.PAUSED)
        paused = {x.sandbox_id for x in Sandbox.list(
            query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()}
        check(paused == {a.sandbox_id, b.sandbox_id, c.sandbox_id}, f"paused: {paused}")

        # auto_resume: a request to its envd resumes it, memory and all.
        check(a.files.read("/root/a") == "a", "auto-resumed read")
        check(a.get_info().state == SandboxState.RUNNING, "running after the request")
        check(any(p.pid == h.pid for p in a.commands.list()), "process kept by the pause")
        # ... for its timeout again: paused again at its next end.
        wait_until("paused again", 30,
                   lambda: Sandbox.get_info(a.sandbox_id).state == SandboxState.PAUSED)
        check(a.commands.run("cat /root/a").stdout == "a", "resumed by a command")

        # Without auto_resume: refused while paused, connect resumes it.
        try:
            c.files.read("/root/c")
            raise AssertionError("a paused sandbox without auto_resume answered")
        except AssertionError:
            raise
        except Exception:
            pass
        check(Sandbox.get_info(c.sandbox_id).state == SandboxState.PAUSED, "still paused")
        back = Sandbox.connect(c.sandbox_id, timeout=60)
        check(back.files.read("/root/c") == "c", "connect resumes")
        check(back.get_info().end_at > back.get_info().started_at, "end after connect")
        # A fork of an auto-pause sandbox is one too: paused (not killed) at its end.
        (f,) = back.fork(count=1, timeout=2)
        wait_until("the fork auto-paused", 30,
                   lambda: Sandbox.get_info(f.sandbox_id).state == SandboxState.PAUSED)
        f.kill()
        # Filesystem mode: its files kept on disk, made again by connect.
        back_b = Sandbox.connect(b.sandbox_id, timeout=60)
        check(back_b.files.read("/root/b") == "b", "filesystem auto-pause keeps files")

        for body in ({"templateID": "base", "autoResume": {"enabled": True}},
                     {"templateID": "base", "autoPause": True, "autoResume": {"yes": 1}},
                     {"templateID": "base", "autoPause": "soon"}):
            st, ans = raw("POST", "/v2/sandboxes", body)
            check_4xx_json(st, ans, 400, f"create {body}")
    finally:
        for s in (a, b, c):
            try:
                s.kill()
            except Exception:
                pass


def audited_runs():
    """`true` and `exit 4` through `commands.run`; the test finds their `run` records."""
    sbx = Sandbox.create(timeout=60)
    try:
        r = sbx.commands.run("true")
        check(r.exit_code == 0, f"true: {r}")
        try:
            sbx.commands.run("exit 4")
            raise AssertionError("exit 4 did not raise")
        except CommandExitException as e:
            check(e.exit_code == 4, f"exit code {e.exit_code}")
        print("SANDBOX", sbx.sandbox_id, flush=True)
    finally:
        sbx.kill()


def pty():
    """pty.create (async with on_data, and sync), pty.send_stdin, pty.resize (stty size shows
    it), pty.kill, pty.connect and commands.connect to a terminal's process, stream_input to
    a terminal and to a command's stdin; bad input: a size of 0, an unknown pid, terminal
    input to a process without one."""
    import asyncio

    from e2b import AsyncSandbox, InvalidArgumentException, PtySize

    async def until(what, buf, want, timeout=20):
        """Waits (bounded) until `want` is in the output `buf`."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if want in buf:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what} ({want!r}) in {bytes(buf)!r}")

    async def main():
        sbx = await AsyncSandbox.create(timeout=120)
        try:
            out = bytearray()
            h = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=out.extend,
                                     cwd="/tmp", envs={"PTYVAR": "v1"})
            await sbx.pty.send_stdin(h.pid, b"test -t 0 && test -t 1 && echo on-a-tty\n")
            await sbx.pty.send_stdin(h.pid, b"echo $((6*7)) $PTYVAR $(pwd) $TERM; stty size\n")
            await until("42, env, cwd and the size", out, b"42 v1 /tmp xterm-256color\r\n24 80\r\n")
            check(b"on-a-tty\r\n" in out, f"stdin and stdout a terminal: {bytes(out)!r}")
            # It is the shell's controlling terminal: job control, and ^C interrupts the
            # foreground command (not the shell).
            check(b"no job control" not in out, f"bash without job control: {bytes(out)!r}")
            await sbx.pty.send_stdin(h.pid, b"sleep 60; echo slept\n")
            await asyncio.sleep(0.5)
            await sbx.pty.send_stdin(h.pid, b"\x03")
            await sbx.pty.send_stdin(h.pid, b"echo after-$((1+1)) $?\n")
            await until("the shell after ^C", out, b"after-2 130\r\n", timeout=10)
            check(b"\nslept\r\n" not in out, f"sleep not interrupted: {bytes(out)!r}")
            # A resize reaches the foreground process as SIGWINCH, and `stty size` shows it.
            await sbx.pty.send_stdin(
                h.pid, b"sh -c 'trap \"echo winched \\$(stty size); exit\" WINCH; "
                       b"echo ready-$((1)); while :; do sleep 0.1; done'\n")
            await until("the trap set", out, b"ready-1\r\n")
            await sbx.pty.resize(h.pid, PtySize(rows=40, cols=132))
            await until("SIGWINCH", out, b"winched 40 132\r\n")
            await sbx.pty.send_stdin(h.pid, b"echo size=$(stty size)\n")
            await until("the new size", out, b"size=40 132\r\n")
            # Another stream of the same terminal's output.
            seen = bytearray()
            c = await sbx.pty.connect(h.pid, on_data=seen.extend)
            await sbx.pty.send_stdin(h.pid, b"echo via-$((2*5))\n")
            await until("connect's output", seen, b"via-10\r\n")
            # The two streams are delivered independently: wait on the creator's too.
            await until("the creator's stream beside connect's", out, b"via-10\r\n")
            # Ordered input as a client stream.
            async with sbx.pty.stream_input(h.pid) as inp:
                await inp.send("echo str")
                await inp.send(b"eamed-$((4+1))\n")
            await until("streamed input", out, b"streamed-5\r\n")
            await sbx.pty.send_stdin(h.pid, b"exit 3\n")
            try:
                await h.wait()
                raise AssertionError("exit 3 is not a failure")
            except CommandExitException as e:
                check(e.exit_code == 3, f"pty exit code {e.exit_code}")
            try:
                await c.wait()
                raise AssertionError("connect's stream saw exit 0")
            except CommandExitException as e:
                check(e.exit_code == 3, f"connect's exit code {e.exit_code}")

            # kill: the terminal's bash goes, its stream ends.
            k = await sbx.pty.create(PtySize(rows=10, cols=20), on_data=lambda _: None)
            check(await sbx.pty.kill(k.pid), "pty.kill of a running terminal")
            try:
                await asyncio.wait_for(k.wait(), 20)
                raise AssertionError("a killed terminal ended with 0")
            except CommandExitException as e:
                check(e.exit_code != 0, f"killed: {e.exit_code}")
            check(not await sbx.pty.kill(k.pid), "pty.kill of a gone terminal is False")

            # Bad input.
            for size in (PtySize(rows=0, cols=80), PtySize(rows=24, cols=0)):
                try:
                    await sbx.pty.create(size, on_data=lambda _: None)
                    raise AssertionError(f"size {size} accepted")
                except InvalidArgumentException as e:
                    check("pty.size" in str(e), f"size error: {e}")
            for call in (lambda: sbx.pty.send_stdin(999999, b"x"),
                         lambda: sbx.pty.resize(999999, PtySize(rows=5, cols=5))):
                try:
                    await call()
                    raise AssertionError("an unknown pid accepted")
                except NotFoundException:
                    pass
            try:
                await sbx.pty.resize(h.pid, PtySize(rows=0, cols=5))
                raise AssertionError("a resize to 0 accepted")
            except InvalidArgumentException:
                pass
            # A command started with a stdin pipe has no terminal, and the other way round.
            cat = await sbx.commands.run("cat", background=True, stdin=True)
            try:
                await sbx.pty.send_stdin(cat.pid, b"x")
                raise AssertionError("terminal input to a process without one")
            except NotFoundException:
                pass
            async with sbx.commands.stream_input(cat.pid) as inp:
                await inp.send("one ")
                await inp.send(b"two\n")
            await sbx.commands.close_stdin(cat.pid)
            r = await cat.wait()
            check(r.stdout == "one two\n", f"streamed stdin {r.stdout!r}")
            bad = sbx.commands.stream_input(999999)
            try:
                await bad.send("x")
                await bad.close()
                raise AssertionError("stream_input to an unknown pid")
            except NotFoundException:
                pass
        finally:
            await sbx.kill()

    asyncio.run(main())

    # The sync SDK: create, commands.connect to the terminal's process, stream_input.
    sbx = Sandbox.create(timeout=120)
    try:
        h = sbx.pty.create(PtySize(rows=30, cols=100))
        c = sbx.commands.connect(h.pid)
        sbx.pty.stream_input(h.pid, ["stty size; ", b"echo conn-$((3*3)); exit\n"])
        got = []
        r = c.wait(on_pty=got.append)
        data = b"".join(got)
        check(r.exit_code == 0, f"sync pty exit {r.exit_code}")
        check(b"30 100\r\nconn-9\r\n" in data, f"sync pty output {data!r}")
        try:
            sbx.commands.stream_input(999999, ["x"])
            raise AssertionError("sync stream_input to an unknown pid")
        except NotFoundException:
            pass
    finally:
        sbx.kill()


SCENARIOS = {f.__name__: f for f in (sync_flow, async_flow, pause_connect, timeout, code, auth,
                                     escape, watch, list_pages, snapshots,
                                     snapshot_for_other_key, other_key_snapshot,
                                     owner_key_snapshot, pause_filesystem, metrics, network,
                                     code_env_restart, auto_pause, audited_runs, pty)}

if __name__ == "__main__":
    name = sys.argv[1]
    SCENARIOS[name]()
    print(f"OK {name}", flush=True)
    # The scenario is over (its sandboxes killed in its own `finally`): end here. Once in a
    # clean-clone CI run, `watch` printed "OK watch" and the interpreter was then killed by
    # SIGABRT during its own teardown (the async SDK's transports, after asyncio.run), with
    # nothing on stderr: the client's exit, not anything agentrun answered.
    os._exit(0)
