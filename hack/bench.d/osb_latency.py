"""OpenSandbox SDK latency against `agentrun serve --listen` (used by `hack/bench opensandbox`).

    python osb_latency.py DOMAIN RUNS

One sandbox at a time, as a user of the official SDK (opensandbox==1.1.1, sync client) does:
`SandboxSync.create("host")` (create + endpoint lookups + execd ping), `commands.run("echo hi")`
(the first command's result), `kill()`. Prints a markdown table of p50/p99 per step and for
the whole create -> first result -> kill, after WARMUP untimed rounds.
"""

import os
import sys
import time

os.environ.setdefault("OPENSANDBOX_DISABLE_METRICS", "1")

from opensandbox import SandboxSync  # noqa: E402
from opensandbox.config import ConnectionConfigSync  # noqa: E402

WARMUP = 5


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    domain, runs = sys.argv[1], int(sys.argv[2])
    cfg = ConnectionConfigSync(domain=domain, protocol="http")
    steps = {"create (SDK: create, endpoints, ping)": [], "first command result": [], "kill": [], "create -> first result": [], "create -> first result -> kill": []}
    for i in range(WARMUP + runs):
        t0 = time.perf_counter()
        sbx = SandboxSync.create("host", connection_config=cfg)
        t1 = time.perf_counter()
        ex = sbx.commands.run("echo hi")
        t2 = time.perf_counter()
        sbx.kill()
        t3 = time.perf_counter()
        sbx.close()
        if ex.text != "hi" or ex.exit_code != 0:
            sys.exit(f"round {i}: unexpected result {ex.text!r} exit {ex.exit_code}")
        if i < WARMUP:
            continue
        for k, v in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t2 - t0, t3 - t0)):
            v_ms = v * 1000
            steps[k].append(v_ms)
    print(f"| step ({runs} runs, sequential) | p50 ms | p99 ms |")
    print("|---|---:|---:|")
    for k, xs in steps.items():
        print(f"| {k} | {pct(xs, 50):.1f} | {pct(xs, 99):.1f} |")


if __name__ == "__main__":
    main()
