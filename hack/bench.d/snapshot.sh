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
# shellcheck source=common.sh
. "$repo/hack/bench.d/common.sh"
runs=${RUNS:-10}
size_mb=${SIZE_MB:-100}

venv=$repo/.venv/test
bench_venv "$venv" 'import importlib.metadata as m, sys; sys.exit(m.version("opensandbox") != "1.1.1")' opensandbox==1.1.1
bench_setup snapshot
bench_serve --listen "127.0.0.1:$port" --pool-size 2
bench_pool_full
table=$(AGENTRUN="$tmp/agentrun" OSB_API_KEY=$(cat "$AGENTRUN_STATE_DIR/api-key") \
    "$venv/bin/python" "$repo/hack/bench.d/snapshot.py" "127.0.0.1:$port" "$runs" "$size_mb")
left_snapshots=$("$tmp/agentrun" snapshot ls --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
bench_serve_stop
bench_leftovers
echo "Machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg); RUNS=$runs SIZE_MB=$size_mb hack/bench snapshot"
echo
echo "### Snapshots (OpenSandbox SDK 1.1.1, sync) against agentrun serve --listen, image \"host\""
echo
echo "$table"
echo
echo "Snapshots left: $left_snapshots. Left behind: ${left:-nothing}."
