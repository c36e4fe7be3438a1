"""HTTPS requests to one URL, timed: `egress_client.py URL N MODE [CAFILE]`.

MODE `new`: a new connection (TCP + TLS, through $HTTPS_PROXY's CONNECT when set) per
request; `keep`: one connection for all of them (what a client with a pool does). Trusts
CAFILE, else the default verify paths ($SSL_CERT_FILE). Prints one JSON line: p50 and p95
per request in ms, requests/s, and the status counts. Standard library only.
"""
import http.client
import json
import os
import ssl
import statistics
import sys
import time
from urllib.parse import urlsplit

url, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile=sys.argv[4] if len(sys.argv) > 4 else None)
u = urlsplit(url)
proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")


def connect():
    if proxy:
        p = urlsplit(proxy)
        c = http.client.HTTPSConnection(p.hostname, p.port, context=ctx, timeout=30)
        c.set_tunnel(u.hostname, u.port)
    else:
        c = http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=30)
    return c


times, statuses = [], {}
conn = connect() if mode == "keep" else None
start = time.perf_counter()
for i in range(n):
    t0 = time.perf_counter()
    c = conn or connect()
    c.request("GET", u.path or "/")
    r = c.getresponse()
    r.read()
    statuses[r.status] = statuses.get(r.status, 0) + 1
    if conn is None or r.getheader("Connection", "").lower() == "close":
        c.close()
        conn = None if mode != "keep" else connect()
    times.append((time.perf_counter() - t0) * 1000)
total = time.perf_counter() - start
times.sort()
print(json.dumps({
    "p50_ms": round(statistics.median(times), 3),
    "p95_ms": round(times[int(len(times) * 0.95) - 1], 3),
    "rps": round(n / total, 1),
    "statuses": statuses,
}))
