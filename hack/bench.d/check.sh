#!/usr/bin/env bash
# `hack/bench --check [--short]`: the regression guard that cannot miss a timer on a run's
# path. In one session, against one `agentrun serve` of the binary under test, each shipped
# profile and front end next to its plain counterpart (same pool kind, same workload):
#   - CLI `exec` (warm): `--profile code-interpreter` and `--profile container` /bin/true
#     against `--profile default` /bin/true (one pool of each profile, image "host");
#   - docker-py `exec_run(["echo","x"])` (a hijacked exec start; its output checked every
#     run) against the same exec started without the hijack, on one container of a
#     `busybox:container` pool; docker-py stop() against kill + wait(), containers.run()
#     against run(detach) + wait() + logs() + remove();
#   - the OpenSandbox SDK's commands.run("echo hi") (a sandbox of image host) against the
#     CLI's warm `exec -- echo hi`.
# Each row's median must stay within 1.5x or +20 ms of its counterpart's, whichever is
# looser; the table is printed and the exit status is 1 past that (or when a row could not
# be measured). hyperfine -N measures the CLI rows when installed (else a timed loop).
#
#   AGENTRUN_BIN=path   the binary to check (default: target/debug/agentrun; ratios on one
#                       binary, so a debug build will do)
#   --short             CI mode (hack/test): 20 runs per row instead of 60 (~1 min in all)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
runs=60
for a in "$@"; do
    case $a in
        --check) ;;
        --short) runs=20 ;;
        *) echo "bench --check: unknown argument $a" >&2; exit 2 ;;
    esac
done
src=${AGENTRUN_BIN:-$repo/target/debug/agentrun}
[ -x "$src" ] || { echo "bench --check: no binary at $src (cargo build, or AGENTRUN_BIN=path)" >&2; exit 2; }
# A Python with docker-py and the OpenSandbox SDK: hack/test's pinned venv, else python3
# (PATH), else the system's (a row whose client is missing fails).
py=/usr/bin/python3
for p in "$repo/.venv/test/bin/python" "$(command -v python3 || true)"; do
    if [ -x "$p" ] && "$p" -c 'import docker, opensandbox' 2>/dev/null; then py=$p; break; fi
done

tmp=$(mktemp -d /tmp/agentrun-check.XXXXXX)
chmod 755 "$tmp" # the sandbox uid must search the state dir and image root
cp "$src" "$tmp/agentrun"
bin=$tmp/agentrun
export AGENTRUN_STATE_DIR=$tmp/state AGENTRUN_ROOT=$tmp/root
mkdir -p "$AGENTRUN_STATE_DIR"
unset AGENTRUN_NO_DAEMON OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT DOCKER_HOST
daemon_pid=
cleanup() {
    if [ -n "$daemon_pid" ]; then
        kill -TERM "$daemon_pid" 2>/dev/null || true
        for _ in $(seq 300); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$daemon_pid" 2>/dev/null || true
    fi
    if grep -q " $tmp/" /proc/self/mountinfo; then
        AGENTRUN_NO_DAEMON=1 timeout 60 "$bin" gc >/dev/null 2>&1 || true
    fi
    if grep -q " $tmp/" /proc/self/mountinfo; then
        echo "bench --check: mounts left under $tmp, not removing it" >&2
    else
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The images: "host" (built on first use) and busybox for the Docker API's containers.
AGENTRUN_NO_DAEMON=1 timeout 120 "$bin" exec -- /bin/true >/dev/null
"$repo/images/busybox/build.sh" "$tmp/busybox" >/dev/null
AGENTRUN_NO_DAEMON=1 "$bin" image add busybox "$tmp/busybox" --cmd /bin/sh >/dev/null
rm -rf "$tmp/busybox"

dsock=$tmp/docker.sock
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin" serve --pool host:default=2 --pool host:code-interpreter=2 --pool host:container=2 \
    --pool busybox:container=2 --docker-socket "$dsock" --listen "127.0.0.1:$port" \
    >"$tmp/serve.log" 2>&1 &
daemon_pid=$!
if ! "$py" "$repo/hack/bench.d/pool.py" wait-socket "$AGENTRUN_STATE_DIR/agentrun.sock" "$daemon_pid" 60 >/dev/null ||
    ! "$py" "$repo/hack/bench.d/pool.py" wait-full "$bin" "$AGENTRUN_STATE_DIR" 60 >/dev/null; then
    echo "bench --check: the daemon did not come up: $(tail -n 3 "$tmp/serve.log")" >&2
    exit 1
fi
for _ in $(seq 100); do [ -S "$dsock" ] && break; sleep 0.1; done

echo "### hack/bench --check ($runs runs per row; $(basename "$src"), $("$bin" --version 2>/dev/null | head -n1))"
echo
rc=0
# No --api-key: serve made one in the state dir's key file.
OSB_DOMAIN=127.0.0.1:$port OSB_API_KEY=$(cat "$AGENTRUN_STATE_DIR/api-key") \
    "$py" "$repo/hack/bench.d/check.py" "$bin" "$runs" "$dsock" || rc=$?
echo
if [ $rc -eq 0 ]; then
    echo "bench --check: ok (every row within 1.5x or +20 ms of its counterpart)"
else
    echo "bench --check: FAILED (a row past 1.5x or +20 ms of its counterpart, or not measured)"
fi
exit $rc
