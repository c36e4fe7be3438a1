#!/usr/bin/env bash
# `hack/bench snapshot`: snapshots through the official OpenSandbox SDK against `agentrun
# serve --listen` (hack/bench.d/snapshot.py): a snapshot of a sandbox with SIZE_MB written
# (POST -> Ready), a create from it (the files-only resume, to its first command) against a
# plain create, and the sandbox's memory before and after a pause to disk (snapshot + delete).
#
#   RUNS=10 hack/bench snapshot          # rounds (default 10)
#   SIZE_MB=100 hack/bench snapshot      # MB the sandbox writes before its snapshot (default 100)
#   AGENTRUN_BIN=path hack/bench snapshot
#
# The daemon gets a private state dir (tmpfs) and image root under a temp dir and a free
# loopback port; it is stopped with SIGTERM and the script checks nothing is left.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
runs=${RUNS:-10}
size_mb=${SIZE_MB:-100}

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
tmp=$(mktemp -d /tmp/agentrun-snapshot-bench.XXXXXX)
chmod 755 "$tmp"
cp "$src" "$tmp/agentrun"
export AGENTRUN_STATE_DIR=$tmp/state AGENTRUN_ROOT=$tmp/root
mkdir -p "$AGENTRUN_STATE_DIR"
mount -t tmpfs -o mode=0755,size=512m agentrun-bench-state "$AGENTRUN_STATE_DIR"
unset OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$tmp/agentrun" serve --listen "127.0.0.1:$port" --pool-size 2 >"$tmp/serve.log" 2>&1 &
pid=$!
stop() {
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
trap 'stop; umount "$tmp/state" 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 600); do
    ready=$("$tmp/agentrun" pool status --json 2>/dev/null | python3 -c 'import json,sys; p=json.load(sys.stdin)["pools"][0]; print(p["ready"] >= p["target"])' 2>/dev/null || true)
    [ "$ready" = True ] && break
    sleep 0.1
done
table=$(AGENTRUN="$tmp/agentrun" OSB_API_KEY=$(cat "$AGENTRUN_STATE_DIR/api-key") \
    "$venv/bin/python" "$repo/hack/bench.d/snapshot.py" "127.0.0.1:$port" "$runs" "$size_mb")
left_snapshots=$("$tmp/agentrun" snapshot ls --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
stop
left=$(find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d -path '*/agentrun/*' 2>/dev/null | while read -r d; do [ -e "$tmp/state/sandboxes/$(basename "$d")" ] && echo "$d"; done || true)
left+=$(ls -A "$tmp/state/sandboxes" 2>/dev/null || true)
left+=$(awk -v p="$tmp/" -v s="$tmp/state" 'index($5, p) == 1 && $5 != s { print $5 }' /proc/self/mountinfo)
echo "Machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg); RUNS=$runs SIZE_MB=$size_mb hack/bench snapshot"
echo
echo "### Snapshots (OpenSandbox SDK 1.1.1, sync) against agentrun serve --listen, image \"host\""
echo
echo "$table"
echo
echo "Snapshots left: $left_snapshots. Left behind: ${left:-nothing}."
