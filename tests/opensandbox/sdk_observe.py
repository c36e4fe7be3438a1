"""What the daemon shows its operators of a long-lived sandbox: the live picture on the
control socket (`{"op": "top"}`, what `agentrun top` and `/ui` draw) lists a command started
through the OpenSandbox API as a `process` of its sandbox, with its sandbox's CPU and memory,
and `{"op": "kill", "id": ...}` kills that command alone (exit 137) while the sandbox goes on.

Run by tests/tests/observe.rs as `sdk_e2e.py observe:SCENARIO`; AGENTRUN_STATE_DIR names the
daemon's state dir (its control socket is `agentrun.sock` there).
"""

import json
import os
import socket
import time

from opensandbox import SandboxSync
from opensandbox.models.execd import RunCommandOpts
from sdk_e2e import check, sync_config

WAIT = 60  # seconds for one eventual condition (debug build, 2 shared cores)


def control(msg):
    """One request on the daemon's control socket (SOCK_SEQPACKET, one JSON message each
    way), as `agentrun top` sends it."""
    path = os.path.join(os.environ["AGENTRUN_STATE_DIR"], "agentrun.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(30)
        s.connect(path)
        s.send(json.dumps(msg).encode())
        return json.loads(s.recv(1 << 20))


def eventually(what, fn, secs=WAIT):
    deadline = time.monotonic() + secs
    while True:
        v = fn()
        if v:
            return v
        check(time.monotonic() < deadline, f"never: {what}")
        time.sleep(0.2)


def process_kill():
    sbx = SandboxSync.create("host", connection_config=sync_config(), timeout=None)
    try:
        marker = "sleep 271"
        ex = sbx.commands.run(marker, opts=RunCommandOpts(background=True))
        cid = ex.id
        check(cid, f"background command id: {ex}")

        def listed():
            top = control({"op": "top"})
            check(top.get("reply") == "top", f"top: {top}")
            return next(
                (c for c in top["commands"] if c["sandbox"] == sbx.id and marker in c["command"]),
                None,
            )

        cmd = eventually(f"{marker!r} listed as a process of {sbx.id}", listed)
        check(cmd["kind"] == "process", f"kind: {cmd}")
        check(cmd["id"].startswith(sbx.id + "/"), f"id: {cmd}")
        check(cmd["image"] == "host", f"image: {cmd}")
        check(cmd["shell"] and cmd["shell"] != sbx.id, f"shell: {cmd}")
        check(cmd["memory_bytes"] and cmd["memory_bytes"] > 0, f"memory: {cmd}")
        check(cmd["cpu_ms"] is not None, f"cpu: {cmd}")
        check(cmd["elapsed_ms"] >= 0 and cmd["started_unix_ms"] > 0, f"times: {cmd}")
        top = control({"op": "top"})
        shell = next((s for s in top["shells"] if s["id"] == cmd["shell"]), None)
        check(shell and shell["state"] == "running" and shell["sandbox"] == sbx.id, f"shell entry: {shell}")

        unknown = control({"op": "kill", "id": sbx.id + "/999999"})
        check(unknown.get("reply") == "error" and "no running command" in unknown["message"], f"unknown id: {unknown}")
        garbage = control({"op": "kill", "id": "../../etc"})
        check(garbage.get("reply") == "error", f"garbage id: {garbage}")

        killed = control({"op": "kill", "id": cmd["id"]})
        check(killed.get("reply") == "ok", f"kill: {killed}")
        eventually("the killed command ends", lambda: not sbx.commands.get_command_status(cid).running)
        st = sbx.commands.get_command_status(cid)
        check(st.exit_code == 137, f"killed command's status: {st}")
        eventually("the killed command leaves the picture", lambda: listed() is None)

        # The sandbox goes on; its next command is counted in the last minute's runs.
        ex = sbx.commands.run("echo alive")
        check(ex.exit_code == 0 and "alive" in ex.text, f"after the kill: {ex.exit_code} {ex.text!r}")
        window = control({"op": "top"})["window"]
        check(window["seconds"] == 60 and len(window["runs_per_second"]) == 60, f"window: {window}")
        check(window["runs"] >= 1 and window["p50_ms"] is not None, f"window counts runs: {window}")
    finally:
        sbx.kill()
        sbx.close()


SCENARIOS = {
    "process_kill": process_kill,
}
