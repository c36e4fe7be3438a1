#!/usr/bin/env bash
# hack/bench rootless: agentrun as an ordinary user (rootless mode, docs/rootless.md) beside
# bubblewrap and sandlock run by the same user, in one session.
#
#   hack/bench rootless               # as root: makes a throwaway user, removes it at the end
#   SMOKE=1 hack/bench rootless       # RUNS=5 THROUGHPUT_SECS=1, no sandlock build: that it works
#   RUNS=200 THROUGHPUT_SECS=10 AGENTRUN_BIN=path OUT=file hack/bench rootless
#
# 1. Start latency (hyperfine -N, whole process, run by the user; median and p95) of
#    `/bin/true` and `/usr/bin/python3 -c 'print(1)'` under: agentrun exec (warm: the user's
#    `agentrun serve` running, its socket under the user's state dir), agentrun exec (cold:
#    --no-daemon), bubblewrap and sandlock ($bwrap_cmd, $sandlock_args of common.sh).
#    agentrun runs the `host` image (the host's /usr, read-only, as the other rows).
# 2. Throughput: `/bin/true` runs/s, p50 and p99 with 1 and 4 closed-loop clients
#    (hack/bench.d/load.py, run by the user) for the same four.
# The user's daemon is stopped with SIGTERM (bounded); no process of the user may be left.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py=/usr/bin/python3
tmp=$(mktemp -d /tmp/agentrun-bench-rootless.XXXXXX)
chmod 755 "$tmp"
stop_secs=30
daemon_pid=
# shellcheck source=common.sh
. "$repo/hack/bench.d/common.sh"
[ "$(id -u)" = 0 ] || { echo "bench rootless: run it as root (it makes a throwaway user)" >&2; exit 1; }
runs=${RUNS:-100} secs=${THROUGHPUT_SECS:-10}
if [ "${SMOKE:-0}" = 1 ]; then runs=5 secs=1; fi
bench_install "bench rootless" hyperfine:hyperfine bwrap:bubblewrap
if [ "${SMOKE:-0}" = 1 ] && [ ! -x "$repo/.venv/bench/bin/sandlock" ]; then
    sandlock='' sandlock_reason="not installed (SMOKE=1 does not build it)"
else
    bench_sandlock
fi
bin=${AGENTRUN_BIN:-$repo/target/release/agentrun}
[ -x "$bin" ] || bin=$repo/target/debug/agentrun
user=arbench$$ home=/home/arbench$$
useradd -m -s /bin/sh "$user"
cleanup() {
    stop_daemon || true
    local uid
    uid=$(id -u "$user" 2>/dev/null) || uid=
    if [ -n "$uid" ]; then
        for p in /proc/[0-9]*; do
            [ "$(stat -c %u "$p" 2>/dev/null)" = "$uid" ] && kill -KILL "${p#/proc/}" 2>/dev/null || true
        done
        userdel -r "$user" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
install -D -o "$user" -m 0755 "$bin" "$home/bin/agentrun"
ar=$home/bin/agentrun
# As the user, clean environment (setpriv and env exec: no process in between).
as_user=(setpriv --reuid="$user" --regid="$user" --init-groups env -i HOME="$home" PATH=/usr/bin:/bin)
as() { "${as_user[@]}" "$@"; }
if [ -n "$sandlock" ]; then
    install -o "$user" -m 0755 "$sandlock" "$home/bin/sandlock"
    sandlock=$home/bin/sandlock
fi

# Not through the function: $! must be the daemon itself (a backgrounded function is a subshell).
"${as_user[@]}" "$ar" serve --pool host:default=4 >"$tmp/serve.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 600); do
    as "$ar" ps --json 2>/dev/null | grep -q '"ready"' && break
    sleep 0.1
done
as "$ar" ps --json | grep -q '"ready"' || { echo "bench rootless: the user's daemon has no ready shell: $(oneline <"$tmp/serve.log")" >&2; exit 1; }

pyc="/usr/bin/python3 -c 'print(1)'"
declare -A rows=(
    [warm]="$ar exec --image host --"
    [cold]="$ar exec --no-daemon --image host --"
    [bubblewrap]="$bwrap_cmd"
    [sandlock]="${sandlock:+$sandlock $sandlock_args}"
)
order=(warm cold bubblewrap sandlock)
label() { case $1 in warm) echo "agentrun exec (rootless, warm)" ;; cold) echo "agentrun exec (rootless, cold)" ;; *) echo "$1" ;; esac; }

echo "## Rootless (as uid $(id -u "$user"), $(nproc) cores, $(uname -r)${SMOKE:+, SMOKE=1})"
echo
for workload in true python; do
    if [ $workload = true ]; then cmd=/bin/true expect=; else cmd=$pyc expect=1; fi
    args=() notes=()
    for r in "${order[@]}"; do
        if [ -z "${rows[$r]}" ]; then notes+=("$(label "$r"): unavailable: ${sandlock_reason:-not installed}"); continue; fi
        line="${rows[$r]} $cmd"
        reason=
        out=$(as timeout 60 bash -c "exec $line" </dev/null 2>"$tmp/err") || reason="exit $?: $(oneline <"$tmp/err")"
        [ -n "$reason" ] || [ "$out" = "$expect" ] || reason="printed '$(printf %s "$out" | oneline)'"
        if [ -n "$reason" ]; then notes+=("$(label "$r"): unavailable: $reason"); continue; fi
        args+=(-n "$(label "$r")" "$line")
    done
    echo "### Start latency: $cmd"
    echo
    as hyperfine -N -i --warmup 3 --runs "$runs" --export-markdown "$home/$workload.md" "${args[@]}" >"$tmp/hf.log" 2>&1 ||
        echo "(hyperfine failed: $(tail -3 "$tmp/hf.log" | oneline))"
    cat "$home/$workload.md" 2>/dev/null || true
    for n in "${notes[@]}"; do echo "- $n"; done
    echo
done

echo "### Throughput: /bin/true (${secs} s per point)"
echo
echo "| runner | clients | runs/s | p50 ms | p99 ms | errors |"
echo "|---|---|---|---|---|---|"
cp "$repo/hack/bench.d/load.py" "$tmp/load.py"
for r in "${order[@]}"; do
    [ -n "${rows[$r]}" ] || continue
    for c in 1 4; do
        # shellcheck disable=SC2086 # the row is a command line
        j=$(as "$py" "$tmp/load.py" --clients "$c" --secs "$secs" -- ${rows[$r]} /bin/true) || j='{}'
        "$py" -c 'import json,sys; d=json.loads(sys.argv[1] or "{}"); print("| %s | %s | %s | %s | %s | %s |" % (sys.argv[2], sys.argv[3], d.get("runs_per_s","-"), d.get("p50_ms","-"), d.get("p99_ms","-"), d.get("errors","-")))' "$j" "$(label "$r")" "$c"
    done
done
echo
stop_daemon
echo "Daemon: $daemon_stop"
left=0
uid=$(id -u "$user")
# Zombies are dead (here: bubblewrap's, reparented to a PID 1 that does not reap): not counted.
for p in /proc/[0-9]*; do
    [ "$(stat -c %u "$p" 2>/dev/null)" = "$uid" ] && ! grep -q '^State:.*Z' "$p/status" 2>/dev/null &&
        left=$((left + 1))
done
echo "Processes of the user left (zombies aside): $left"
[ "$left" = 0 ] || ps -o pid=,stat=,comm= -u "$user" | grep -v ' Z' | head -5 | sed 's/^/    /'
[ "$left" = 0 ]
