"""OpenSandbox SDK latency against `agentrun serve --listen` (used by `hack/bench opensandbox`).

    python osb_latency.py DOMAIN RUNS

One sandbox at a time, as a user of the official SDK (opensandbox==1.1.1, sync client) does:
`SandboxSync.create("host")` (create + endpoint lookups + execd ping), `commands.run("echo hi")`
(the first command's result), `kill()`; once with the SDK's default config (a new transport per
sandbox) and once with one transport shared by all sandboxes (the config's `transport` field). Prints a markdown table of p50/p99 per step and for
the whole create -> first result -> kill, after WARMUP untimed rounds. Then the same HTTP
requests the SDK makes (create, both endpoint lookups, ping, the command's stream, delete)
sent by one kept-alive httpx client, to separate agentrun's time from the SDK's own.
"""

import os
import sys
import time

import httpx

os.environ.setdefault("OPENSANDBOX_DISABLE_METRICS", "1")

from opensandbox import SandboxSync  # noqa: E402
from opensandbox.config import ConnectionConfigSync  # noqa: E402

from latency import print_table  # noqa: E402  (hack/bench.d)

WARMUP = 5


def sdk_rounds(label, make_cfg, runs):
    steps = {"create (SDK: create, endpoints, ping)": [], "first command result": [], "kill": [], "create -> first result": [], "create -> first result -> kill": []}
    for i in range(WARMUP + runs):
        cfg = make_cfg()
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
            steps[k].append(v * 1000)
    print_table(f"SDK step, {label} ({runs} runs, sequential)", steps)
    print()


def main():
    domain, runs = sys.argv[1], int(sys.argv[2])
    key = os.environ["OSB_API_KEY"]  # the daemon's API key (its state dir's key file)
    # The SDK's default config builds a new transport (and TLS context: ~30 ms of CA loading,
    # even for http) per sandbox; a service creating many sandboxes shares one, as the
    # `transport` field of the config documents. Both are measured.
    shared = ConnectionConfigSync(domain=domain, api_key=key, protocol="http", transport=httpx.HTTPTransport())
    configs = {
        "default config": lambda: ConnectionConfigSync(domain=domain, api_key=key, protocol="http"),
        "shared transport": lambda: shared,
    }
    for label, make_cfg in configs.items():
        sdk_rounds(label, make_cfg, runs)
    raw = {"create (POST /v1/sandboxes)": [], "endpoints 44772 + 18080, ping": [], "first command result (POST /command)": [], "delete": [], "all of it": []}
    c = httpx.Client(base_url=f"http://{domain}", headers={"OPEN-SANDBOX-API-KEY": key})
    body = {"image": {"uri": "host"}, "entrypoint": ["tail", "-f", "/dev/null"], "timeout": 600, "resourceLimits": {"cpu": "1", "memory": "2Gi"}, "secureAccess": False}
    for i in range(WARMUP + runs):
        t0 = time.perf_counter()
        sid = c.post("/v1/sandboxes", json=body).json()["id"]
        t1 = time.perf_counter()
        ep = c.get(f"/v1/sandboxes/{sid}/endpoints/44772", params={"use_server_proxy": "false"}).json()
        c.get(f"/v1/sandboxes/{sid}/endpoints/18080", params={"use_server_proxy": "false"})
        prefix = ep["endpoint"].split("/", 1)[1]
        c.get(f"/{prefix}/ping", headers=ep["headers"]).raise_for_status()
        t2 = time.perf_counter()
        out = c.post(f"/{prefix}/command", json={"command": "echo hi"}, headers=ep["headers"]).text
        t3 = time.perf_counter()
        c.delete(f"/v1/sandboxes/{sid}").raise_for_status()
        t4 = time.perf_counter()
        if '"hi"' not in out or "execution_complete" not in out:
            sys.exit(f"raw round {i}: unexpected stream {out!r}")
        if i < WARMUP:
            continue
        for k, v in zip(raw, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
            raw[k].append(v * 1000)
    print_table(f"same requests, one kept-alive httpx client ({runs} runs)", raw)


if __name__ == "__main__":
    main()
