#!/usr/bin/env python3
"""`hack/bench --check`: each shipped profile and front end against its plain counterpart
(same pool kind, same workload), one session; prints a markdown table and exits 1 when a row
is past its limit (1.5x or +20 ms over its counterpart's median, whichever is looser) or could
not be measured. Ratios on one binary, not absolute times: a timer on a run's path (a 50 ms
wait) shows as +50 ms whatever the machine.

  check.py BIN RUNS DOCKER_SOCKET   (the daemon serves BIN's pools; see hack/bench.d/check.sh)
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

RATIO, EXTRA_MS = 1.5, 20.0


def hyperfine(cmds, runs):
    """Median ms of each command line (hyperfine -N when installed, else a timed loop)."""
    if shutil.which("hyperfine"):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run(
                ["hyperfine", "-N", "--style", "none", "--warmup", "3", "--runs", str(runs),
                 "--export-json", out.name, *[" ".join(c) for c in cmds]],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
            res = json.load(open(out.name))["results"]
        return [r["median"] * 1e3 for r in res]
    meds = []
    for c in cmds:
        for _ in range(3):
            subprocess.run(c, check=True, stdout=subprocess.DEVNULL, timeout=60)
        t = []
        for _ in range(runs):
            s = time.perf_counter()
            subprocess.run(c, check=True, stdout=subprocess.DEVNULL, timeout=60)
            t.append(time.perf_counter() - s)
        meds.append(statistics.median(t) * 1e3)
    return meds


def cli_rows(binary, runs):
    """`agentrun exec` warm: each shipped profile's /bin/true against `default`'s."""
    cmd = lambda p: [binary, "exec", "--profile", p, "--", "/bin/true"]
    base, ci, ct = hyperfine([cmd("default"), cmd("code-interpreter"), cmd("container")], runs)
    plain = "CLI exec --profile default /bin/true"
    return [
        ("CLI exec --profile code-interpreter /bin/true", ci, plain, base),
        ("CLI exec --profile container /bin/true", ct, plain, base),
    ]


def docker_rows(sock, runs):
    """docker-py exec_run (a hijacked exec start) against the same exec started without the
    hijack (output as a streamed body), on one container of the busybox:container pool.
    Every hijacked run must also give back its output (none lost after the answer). And
    container.stop() against kill + wait (CodeInterpreterTool stops its container per run);
    containers.run() (it follows the logs) against the same steps with a plain logs()."""
    import docker

    client = docker.DockerClient(base_url="unix://" + sock, timeout=60)
    c = client.containers.run("busybox", ["sleep", "3600"], detach=True)
    try:
        api = client.api

        def hijacked():
            r = c.exec_run(["echo", "x"])
            if r.output != b"x\n" or r.exit_code != 0:
                raise SystemExit(f"docker-py exec_run lost output: {r!r}")

        def plain():
            ex = api.exec_create(c.id, ["echo", "x"])["Id"]
            res = api._post_json(api._url("/exec/{0}/start", ex),
                                 data={"Detach": False, "Tty": False}, stream=True)
            body = res.content
            if not body.endswith(b"x\n"):
                raise SystemExit(f"plain exec start: {body!r}")

        t = {hijacked: [], plain: []}
        for _ in range(3):
            hijacked(), plain()
        for _ in range(runs):
            for f in (hijacked, plain):
                s = time.perf_counter()
                f()
                t[f].append(time.perf_counter() - s)
        med = lambda f: statistics.median(t[f]) * 1e3
        rows = [("docker-py exec_run(['echo','x'])", med(hijacked),
                 "same exec, started without the hijack", med(plain))]
    finally:
        c.remove(force=True)
    # stop() (SIGTERM, the answer once the exit is recorded) against kill(SIGTERM) + wait():
    # the same signal and the same wait for the exit, each on a fresh container.
    stops = {"stop": [], "kill": []}
    for i in range(runs + 2):
        for how in stops:
            c = client.containers.run("busybox", ["sleep", "3600"], detach=True)
            try:
                s = time.perf_counter()
                if how == "stop":
                    c.stop(timeout=10)
                else:
                    c.kill("SIGTERM")
                    c.wait(timeout=10)
                if i >= 2:
                    stops[how].append(time.perf_counter() - s)
                c.reload()
                if c.status != "exited":
                    raise SystemExit(f"docker-py {how}: container {c.status}")
            finally:
                c.remove(force=True)
    rows.append(("docker-py container.stop()", statistics.median(stops["stop"]) * 1e3,
                 "kill('SIGTERM') + wait()", statistics.median(stops["kill"]) * 1e3))
    # run(..., remove=True) (create, start, logs(follow=True), wait, remove) against the same
    # steps without following the logs: run(detach=True), wait(), logs(), remove().
    runs_t = {"attached": [], "detached": []}
    for i in range(runs + 2):
        s = time.perf_counter()
        out = client.containers.run("busybox", ["echo", "hi"], remove=True)
        t_att = time.perf_counter() - s
        s = time.perf_counter()
        c = client.containers.run("busybox", ["echo", "hi"], detach=True)
        c.wait(timeout=10)
        logs = c.logs()
        c.remove()
        t_det = time.perf_counter() - s
        if out != b"hi\n" or logs != b"hi\n":
            raise SystemExit(f"docker-py run: output {out!r} / {logs!r}")
        if i >= 2:
            runs_t["attached"].append(t_att)
            runs_t["detached"].append(t_det)
    rows.append(("docker-py containers.run(['echo','hi'], remove=True)",
                 statistics.median(runs_t["attached"]) * 1e3,
                 "run(detach=True), wait(), logs(), remove()",
                 statistics.median(runs_t["detached"]) * 1e3))
    return rows


def opensandbox_rows(binary, runs, domain, key):
    """The OpenSandbox SDK's `commands.run("echo hi")` (one sandbox of image host, the
    foreground command's event stream to its end) against the CLI's warm `exec -- echo hi`
    (a pooled shell of the same image and profile): another front end, the same workload;
    a wait after the command's exit (the SDK answers once the output is drained) shows."""
    os.environ.setdefault("OPENSANDBOX_DISABLE_METRICS", "1")
    import httpx
    from opensandbox import SandboxSync
    from opensandbox.config import ConnectionConfigSync

    cfg = ConnectionConfigSync(domain=domain, api_key=key, protocol="http",
                               transport=httpx.HTTPTransport())
    sbx = SandboxSync.create("host", connection_config=cfg)
    try:
        t = []
        for i in range(runs + 3):
            s = time.perf_counter()
            ex = sbx.commands.run("echo hi")
            if i >= 3:
                t.append(time.perf_counter() - s)
            if ex.text != "hi" or ex.exit_code != 0:
                raise SystemExit(f"OpenSandbox command: {ex.text!r} exit {ex.exit_code}")
    finally:
        sbx.kill()
        sbx.close()
    (base,) = hyperfine([[binary, "exec", "--", "echo", "hi"]], runs)
    return [("OpenSandbox SDK commands.run('echo hi')", statistics.median(t) * 1e3,
             "CLI exec --profile default echo hi", base)]


def main():
    binary, runs, sock = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    osb = (binary, runs, os.environ.get("OSB_DOMAIN", ""), os.environ.get("OSB_API_KEY", ""))
    rows, failed, broken = [], False, []
    for name, f, args in (("CLI exec", cli_rows, (binary, runs)),
                          ("docker-py", docker_rows, (sock, runs)),
                          ("OpenSandbox SDK", opensandbox_rows, osb)):
        try:
            rows += f(*args)
        except (Exception, SystemExit) as e:  # a row that cannot be measured fails the check
            broken.append(f"| {name} | | could not be measured: {str(e)[:200]} | | | | FAIL |")
            failed = True
    print("| what | median ms | plain counterpart | median ms | ratio | limit ms | verdict |")
    print("|---|---:|---|---:|---:|---:|---|")
    for line in broken:
        print(line)
    for what, ms, plain, base in rows:
        limit = max(base * RATIO, base + EXTRA_MS)
        ok = ms <= limit
        failed |= not ok
        print(f"| {what} | {ms:.1f} | {plain} | {base:.1f} | {ms / base:.2f}x | {limit:.1f} | "
              f"{'ok' if ok else 'FAIL'} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
