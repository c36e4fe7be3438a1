#!/usr/bin/env bash
# `hack/bench e2b`: latency of the official E2B SDKs against `agentrun serve --e2b`: SDK
# create -> first `commands.run` result -> kill, and `run_code("1+1")`, p50/p99, beside the
# same requests from one plain httpx client (hack/bench.d/e2b_latency.py).
#
#   RUNS=200 hack/bench e2b        # rounds (default 200), after 5 untimed ones
#   POOL_SIZE=8 hack/bench e2b     # ready sandboxes kept (default 8)
#   AGENTRUN_BIN=path hack/bench e2b
#   SMOKE=1 hack/bench e2b         # RUNS=3, POOL_SIZE=2, target/debug/agentrun: that the
#                                  # script works (no numbers to keep)
#
# The daemon gets a private state dir (on a tmpfs) and image root under a temp dir and a free
# loopback port; it is stopped with SIGTERM and the script checks nothing is left (cgroups,
# mounts, state dirs). The SDKs come from .venv/e2b (made here if missing, as hack/test does).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
if [ -n "${SMOKE:-}" ]; then
    runs=${RUNS:-3}
    pool_size=${POOL_SIZE:-2}
    : "${AGENTRUN_BIN:=$repo/target/debug/agentrun}"
else
    runs=${RUNS:-200}
    pool_size=${POOL_SIZE:-8}
fi

venv=$repo/.venv/e2b
if ! "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("e2b") != "2.63.0" or m.version("e2b-code-interpreter") != "2.11.5")' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check e2b==2.63.0 e2b-code-interpreter==2.11.5
fi
if [ -n "${AGENTRUN_BIN:-}" ]; then
    src=$AGENTRUN_BIN
else
    src=$("$repo/hack/build-static")
fi
tmp=$(mktemp -d /tmp/agentrun-e2b-bench.XXXXXX)
chmod 755 "$tmp"
cp "$src" "$tmp/agentrun"
export AGENTRUN_STATE_DIR=$tmp/state AGENTRUN_ROOT=$tmp/root
# The state dir on a tmpfs, as the default /run/agentrun is on a standard host (see hack/bench).
mkdir -p "$AGENTRUN_STATE_DIR"
mount -t tmpfs -o mode=0755,size=512m agentrun-bench-state "$AGENTRUN_STATE_DIR"
unset OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$tmp/agentrun" serve --e2b "127.0.0.1:$port" --pool-size "$pool_size" >"$tmp/serve.log" 2>&1 &
pid=$!
stop() {
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
trap 'stop; umount "$tmp/state" 2>/dev/null; rm -rf "$tmp"' EXIT
# Up, and the pool full (status lists ready == target), at most 60 s.
for _ in $(seq 600); do
    ready=$("$tmp/agentrun" pool status --json 2>/dev/null | python3 -c 'import json,sys; p=json.load(sys.stdin)["pools"][0]; print(p["ready"] >= p["target"])' 2>/dev/null || true)
    [ "$ready" = True ] && break
    sleep 0.1
done
# No --api-key: serve made one in the state dir's key file (what the SDK is then given).
table=$(E2B_API_KEY=$(cat "$AGENTRUN_STATE_DIR/api-key") "$venv/bin/python" "$repo/hack/bench.d/e2b_latency.py" "127.0.0.1:$port" "$runs") || {
    echo "hack/bench e2b: the latency script failed; the daemon's log:" >&2
    tail -n 50 "$tmp/serve.log" >&2
    exit 1
}
pool=$("$tmp/agentrun" pool status --json | python3 -c 'import json,sys; s=json.load(sys.stdin); p=s["pools"][0]; print(p["hits"], "pool hits,", p["misses"], "misses; shells discarded:", s.get("discarded") or "none")')
stop
left=$(find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d -path '*/agentrun/*' 2>/dev/null | while read -r d; do [ -e "$tmp/state/sandboxes/$(basename "$d")" ] && echo "$d"; done || true)
left+=$(ls -A "$tmp/state/sandboxes" 2>/dev/null || true)
left+=$(awk -v p="$tmp/" -v s="$tmp/state" 'index($5, p) == 1 && $5 != s { print $5 }' /proc/self/mountinfo)
echo "Machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg); ${SMOKE:+SMOKE=1 }RUNS=$runs POOL_SIZE=$pool_size hack/bench e2b"
echo
echo "### E2B SDKs (e2b==2.63.0, e2b-code-interpreter==2.11.5, sync) against agentrun serve --e2b, templates base / code-interpreter-v1 (image \"host\")"
echo
echo "$table"
echo
echo "Published anchors: E2B ~100-150 ms per create (its own cloud), CubeSandbox <60 ms claimed. Target (issue 32): create -> first result -> kill p50 at most 2x the plain client's and below 25 ms."
echo
echo "Pool: $pool. Left behind: ${left:-nothing}."
[ -z "$left" ]
