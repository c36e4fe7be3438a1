"""The E2B integrations of agent frameworks, as published on PyPI, against
`agentrun serve --e2b ADDR`, unchanged: the user points them at agentrun with the
environment variables the e2b SDK reads (E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL) and
calls the framework's own tool or sandbox class (no LLM: the call an agent would make).

Each framework pins its own e2b SDK, so each runs from a venv of its own (hack/test):
  crewai        .venv/e2b-crewai     crewai-tools[e2b]==1.15.30 (e2b 2.20.3,
                                     e2b-code-interpreter 2.6.2): E2BExecTool, E2BFileTool
  langchain     .venv/e2b-langchain  langchain-e2b==0.0.6 (e2b 2.63.0): E2BSandbox and
                                     AsyncE2BSandbox (Deep Agents' sandbox backend)
  openai_agents .venv/e2b-agents     openai-agents[e2b]==0.24.0 (e2b 2.31.0,
                                     e2b-code-interpreter 2.8.1): E2BSandboxClient

Usage: frameworks.py SCENARIO. Environment: E2B_ADDR (host:port of agentrun's E2B API),
E2B_API_KEY (as the user sets it). Prints "OK SCENARIO" at the end; any failed check raises
(non-zero exit). Every sandbox a scenario makes is gone at its end (checked).
"""

import asyncio
import base64
import io
import os
import sys
import uuid

ADDR = os.environ["E2B_ADDR"]
BASE = f"http://{ADDR}"
os.environ["E2B_API_URL"] = BASE
os.environ["E2B_SANDBOX_URL"] = BASE
for var in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN", "E2B_VALIDATE_API_KEY"):
    os.environ.pop(var, None)
KEY = os.environ["E2B_API_KEY"]
# No telemetry or tracing calls out of the test.
os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"
os.environ["OTEL_SDK_DISABLED"] = "true"
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"

import httpx  # noqa: E402  (a dependency of every e2b SDK)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def running_sandboxes():
    """The sandboxes the control plane lists (running or paused), by plain HTTP."""
    r = httpx.get(f"{BASE}/v2/sandboxes", headers={"X-API-Key": KEY}, timeout=30)
    check(r.status_code == 200, f"list: {r.status_code} {r.text}")
    return [s["sandboxID"] for s in r.json()]


def crewai():
    from crewai_tools import E2BExecTool, E2BFileTool

    nonce = uuid.uuid4().hex[:8]
    # A shell command in a fresh sandbox (the tool's default: created, then killed).
    out = E2BExecTool().run(command=f"echo exec-{nonce}; echo oops >&2; uname -s")
    check(out["exit_code"] == 0, f"exec: {out}")
    check(out["stdout"] == f"exec-{nonce}\nLinux\n", f"exec stdout: {out}")
    check(out["stderr"] == "oops\n", f"exec stderr: {out}")
    out = E2BExecTool().run(command="echo $GREETING; pwd", cwd="/tmp", envs={"GREETING": nonce})
    check(out["stdout"] == f"{nonce}\n/tmp\n", f"exec env/cwd: {out}")
    check(running_sandboxes() == [], "the exec tool's sandboxes were not killed")

    # Files in one persistent sandbox: write (parents made), read back, list, info, exists,
    # mkdir, delete. (Not `append`: with its pinned e2b 2.20.3 it fails in the client,
    # whatever the server: it writes `bytearray + bytes`, a type that release's `files.write`
    # refuses.)
    files = E2BFileTool(persistent=True)
    try:
        path = f"/tmp/crew-{nonce}/notes.txt"
        body = f"hello {nonce}\nmore\n"
        out = files.run(action="write", path=path, content=body)
        check(out == {"status": "written", "path": path, "bytes": len(body)}, f"write: {out}")
        out = files.run(action="read", path=path)
        check(out == {"path": path, "encoding": "utf-8", "content": body}, f"read: {out}")
        out = files.run(action="read", path=path, binary=True)
        check(base64.b64decode(out["content"]) == body.encode(), f"read binary: {out}")
        out = files.run(action="list", path=f"/tmp/crew-{nonce}")
        check([e["name"] for e in out["entries"]] == ["notes.txt"], f"list: {out}")
        out = files.run(action="info", path=path)
        check(out["name"] == "notes.txt" and out["size"] == len(body), f"info: {out}")
        check(files.run(action="exists", path=path)["exists"] is True, "exists")
        check(files.run(action="exists", path=path + ".nope")["exists"] is False, "exists (missing)")
        out = files.run(action="mkdir", path=f"/tmp/crew-{nonce}/sub")
        check(out["created"] is True, f"mkdir: {out}")
        files.run(action="delete", path=path)
        check(files.run(action="exists", path=path)["exists"] is False, "deleted")
        check(len(running_sandboxes()) == 1, "the persistent sandbox is not the one sandbox")
    finally:
        files.close()
    check(running_sandboxes() == [], "the file tool's sandbox was not killed by close()")

    # Not E2BPythonTool: the e2b-code-interpreter 2.6.2 of crewai-tools[e2b] sends `run_code`
    # to https://49999-ID.DOMAIN whatever E2B_SANDBOX_URL says (a wildcard DNS name and a TLS
    # front, not this test's plain loopback listener; docs/e2b.md).


def langchain():
    import e2b
    from langchain_e2b import AsyncE2BSandbox, E2BSandbox

    nonce = uuid.uuid4().hex[:8]
    sbx = e2b.Sandbox.create(timeout=300)
    try:
        # The backend as Deep Agents uses it, with its default working directory
        # (/home/user, E2B's templates' home).
        backend = E2BSandbox(sandbox=sbx)
        r = backend.execute(f"pwd; echo lc-{nonce}")
        check(r.exit_code == 0 and r.output == f"/home/user\nlc-{nonce}\n", f"execute: {r}")
        r = backend.execute("echo out; echo err >&2; exit 3")
        check(r.exit_code == 3 and r.output == "out\n\nerr\n", f"execute exit 3: {r}")
        # Files: upload, download, the file tools Deep Agents' agent calls.
        path = f"/home/user/lc-{nonce}.txt"
        up = backend.upload_files([(path, f"line one {nonce}\nline two\n".encode())])
        check([u.error for u in up] == [None], f"upload: {up}")
        down = backend.download_files([path, "/home/user/nope.txt", "/home/user"])
        check(down[0].content == f"line one {nonce}\nline two\n".encode() and down[0].error is None, f"download: {down[0]}")
        check(down[1].error == "file_not_found", f"download missing: {down[1]}")
        check(down[2].error == "is_directory", f"download dir: {down[2]}")
        read = backend.read(path)
        check(read.error is None and f"line one {nonce}" in read.file_data["content"], f"read: {read}")
        ed = backend.edit(path, "line two", "line 2")
        check(ed.error is None and ed.occurrences == 1, f"edit: {ed}")
        check(sbx.files.read(path) == f"line one {nonce}\nline 2\n", "edit not in the file")
        wr = backend.write(f"/home/user/new-{nonce}.py", "print('hi')\n")
        check(wr.error is None, f"write: {wr}")
        ls = backend.ls("/home/user")
        names = [e["path"].rsplit("/", 1)[-1] for e in ls.entries or []]
        check(f"lc-{nonce}.txt" in names and f"new-{nonce}.py" in names, f"ls: {ls}")
        gr = backend.grep(f"line one {nonce}", path="/home/user")
        check([m["path"] for m in gr.matches or []] == [path], f"grep: {gr}")
        gl = backend.glob("*.py", path="/home/user")
        check([m["path"].rsplit("/", 1)[-1] for m in gl.matches or []] == [f"new-{nonce}.py"], f"glob: {gl}")
    finally:
        sbx.kill()

    async def run_async():
        asbx = await e2b.AsyncSandbox.create(timeout=300)
        try:
            backend = AsyncE2BSandbox(sandbox=asbx)
            r = await backend.aexecute(f"echo async-{nonce} > /home/user/a.txt; cat /home/user/a.txt")
            check(r.exit_code == 0 and r.output == f"async-{nonce}\n", f"aexecute: {r}")
            down = await backend.adownload_files(["/home/user/a.txt"])
            check(down[0].content == f"async-{nonce}\n".encode(), f"adownload: {down}")
        finally:
            await asbx.kill()

    asyncio.run(run_async())
    check(running_sandboxes() == [], "sandboxes left")


def openai_agents():
    from agents.extensions.sandbox.e2b import E2BSandboxClient, E2BSandboxClientOptions

    nonce = uuid.uuid4().hex[:8]

    async def session_of(sandbox_type):
        client = E2BSandboxClient()
        session = await client.create(
            options=E2BSandboxClientOptions(sandbox_type=sandbox_type, timeout=300)
        )
        async with session:
            # The workspace (the manifest's root, /workspace) is the commands' cwd.
            r = await session.exec(f"pwd; echo agents-{nonce}")
            check(r.exit_code == 0, f"exec: {r}")
            check(r.stdout.decode() == f"/workspace\nagents-{nonce}\n", f"exec stdout: {r.stdout!r}")
            r = await session.exec("echo err >&2; exit 4")
            check(r.exit_code == 4 and r.stderr.decode() == "err\n", f"exec exit 4: {r}")
            # A file written then read back, relative to the workspace.
            await session.write("notes/hello.txt", io.BytesIO(f"hello {nonce}\n".encode()))
            data = (await session.read("notes/hello.txt")).read()
            check(data == f"hello {nonce}\n".encode(), f"read back: {data!r}")
            r = await session.exec("cat notes/hello.txt")
            check(r.stdout.decode() == f"hello {nonce}\n", f"cat: {r.stdout!r}")
            entries = await session.ls("notes")
            check([e.path.rsplit("/", 1)[-1] for e in entries] == ["hello.txt"], f"ls: {entries}")
            check(len(running_sandboxes()) == 1, "not one sandbox")
        check(running_sandboxes() == [], "the session's sandbox was not killed on exit")

    asyncio.run(session_of("e2b"))
    asyncio.run(session_of("e2b_code_interpreter"))


SCENARIOS = {"crewai": crewai, "langchain": langchain, "openai_agents": openai_agents}

if __name__ == "__main__":
    name = sys.argv[1]
    SCENARIOS[name]()
    print(f"OK {name}")
