#!/usr/bin/python3
"""Closed-loop load generator: N client threads, each running CMD back to back for SECS.

    load.py --clients N --secs S [--timeout T] -- CMD [ARG...]

Every run is a fresh process (subprocess, stdin/stdout from/to /dev/null, stderr captured);
a run is an error when it exits non-zero or takes longer than --timeout (it is then killed).
Clients start no run after the deadline; runs in flight then finish (bounded by --timeout),
and the rate is completed runs / time until the last one ended. Prints one JSON object:
clients, secs, runs, ok, errors, runs_per_s (successful runs only), p50_ms, p99_ms
(over all runs), first_error.
"""
import argparse
import json
import subprocess
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--secs", type=float, required=True)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    lock = threading.Lock()
    lat, errors, first_error = [], [0], [None]
    start = time.monotonic()
    deadline = start + a.secs

    def client():
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            try:
                p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, timeout=a.timeout)
                err = None if p.returncode == 0 else \
                    f"exit {p.returncode}: {p.stderr.decode(errors='replace').strip()[:200]}"
            except subprocess.TimeoutExpired:
                err = f"timed out after {a.timeout}s"
            dt = time.monotonic() - t0
            with lock:
                lat.append(dt)
                if err:
                    errors[0] += 1
                    first_error[0] = first_error[0] or err

    threads = [threading.Thread(target=client, daemon=True) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(a.secs + a.timeout + 5)
    elapsed = time.monotonic() - start
    lat.sort()

    def pct(p):
        return round(lat[min(len(lat) - 1, int(round(p * (len(lat) - 1))))] * 1000, 1) if lat else None

    ok = len(lat) - errors[0]
    print(json.dumps({"clients": a.clients, "secs": round(elapsed, 2), "runs": len(lat), "ok": ok,
                      "errors": errors[0], "runs_per_s": round(ok / elapsed, 1),
                      "p50_ms": pct(0.50), "p99_ms": pct(0.99), "first_error": first_error[0]}))


if __name__ == "__main__":
    main()
