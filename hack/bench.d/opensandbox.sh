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
# shellcheck source=common.sh
. "$repo/hack/bench.d/common.sh"
runs=${RUNS:-200}
pool_size=${POOL_SIZE:-8}

venv=$repo/.venv/test
bench_venv "$venv" 'import importlib.metadata as m, sys; sys.exit(m.version("opensandbox") != "1.1.1")' opensandbox==1.1.1
bench_setup osb
bench_serve --listen "127.0.0.1:$port" --pool-size "$pool_size"
bench_pool_full
# No --api-key: serve made one in the state dir's key file (what the SDK is then given).
table=$(OSB_API_KEY=$(cat "$AGENTRUN_STATE_DIR/api-key") "$venv/bin/python" "$repo/hack/bench.d/osb_latency.py" "127.0.0.1:$port" "$runs")
echo "$table" >"$tmp/table.md"
pool=$(bench_pool_summary)
bench_serve_stop
bench_leftovers
echo "Machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg); RUNS=$runs POOL_SIZE=$pool_size hack/bench opensandbox"
echo
echo "### OpenSandbox SDK (opensandbox==1.1.1, sync) against agentrun serve --listen, image \"host\""
echo
echo "$table"
echo
echo "Pool: $pool. Left behind: ${left:-nothing}."
