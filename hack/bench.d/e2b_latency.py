"""E2B SDK latency against `agentrun serve --e2b` (used by `hack/bench e2b`).

    python e2b_latency.py ADDR RUNS

As a user of the official SDKs (e2b==2.63.0, e2b-code-interpreter==2.11.5, sync) does, one
sandbox at a time: `Sandbox.create()` (template `base`), `commands.run("echo hi")` (the first
command's result), `kill()`; then, in one `code-interpreter-v1` sandbox, `run_code("1+1")`
back to back. Prints a markdown table of p50/p99 per step (milliseconds), after WARMUP
untimed rounds. Then the same HTTP requests the SDK makes (create, envd's `Start` stream read
to its end, delete; `/execute`) sent by one kept-alive httpx client, to separate agentrun's
time from the SDK's own. E2B_API_KEY: the daemon's API key.
"""

import json
import os
import struct
import sys
import time

import httpx

ADDR = sys.argv[1]
BASE = f"http://{ADDR}"
os.environ["E2B_API_URL"] = BASE
os.environ["E2B_SANDBOX_URL"] = BASE
os.environ.pop("E2B_DOMAIN", None)

from e2b import Sandbox  # noqa: E402
from e2b_code_interpreter import Sandbox as CodeSandbox  # noqa: E402

import latency  # noqa: E402  (hack/bench.d)

WARMUP = 5


def print_table(title, steps):
    latency.print_table(title, steps)
    print()


def sdk_rounds(runs):
    steps = {"create": [], "first commands.run result": [], "kill": [],
             "create -> first result": [], "create -> first result -> kill": []}
    for i in range(WARMUP + runs):
        t0 = time.perf_counter()
        sbx = Sandbox.create()
        t1 = time.perf_counter()
        r = sbx.commands.run("echo hi")
        t2 = time.perf_counter()
        sbx.kill()
        t3 = time.perf_counter()
        if r.stdout != "hi\n" or r.exit_code != 0:
            sys.exit(f"round {i}: unexpected result {r.stdout!r} exit {r.exit_code}")
        if i < WARMUP:
            continue
        for k, v in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t2 - t0, t3 - t0)):
            steps[k].append(v * 1000)
    print_table(f"E2B SDK step ({runs} runs, sequential)", steps)


def sdk_code(runs):
    steps = {'run_code("1+1")': []}
    sbx = CodeSandbox.create()
    try:
        for i in range(WARMUP + runs):
            t0 = time.perf_counter()
            e = sbx.run_code("1+1")
            t1 = time.perf_counter()
            if [r.text for r in e.results] != ["2"]:
                sys.exit(f"run_code round {i}: {e}")
            if i >= WARMUP:
                steps['run_code("1+1")'].append((t1 - t0) * 1000)
    finally:
        sbx.kill()
    print_table(f"E2B code interpreter SDK, one sandbox ({runs} runs)", steps)


def envelope(msg):
    data = json.dumps(msg).encode()
    return struct.pack(">BI", 0, len(data)) + data


def raw_rounds(runs):
    key = os.environ["E2B_API_KEY"]
    c = httpx.Client(base_url=BASE, headers={"X-API-Key": key}, timeout=60)
    steps = {"create (POST /sandboxes)": [], "first result (Start stream to its end)": [],
             "kill (DELETE)": [], "all of it": []}
    start = envelope({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {}},
                      "stdin": False})
    for i in range(WARMUP + runs):
        t0 = time.perf_counter()
        s = c.post("/sandboxes", json={"templateID": "base"}).json()
        t1 = time.perf_counter()
        envd = {"E2b-Sandbox-Id": s["sandboxID"], "E2b-Sandbox-Port": "49983",
                "X-Access-Token": s["envdAccessToken"],
                "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
        out = c.post("/process.Process/Start", content=start, headers=envd).content
        t2 = time.perf_counter()
        c.delete(f"/sandboxes/{s['sandboxID']}").raise_for_status()
        t3 = time.perf_counter()
        if b'"exitCode"' not in out and b'"exited"' not in out:
            sys.exit(f"raw round {i}: unexpected stream {out!r}")
        if i < WARMUP:
            continue
        for k, v in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
            steps[k].append(v * 1000)
    print_table(f"same requests, one kept-alive httpx client ({runs} runs)", steps)
    s = c.post("/sandboxes", json={"templateID": "code-interpreter-v1"}).json()
    jup = {"E2b-Sandbox-Id": s["sandboxID"], "E2b-Sandbox-Port": "49999",
           "X-Access-Token": s["envdAccessToken"]}
    steps = {"POST /execute 1+1": []}
    try:
        for i in range(WARMUP + runs):
            t0 = time.perf_counter()
            out = c.post("/execute", json={"code": "1+1"}, headers=jup).text
            t1 = time.perf_counter()
            if '"2"' not in out:
                sys.exit(f"raw execute round {i}: {out!r}")
            if i >= WARMUP:
                steps["POST /execute 1+1"].append((t1 - t0) * 1000)
    finally:
        c.delete(f"/sandboxes/{s['sandboxID']}")
    print_table(f"/execute, one kept-alive httpx client ({runs} runs)", steps)


def main():
    runs = int(sys.argv[2])
    sdk_rounds(runs)
    sdk_code(runs)
    raw_rounds(runs)


if __name__ == "__main__":
    main()
