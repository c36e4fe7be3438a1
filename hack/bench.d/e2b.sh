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
# shellcheck source=common.sh
. "$repo/hack/bench.d/common.sh"
if [ -n "${SMOKE:-}" ]; then
    runs=${RUNS:-3}
    pool_size=${POOL_SIZE:-2}
    : "${AGENTRUN_BIN:=$repo/target/debug/agentrun}"
else
    runs=${RUNS:-200}
    pool_size=${POOL_SIZE:-8}
fi

venv=$repo/.venv/e2b
bench_venv "$venv" 'import importlib.metadata as m, sys; sys.exit(m.version("e2b") != "2.63.0" or m.version("e2b-code-interpreter") != "2.11.5")' \
    e2b==2.63.0 e2b-code-interpreter==2.11.5
bench_setup e2b
bench_serve --e2b "127.0.0.1:$port" --pool-size "$pool_size"
bench_pool_full
# No --api-key: serve made one in the state dir's key file (what the SDK is then given).
table=$(E2B_API_KEY=$(cat "$AGENTRUN_STATE_DIR/api-key") "$venv/bin/python" "$repo/hack/bench.d/e2b_latency.py" "127.0.0.1:$port" "$runs") || {
    echo "hack/bench e2b: the latency script failed; the daemon's log:" >&2
    tail -n 50 "$tmp/serve.log" >&2
    exit 1
}
pool=$(bench_pool_summary)
bench_serve_stop
bench_leftovers
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
