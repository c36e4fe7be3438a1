"""The run-to-run isolation corpus (tests/tests/isolation.rs) through the official E2B SDKs
(`e2b`, `e2b-code-interpreter`, from .venv/e2b) against `agentrun serve --e2b ADDR`:
sandbox A gets marked secrets and plants them (tests/isolation/scan.py, role "plant")
through `commands.run` (the sandbox's and the command's env, argv, an uploaded file), a
background command fed by `send_stdin`, `run_code` in the default context and in a context
of its own; A is killed; B, made on A's shell, scans (role "scan") through the same calls,
and may not run code in A's context.

    python sdk_isolation.py e2b

ISO_MANIFEST names the JSON file the test wrote (the codes and markers of A and B);
E2B_ADDR and E2B_API_KEY the daemon's E2B listener and key; ISO_AGENTRUN and ISO_STATE the
binary and the daemon's state dir (for `agentrun ps --json`). Prints `RESULT <label> <json>`
for every plant report and verdict, then `OK e2b`; the Rust side judges them.
"""

import os
import sys

import httpx

ADDR = os.environ["E2B_ADDR"]
BASE = f"http://{ADDR}"
os.environ["E2B_API_URL"] = BASE
os.environ["E2B_SANDBOX_URL"] = BASE
os.environ.pop("E2B_DEBUG", None)
os.environ.pop("E2B_DOMAIN", None)

from e2b_code_interpreter import Sandbox  # noqa: E402
from e2b_code_interpreter.models import Context  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "isolation"))
from iso_client import command, manifest, result, shell_of, wait_back  # noqa: E402

TIMEOUT = 300


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def cmd_text(r):
    return f"{r.stdout}\n--- stderr ---\n{r.stderr}\n--- exit {r.exit_code} {r.error!r}"


def code_text(e):
    return "".join(e.logs.stdout) + "\n--- stderr ---\n" + "".join(e.logs.stderr) + \
        "\n--- error ---\n" + repr(e.error)


def side(sbx, label, s):
    """Runs side `s` of the manifest in `sbx`, printing a RESULT per run; returns the id of
    the code context it made."""
    from e2b import CommandExitException

    def run(cmd, **kw):
        try:
            return sbx.commands.run(cmd, timeout=TIMEOUT, **kw)
        except CommandExitException as e:
            return e

    if "upload" in s:
        path, data = s["upload"]
        sbx.files.write(path, data)
    result(f"{label}.cmd", cmd_text(run(command(*s["cmd"]), envs=s["cmd_env"])))
    h = sbx.commands.run(command(*s["stdin"]), background=True, stdin=True, timeout=TIMEOUT)
    sbx.commands.send_stdin(h.pid, s["stdin"][1] + "\n")
    sbx.commands.close_stdin(h.pid)
    try:
        r = h.wait()
    except CommandExitException as e:
        r = e
    result(f"{label}.stdin", cmd_text(r))
    result(f"{label}.code", code_text(sbx.run_code(s["code"], timeout=TIMEOUT)))
    ctx = sbx.create_code_context()
    result(f"{label}.ctx.code", code_text(sbx.run_code(s["ctx"], context=ctx, timeout=TIMEOUT)))
    return ctx.id


def e2b():
    m = manifest()
    a = Sandbox.create(timeout=TIMEOUT, envs=m["a"]["env"])
    try:
        shell = shell_of(a.sandbox_id)
        a_ctx = side(a, "a", m["a"])
    finally:
        a.kill()
    wait_back(shell)
    b = Sandbox.create(timeout=TIMEOUT, envs=m["b"]["env"])
    try:
        check(shell_of(b.sandbox_id) == shell, f"sandbox B is not in A's shell {shell}")
        # A's code context is not B's to run in (A is gone; its id names nothing here).
        e = None
        try:
            e = b.run_code("print('ran')", context=Context(context_id=a_ctx, language="python",
                                                              cwd="/"))
        except Exception as err:  # the SDK raises on the 4xx
            check("ran" not in str(err), f"A's context ran B's code: {err}")
        check(e is None or (e.error is not None and not e.logs.stdout),
              f"B ran code in A's context {a_ctx}: {e}")
        r = httpx.post(f"{BASE}/execute", json={"code": "print('ran')", "context_id": a_ctx},
                       headers={"E2b-Sandbox-Id": b.sandbox_id, "E2b-Sandbox-Port": "49999",
                                "X-Access-Token": b._envd_access_token})
        check(400 <= r.status_code < 500 and "ran" not in r.text,
              f"A's context {a_ctx} from B: {r.status_code} {r.text}")
        side(b, "b", m["b"])
        check(shell_of(b.sandbox_id) == shell, f"sandbox B left A's shell {shell}")
    finally:
        b.kill()
    print("SHELL", shell, flush=True)


if __name__ == "__main__":
    name = sys.argv[1]
    {"e2b": e2b}[name]()
    print(f"OK {name}")
