#!/usr/bin/python3
"""Markdown rows for one hyperfine session: table.py [--p99] WORKLOAD STATUS_TSV [JSON]

STATUS_TSV lists every tool in table order as `name<TAB>reason`; an empty reason means it ran
in the session (JSON from hyperfine --export-json), otherwise the row says unavailable.
Median and p95 (--p99: and p99) of whole-process wall time; runs that exited non-zero are
counted in the row.
"""
import json
import sys

argv = sys.argv[1:]
p99 = "--p99" in argv
if p99:
    argv.remove("--p99")
workload, status = argv[0], argv[1]
results = {}
if len(argv) > 2:
    for r in json.load(open(argv[2]))["results"]:
        results[r.get("command_name", r["command"])] = r
for line in open(status):
    name, _, reason = line.rstrip("\n").partition("\t")
    r = results.get(name)
    if reason or r is None:
        print(f"| `{workload}` | {name} | unavailable: {reason or 'not run'} | |{' |' if p99 else ''}")
        continue
    t = sorted(r["times"])

    def pct(q):
        return t[min(len(t) - 1, int(round(q * (len(t) - 1))))] * 1000

    failed = sum(1 for c in r.get("exit_codes", []) if c != 0)
    note = f" ({failed} of {len(t)} runs failed)" if failed else ""
    tail = f" {pct(0.99):.1f} |" if p99 else ""
    print(f"| `{workload}` | {name}{note} | {r['median'] * 1000:.1f} | {pct(0.95):.1f} |{tail}")
