#!/usr/bin/python3
"""`hack/bench python`'s check that warm runs really use (or do not use) the Python zygote,
from each run's `sandbox.exec` span: a throwaway OTLP/HTTP (JSON) receiver on 127.0.0.1, and
`agentrun exec` run with OTEL_EXPORTER_OTLP_ENDPOINT pointing at it (only these runs export:
the timed ones do not).

    python.py warm BIN PROFILE EXPECT WANT PARALLEL ROUNDS SECS -- CMD...
        Rounds of PARALLEL concurrent `BIN exec --profile PROFILE -- CMD...` (as many as the
        pool has shells, so that every ready shell is used, not only the one a sequential
        client gets back each time), until ROUNDS rounds in a row had every run good: exit 0,
        stdout EXPECT, a pool hit, and `sandbox.zygote` true (WANT=yes) or false/absent
        (WANT=no). A fresh shell's first runs may fall back while its zygote imports.
        Gives up after SECS. Prints one JSON object (ok, reason, runs, rounds, zygote counts,
        fallback reasons, shells seen); exit 0 when ok.
    python.py count BIN PROFILE N -- CMD...
        N runs back to back; prints one line: how many used the zygote, fell back (and why),
        had no `sandbox.zygote`.
"""
import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """OTLP/HTTP traces receiver (JSON bodies: OTEL_EXPORTER_OTLP_PROTOCOL=http/json)."""

    def __init__(self):
        self.spans, self.errors = [], []
        self.lock = threading.Lock()
        rx = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    if not self.path.endswith("/v1/traces"):
                        raise ValueError(f"unexpected path {self.path}")
                    spans = list(iter_spans(json.loads(body)))
                    with rx.lock:
                        rx.spans.extend(spans)
                    code, out = 200, b"{}"
                except (ValueError, KeyError, TypeError, AttributeError) as e:
                    with rx.lock:
                        rx.errors.append(f"{e} (content type {self.headers.get('Content-Type')})")
                    code, out = 400, b"{}"
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def take(self):
        with self.lock:
            out, self.spans = self.spans, []
        return out


def value(v):
    """An OTLP JSON AnyValue as a Python value."""
    if not isinstance(v, dict):
        return v
    for k in ("boolValue", "stringValue", "doubleValue", "bool_value", "string_value"):
        if k in v:
            return v[k]
    for k in ("intValue", "int_value"):
        if k in v:
            return int(v[k])
    return next(iter(v.values()), None)


def hex_id(x):
    if isinstance(x, str) and len(x) in (16, 32) and all(c in "0123456789abcdefABCDEF" for c in x):
        return x.lower()
    try:
        return base64.b64decode(x).hex()
    except (ValueError, TypeError):
        return str(x)


def iter_spans(req):
    for rs in req.get("resourceSpans") or req.get("resource_spans") or []:
        for ss in rs.get("scopeSpans") or rs.get("scope_spans") or []:
            for sp in ss.get("spans", []):
                attrs = {a["key"]: value(a.get("value")) for a in sp.get("attributes", [])}
                yield {"name": sp.get("name"), "trace_id": hex_id(sp.get("traceId") or
                                                                  sp.get("trace_id")),
                       "attrs": attrs}


def run_once(bin_, profile, cmd, env, trace_id):
    """One `agentrun exec`; its TRACEPARENT names the trace its span is found by."""
    e = dict(env, TRACEPARENT=f"00-{trace_id}-{os.urandom(8).hex()}-01")
    try:
        p = subprocess.run([bin_, "exec", "--profile", profile, "--", *cmd], env=e,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        return p.returncode, p.stdout.decode(errors="replace").strip(), \
            p.stderr.decode(errors="replace").strip()
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after 60 s"


class Runner:
    def __init__(self, bin_, profile, cmd):
        self.bin, self.profile, self.cmd = bin_, profile, cmd
        self.rx = Receiver()
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("OTEL_") and k not in ("AGENTRUN_NO_DAEMON", "TRACEPARENT")}
        self.env.update(OTEL_EXPORTER_OTLP_ENDPOINT=self.rx.endpoint,
                        OTEL_EXPORTER_OTLP_PROTOCOL="http/json",
                        OTEL_EXPORTER_OTLP_TIMEOUT="3000")

    def round(self, n):
        """n concurrent runs: [(exit, stdout, stderr, span attributes or None)]."""
        ids = [os.urandom(16).hex() for _ in range(n)]
        res = [None] * n

        def one(i):
            res[i] = run_once(self.bin, self.profile, self.cmd, self.env, ids[i])

        ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        # The span is exported before `agentrun exec` exits; a moment for the handler thread.
        deadline = time.monotonic() + 1
        spans = {}
        while True:
            for s in self.rx.take():
                if s["name"] == "sandbox.exec":
                    spans[s["trace_id"]] = s["attrs"]
            if all(i in spans for i in ids) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return [(*res[i], spans.get(ids[i])) for i in range(n)]


def zygote_state(attrs):
    if attrs is None:
        return "no span"
    z = attrs.get("sandbox.zygote")
    return "absent" if z is None else ("true" if z is True else "false")


def warm(bin_, profile, expect, want, parallel, rounds, secs, cmd):
    r = Runner(bin_, profile, cmd)
    start = time.monotonic()
    deadline = start + secs
    states, fallbacks, shells, bad = Counter(), Counter(), set(), Counter()
    runs = streak = done = 0
    last_bad = ""
    while streak < rounds and time.monotonic() < deadline:
        good = True
        for code, out, err, attrs in r.round(parallel):
            runs += 1
            st = zygote_state(attrs)
            states[st] += 1
            if attrs and attrs.get("sandbox.zygote_fallback"):
                fallbacks[str(attrs["sandbox.zygote_fallback"])[:120]] += 1
            why = None
            if code != 0:
                why = f"exit {code}: {err[:200]}"
            elif out != expect:
                why = f"printed {out[:80]!r}, expected {expect!r}"
            elif attrs is None:
                why = "no span received"
            elif attrs.get("sandbox.pool_hit") is not True:
                why = "not a pool hit"
            elif want == "yes" and st != "true":
                why = f"sandbox.zygote {st}"
            elif want == "no" and st == "true":
                why = "sandbox.zygote true in a profile without the zygote"
            if why:
                good = False
                bad[why.split(":")[0]] += 1
                last_bad = why
            elif attrs.get("sandbox.id"):
                shells.add(attrs["sandbox.id"])
        done += 1
        streak = streak + 1 if good else 0
    ok = streak >= rounds
    res = {"ok": ok, "runs": runs, "rounds": done, "secs": round(time.monotonic() - start, 1),
           "zygote": dict(states), "fallbacks": dict(fallbacks), "not_good": dict(bad),
           "shells_good": len(shells)}
    if r.rx.errors:
        res["receiver_errors"] = r.rx.errors[:3]
    if not ok:
        what = "runs did not use the zygote" if want == "yes" else "runs were not all good"
        detail = ", ".join(f"sandbox.zygote {k}: {v}" for k, v in sorted(states.items()))
        if fallbacks:
            detail += "; fallbacks: " + ", ".join(f"{k} ({v})" for k, v in fallbacks.most_common(3))
        if want == "yes" and states and set(states) <= {"absent"}:
            detail += " (no span has sandbox.zygote: this agentrun has no zygote)"
        if set(states) <= {"no span"}:
            detail += f" (no span reached the receiver{': ' + r.rx.errors[0] if r.rx.errors else ''})"
        res["reason"] = (f"{what} within {secs:.0f} s ({runs} runs, {parallel} at a time, "
                         f"{rounds} good rounds in a row wanted): {detail}; last: {last_bad}")
    print(json.dumps(res))
    return 0 if ok else 1


def count(bin_, profile, n, cmd):
    r = Runner(bin_, profile, cmd)
    states, fallbacks, failed = Counter(), Counter(), 0
    for _ in range(n):
        code, _out, _err, attrs = r.round(1)[0]
        failed += code != 0
        states[zygote_state(attrs)] += 1
        if attrs and attrs.get("sandbox.zygote_fallback"):
            fallbacks[str(attrs["sandbox.zygote_fallback"])[:120]] += 1
    parts = [f"{states['true']} used the zygote"]
    if states["false"]:
        why = ", ".join(f"{k}: {v}" for k, v in fallbacks.most_common(3))
        parts.append(f"{states['false']} fell back{f' ({why})' if why else ''}")
    if states["absent"]:
        parts.append(f"{states['absent']} without sandbox.zygote")
    if states["no span"]:
        parts.append(f"{states['no span']} without a span")
    if failed:
        parts.append(f"{failed} failed")
    print(f"{n} runs: " + ", ".join(parts))


def main():
    args = sys.argv[1:]
    cmd = args[args.index("--") + 1:] if "--" in args else []
    args = args[:args.index("--")] if "--" in args else args
    if args and args[0] == "warm" and len(args) == 8 and cmd:
        _, bin_, profile, expect, want, parallel, rounds, secs = args
        sys.exit(warm(bin_, profile, expect, want, int(parallel), int(rounds), float(secs), cmd))
    if args and args[0] == "count" and len(args) == 4 and cmd:
        count(args[1], args[2], int(args[3]), cmd)
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
