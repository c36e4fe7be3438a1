#!/usr/bin/python3
"""Markdown rows for one hyperfine session: table.py WORKLOAD STATUS_TSV [JSON]

STATUS_TSV lists every tool in table order as `name<TAB>reason`; an empty reason means it ran
in the session (JSON from hyperfine --export-json), otherwise the row says unavailable.
Median and p95 of whole-process wall time; runs that exited non-zero are counted in the row.
"""
import json
import sys

workload, status = sys.argv[1], sys.argv[2]
results = {}
if len(sys.argv) > 3:
    for r in json.load(open(sys.argv[3]))["results"]:
        results[r.get("command_name", r["command"])] = r
for line in open(status):
    name, _, reason = line.rstrip("\n").partition("\t")
    r = results.get(name)
    if reason or r is None:
        print(f"| `{workload}` | {name} | unavailable: {reason or 'not run'} | |")
        continue
    t = sorted(r["times"])
    p95 = t[min(len(t) - 1, int(round(0.95 * (len(t) - 1))))]
    failed = sum(1 for c in r.get("exit_codes", []) if c != 0)
    note = f" ({failed} of {len(t)} runs failed)" if failed else ""
    print(f"| `{workload}` | {name}{note} | {r['median'] * 1000:.1f} | {p95 * 1000:.1f} |")
