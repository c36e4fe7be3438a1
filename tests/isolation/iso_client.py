"""What the isolation corpus's clients share (tests/e2b/sdk_isolation.py,
tests/opensandbox/sdk_isolation.py, tests/isolation/mcp_pairs.py; the corpus is
tests/tests/isolation.rs, the probe tests/isolation/scan.py): the manifest the Rust side
wrote (ISO_MANIFEST), the shell command that runs a probe, the probe's report line
(printed as `RESULT <label> <json>` for the Rust side to judge), and which shell serves a
sandbox (`agentrun ps --json`): B must run on A's shell.

A client outside tests/isolation puts this directory on sys.path to import it.
"""

import json
import os
import shlex
import subprocess
import time

REPORTS = ("ISO-PLANTED ", "ISO-VERDICT ")


def manifest():
    with open(os.environ["ISO_MANIFEST"]) as f:
        return json.load(f)


def command(code, mark):
    """`python3 -c CODE MARK`, quoted for a shell."""
    return "python3 -c " + shlex.quote(code) + " " + shlex.quote(mark)


def report(text):
    """The JSON of the first `ISO-PLANTED`/`ISO-VERDICT` line of `text`, or None."""
    for line in text.splitlines():
        for key in REPORTS:
            if line.startswith(key):
                return line[len(key):]
    return None


def result(label, text):
    """Prints the report in a run's output as a RESULT; raises when there is none."""
    found = report(text)
    if found is None:
        raise AssertionError(f"{label}: no report in its output:\n{text[-4000:]}")
    print("RESULT", label, found, flush=True)


def ps():
    """`agentrun ps --json` of the daemon under test (ISO_AGENTRUN, ISO_STATE: its state
    dir): one entry a shell (`id`, `state`, the `sandbox` it serves)."""
    env = dict(os.environ, AGENTRUN_STATE_DIR=os.environ["ISO_STATE"])
    out = subprocess.run([os.environ["ISO_AGENTRUN"], "ps", "--json"], env=env,
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise AssertionError(f"agentrun ps: {out.returncode} {out.stderr}")
    return json.loads(out.stdout)


def shell_of(sid, ps=ps):
    """The shell serving sandbox `sid`, by `ps` (a function like `ps` above)."""
    entries = ps()
    for e in entries:
        if e.get("sandbox") == sid:
            return e["id"]
    raise AssertionError(f"no shell serves sandbox {sid}: {entries}")


def wait_back(shell, ps=ps, secs=30):
    """Waits until `shell` is back in its pool: ready, serving no sandbox (a shell in doubt
    is discarded instead, and then B could not run on it)."""
    deadline = time.monotonic() + secs
    while True:
        entry = next((e for e in ps() if e["id"] == shell), None)
        if entry is None:
            raise AssertionError(f"shell {shell} was discarded: {ps()}")
        if entry["state"] == "ready" and entry.get("sandbox") is None:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"shell {shell} not back in its pool: {entry}")
        time.sleep(0.05)
