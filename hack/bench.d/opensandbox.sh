#!/usr/bin/env bash
# `hack/bench opensandbox`: latency of the official OpenSandbox SDK against `agentrun serve
# --listen`: SDK create -> first command result -> kill, p50/p99 (hack/bench.d/osb_latency.py).
#
#   RUNS=200 hack/bench opensandbox        # rounds (default 200), after 5 untimed ones
#   POOL_SIZE=8 hack/bench opensandbox     # ready sandboxes kept (default 8)
#   AGENTRUN_BIN=path hack/bench opensandbox
#
# The daemon gets a private state dir and image root under a temp dir and a free loopback
# port; it is stopped with SIGTERM and the script checks nothing is left (cgroups, mounts,
# state dirs). The SDK comes from .venv/test (made here if missing, as hack/test does).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
runs=${RUNS:-200}
pool_size=${POOL_SIZE:-8}

venv=$repo/.venv/test
if ! "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("opensandbox") != "1.1.1")' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check opensandbox==1.1.1
fi
if [ -n "${AGENTRUN_BIN:-}" ]; then
    src=$AGENTRUN_BIN
else
    src=$("$repo/hack/build-static")
fi
tmp=$(mktemp -d /tmp/agentrun-osb-bench.XXXXXX)
chmod 755 "$tmp"
cp "$src" "$tmp/agentrun"
export AGENTRUN_STATE_DIR=$tmp/state AGENTRUN_ROOT=$tmp/root
# The state dir on a tmpfs, as the default /run/agentrun is on a standard host (see hack/bench).
mkdir -p "$AGENTRUN_STATE_DIR"
mount -t tmpfs -o mode=0755,size=512m agentrun-bench-state "$AGENTRUN_STATE_DIR"
unset OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$tmp/agentrun" serve --listen "127.0.0.1:$port" --pool-size "$pool_size" >"$tmp/serve.log" 2>&1 &
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
table=$(OSB_API_KEY=$(cat "$AGENTRUN_STATE_DIR/api-key") "$venv/bin/python" "$repo/hack/bench.d/osb_latency.py" "127.0.0.1:$port" "$runs")
echo "$table" >"$tmp/table.md"
pool=$("$tmp/agentrun" pool status --json | python3 -c 'import json,sys; s=json.load(sys.stdin); p=s["pools"][0]; print(p["hits"], "pool hits,", p["misses"], "misses; shells discarded:", s.get("discarded") or "none")')
stop
left=$(find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d -path '*/agentrun/*' 2>/dev/null | while read -r d; do [ -e "$tmp/state/sandboxes/$(basename "$d")" ] && echo "$d"; done || true)
left+=$(ls -A "$tmp/state/sandboxes" 2>/dev/null || true)
left+=$(awk -v p="$tmp/" -v s="$tmp/state" 'index($5, p) == 1 && $5 != s { print $5 }' /proc/self/mountinfo)
echo "Machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg); RUNS=$runs POOL_SIZE=$pool_size hack/bench opensandbox"
echo
echo "### OpenSandbox SDK (opensandbox==1.1.1, sync) against agentrun serve --listen, image \"host\""
echo
echo "$table"
echo
echo "Pool: $pool. Left behind: ${left:-nothing}."
