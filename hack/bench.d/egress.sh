#!/usr/bin/env bash
# `hack/bench egress`: what the egress proxy costs an HTTPS client, in one session. A TLS
# server on the host's loopback (tests/src/bearer_server.py, the credential tests' server:
# Python's http.server, HTTP/1.1 keep-alive, a certificate from a CA made here with openssl)
# answers GET / (15 bytes); a client (hack/bench.d/egress_client.py) sends REQUESTS
# requests to it and reports p50/p95 per request and requests/s:
#
#   - direct: from the host, no sandbox, no proxy;
#   - tunnelled: from a sandbox (`agentrun exec --allow-host`), through the proxy's plain
#     CONNECT tunnel (the proxy never sees inside);
#   - intercepted: from a sandbox with `--credential` bound to the server (TLS terminated by the
#     proxy with the run's CA, a bearer token added, TLS again to the server, verified with
#     `--egress-upstream-ca`).
#
# Each both with a new connection per request (`new`: TCP and TLS handshakes every time, and
# for intercepted ones a leaf lookup and the proxy's own TLS to the server) and with one
# kept-alive connection (`keep`: what interception adds per request after the first
# handshake; issue 34's target is at most 1 ms p50 over tunnelled).
#
#   REQUESTS=500 hack/bench egress      # requests per row (default 300)
#   SMOKE=1 hack/bench egress           # 20 requests per row: a sanity check, not a measurement
#   AGENTRUN_BIN=path hack/bench egress # default: the static release (hack/build-static)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
n=${REQUESTS:-300}
[ -n "${SMOKE:-}" ] && n=20
if [ -n "${AGENTRUN_BIN:-}" ]; then
    bin=$AGENTRUN_BIN
else
    bin=$("$repo/hack/build-static")
fi
tmp=$(mktemp -d /tmp/agentrun-egress-bench.XXXXXX)
chmod 755 "$tmp"
server_pid=
cleanup() { # under set -e: a server ended by our SIGTERM (wait: 143) must not stop the cleanup
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
cd "$tmp"
ossl() { openssl "$@" >/dev/null 2>&1; }
ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem \
    -days 2 -subj "/CN=bench upstream CA" -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign
ossl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr \
    -subj "/CN=bench upstream"
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >ext.cnf
ossl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 \
    -extfile ext.cnf
cp "$repo/hack/bench.d/egress_client.py" client.py
chmod 644 ./*.pem client.py
export BENCH_TOKEN=bench-token-not-a-secret
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# The credential tests' server (one copy), its connections kept alive, each response in one
# write; it says auth=ok when the bearer token came (the intercepted rows).
E2E_SECRET=$BENCH_TOKEN python3 "$repo/tests/src/bearer_server.py" 127.0.0.1 "$port" \
    server.pem server.key --keep-alive &
server_pid=$!
for _ in $(seq 100); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1).close()" 2>/dev/null && break
    sleep 0.1
done
url="https://127.0.0.1:$port/"
export AGENTRUN_NO_DAEMON=1
row() {
    local name=$1 mode=$2 out
    shift 2
    out=$("$@" "$mode")
    printf '| %s | %s | %s |\n' "$name" "$mode" \
        "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("{} | {} | {} | {}".format(r["p50_ms"], r["p95_ms"], r["rps"], r["statuses"]))' "$out")"
}
direct() { python3 client.py "$url" "$n" "$1" ca.pem; }
tunnelled() {
    "$bin" exec --allow-host "127.0.0.1:$port" --ro "$tmp:/bench" -- \
        python3 /bench/client.py "$url" "$n" "$1" /bench/ca.pem
}
intercepted() {
    "$bin" exec --credential "bench@127.0.0.1:$port=env:BENCH_TOKEN" \
        --egress-upstream-ca "$tmp/ca.pem" --ro "$tmp:/bench" -- \
        python3 /bench/client.py "$url" "$n" "$1"
}
echo "Machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg); REQUESTS=$n${SMOKE:+ SMOKE=1} hack/bench egress"
echo
echo "### HTTPS through the egress proxy (Python http.client, GET of 15 bytes, 127.0.0.1)"
echo
echo "| path | connection | p50 ms | p95 ms | requests/s | statuses |"
echo "|---|---|---|---|---|---|"
for mode in new keep; do
    row direct "$mode" direct
    row tunnelled "$mode" tunnelled
    row "intercepted (credential injected)" "$mode" intercepted
done
