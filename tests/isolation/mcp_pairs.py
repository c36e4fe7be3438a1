"""The run-to-run isolation corpus through the official MCP SDK (tests/tests/isolation.rs):
run A plants marked secrets (tests/isolation/scan.py, role "plant"), run B scans for them.

    python mcp_pairs.py session    (MCP_URL, MCP_API_KEY: `serve --mcp`) session A's run_python
                                   and run_shell plant, the session ends (its sandbox goes),
                                   session B's run_python and run_shell scan
    python mcp_pairs.py oneshot    (`agentrun mcp --one-shot` on stdio) run_python A, run_python
                                   B, run_shell A, run_shell B: each call a sandbox of its own

ISO_MANIFEST names a JSON file the test wrote: {"a": {"py": CODE, "sh": COMMAND}, "b": ...}.
Prints `RESULT <label> <json>` for every plant report and verdict, then `OK <scenario>`.
Run with tests/mcp on sys.path (its common.py).
"""

import json
import os
import subprocess
import time

import anyio

from common import check, main, structured

import sdk_client
from iso_client import manifest, ps, report


def result(label, res):
    obj = structured(res)
    check(not res.isError, f"{label}: an error result", obj)
    found = report(obj.get("stdout", ""))
    if found is not None:
        print("RESULT", label, found, flush=True)
        return
    raise AssertionError(f"{label}: no report in its output: exit {obj.get('exit_code')}\n"
                         f"{obj.get('stdout', '')[-3000:]}\n--- stderr ---\n{obj.get('stderr', '')[-3000:]}")


TIMEOUT = 120


def pool_status():
    """`agentrun pool status --json` of the server (ISO_AGENTRUN, ISO_STATE: its state dir)."""
    env = dict(os.environ, AGENTRUN_STATE_DIR=os.environ["ISO_STATE"])
    out = subprocess.run([os.environ["ISO_AGENTRUN"], "pool", "status", "--json"], env=env,
                         capture_output=True, text=True, timeout=30)
    check(out.returncode == 0, f"agentrun pool status: {out.returncode} {out.stderr}")
    return json.loads(out.stdout)


def wait_idle(want=None, secs=30):
    """Waits until the server's shells are all idle (ready, serving nothing) and, given
    `want`, are exactly those; returns their ids. A run after this takes one of them."""
    deadline = time.monotonic() + secs
    while True:
        entries = ps()
        idle = sorted(e["id"] for e in entries if e["state"] == "ready" and not e.get("sandbox"))
        if len(idle) == len(entries) and idle and (want is None or idle == want):
            return idle
        check(time.monotonic() < deadline, f"shells not back to idle {want}: {entries}")
        time.sleep(0.05)


async def session():
    m = manifest()
    shells = wait_idle()
    for side in ("a", "b"):
        async with sdk_client.connect() as s:
            result(f"{side}.py", await s.call_tool("run_python", {"code": m[side]["py"], "timeout": TIMEOUT}))
            result(f"{side}.sh", await s.call_tool("run_shell", {"command": m[side]["sh"], "timeout": TIMEOUT}))
        # The session's sandbox goes with the session: its shell back in the pool, where the
        # next session takes it.
        wait_idle(shells)
    print("SHELLS", " ".join(shells), flush=True)


async def oneshot():
    """With `--pool-size 0` the first call's shell is made for it and joins the pool after;
    every later call takes it (nothing else is made: `created` stays 1). A first call
    (`true`) makes the shell before the pairs."""
    m = manifest()
    async with sdk_client.connect() as s:
        # The first call makes the shell; a profile's zygote then imports its preload list
        # (until it is ready, Python runs are exec'd, not forked).
        await s.call_tool("run_shell", {"command": "true"})
        shells = wait_idle()
        deadline = time.monotonic() + 90
        while any(p.get("zygote", {"ready": True})["ready"] is not True for p in pool_status()["pools"]):
            check(time.monotonic() < deadline, f"the zygote is not ready: {pool_status()}")
            time.sleep(0.1)
        # A driver started before the zygote was ready is exec'd: calls until one is forked
        # (its parent outside its pid namespace), so that A's is.
        if any("zygote" in p for p in pool_status()["pools"]):
            while True:
                res = structured(await s.call_tool("run_python", {"code": "import os; print(os.getppid())"}))
                if res["stdout"].strip() == "0":
                    break
                check(time.monotonic() < deadline, f"no run_python forked by the zygote: {res}")
                time.sleep(0.2)
            shells = wait_idle(shells)
        for tool, arg, key in (("run_python", "code", "py"), ("run_shell", "command", "sh")):
            for side in ("a", "b"):
                result(f"{side}.{key}", await s.call_tool(tool, {arg: m[side][key], "timeout": TIMEOUT}))
                shells = wait_idle(shells)
                check(len(shells) == 1, f"one shell: {shells}")
        status = pool_status()
        check(status.get("created") == 1 and not status.get("discarded"), f"one shell served every call: {status}")
    print("SHELLS", " ".join(shells), flush=True)


if __name__ == "__main__":
    main({"session": lambda: anyio.run(session), "oneshot": lambda: anyio.run(oneshot)})
