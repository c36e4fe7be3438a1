#!/usr/bin/env bash
# `hack/bench fork`: fork (agentrun's `POST /v1/sandboxes/{id}/fork`) of a sandbox whose code
# context holds a 100 MB numpy array into 10 copies: the POST, and the POST to the last copy's
# first print and to its first execution in its context (the state carried, checked); memory
# (PSS, memory cgroups) of the 10 copies against 10 independent sandboxes that each computed
# the array (hack/bench.d/fork.py). A fork carries files and its contexts' globals (a
# semantic fork, not a memory fork: docs/opensandbox-compat.md#fork): the copies' arrays are
# mapped copy-on-write from the fork's frozen layer.
#
#   hack/bench fork                       # 10 copies of 100 MB
#   SMOKE=1 hack/bench fork               # 2 copies of 10 MB: that the script works
#   POOL_SIZE=12 hack/bench fork          # ready shells kept (default 2: 8 of the 10 copies
#                                         # then wait for a shell made on demand)
#   PROFILE=code-interpreter hack/bench fork   # the sandboxes' profile (default `default`); one
#                                         # with a Python zygote forks the copies' contexts
#   AGENTRUN_BIN=path hack/bench fork
#
# The daemon gets a private state dir (tmpfs) and image root under a temp dir and a free
# loopback port; it is stopped with SIGTERM and the script says what is left (cgroups,
# mounts, state dirs). The SDK comes from .venv/test (as hack/test makes it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
# shellcheck source=common.sh
. "$repo/hack/bench.d/common.sh"
copies=10
mb=100
if [ -n "${SMOKE:-}" ]; then
    copies=2
    mb=10
fi
venv=$repo/.venv/test
"$venv/bin/python" -c 'import opensandbox, code_interpreter, httpx' 2>/dev/null || {
    echo "bench fork: $venv lacks the OpenSandbox SDKs (run hack/test once)" >&2
    exit 1
}
bench_setup fork
pool_size=${POOL_SIZE:-2}
profile=${PROFILE:-default}
bench_serve --listen "127.0.0.1:$port" --pool "host:$profile=$pool_size" --opensandbox-profile "$profile" --max-sandboxes $((2 * copies + pool_size + 2))
for _ in $(seq 600); do
    [ -s "$AGENTRUN_STATE_DIR/api-key" ] && "$tmp/agentrun" pool status --json >/dev/null 2>&1 && break
    sleep 0.1
done
bench_pool_full # the copies' shells are the pool's ready ones first
table=$(OSB_API_KEY=$(cat "$AGENTRUN_STATE_DIR/api-key") "$venv/bin/python" "$repo/hack/bench.d/fork.py" \
    "127.0.0.1:$port" "$tmp/agentrun" "$AGENTRUN_STATE_DIR" "$serve_pid" "$copies" "$mb") || {
    tail -20 "$tmp/serve.log" >&2
    exit 1
}
bench_serve_stop
bench_leftovers
echo "Machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg); ${SMOKE:+SMOKE=1 }POOL_SIZE=$pool_size PROFILE=$profile hack/bench fork"
echo
echo "### Fork of a sandbox whose code context holds ${mb} MB into ${copies} copies"
echo
echo "$table"
echo
echo "Left behind: ${left:-nothing}."
