#!/usr/bin/env bash
# `hack/bench python`: Python start latency, throughput and idle memory with agentrun's Python
# zygote ([python] zygote = true: a python3 in each pooled shell, numpy and pandas imported
# ahead, forks each `python3 -c` run into its cell) against agentrun without it, bare Python,
# bubblewrap and sandlock.
#
#   RUNS=100 hack/bench python            # runs per command (default 100), after 5 warmups
#   THROUGHPUT_SECS=5 hack/bench python   # wall time of each throughput point (default 10)
#   POOL_SIZE=4 hack/bench python         # shells per pool (default 4, the daemon's default)
#   AGENTRUN_BIN=path hack/bench python   # benchmark this binary (default: the newer of
#                                         # target/x86_64-unknown-linux-gnu/release/agentrun
#                                         # (hack/build-static) and target/release/agentrun;
#                                         # nothing is built)
#   OUT=python.md hack/bench python       # also write the report to a file
#
# 1. Start latency (hyperfine -N, whole process; median, p95, p99), one session per workload:
#    - `print(1)`: bare `/usr/bin/python3 -I -c 'print(1)'` (not `python3` from PATH: that may
#      be a pyenv shim); agentrun exec (warm) `agentrun exec --profile P -- python3 -c
#      'print(1)'` with the zygote and without; bubblewrap and sandlock running
#      `/usr/bin/python3 -c 'print(1)'` (their command lines are hack/bench's,
#      hack/bench.d/common.sh).
#    - `import numpy, pandas; print(pandas.DataFrame({'a': [1, 2]}).a.sum())`: bare vs agentrun
#      warm with the zygote and without.
#    The profiles are written here: bundles/default.toml plus `[python] zygote = true, preload
#    = ["numpy", "pandas"]`, and the same with `zygote = false` (without the [python] table
#    when the binary does not know it: then the zygote rows are unavailable). The daemon keeps
#    one pool of POOL_SIZE shells per profile (`--pool host:FILE=N`). The zygote runs
#    `python3 ...` as the argv says (argv[0] exactly `python3`), so agentrun's rows name it so:
#    in the sandbox PATH (the profile's) finds /usr/bin/python3.
#    Every row first runs once and must print the expected output, else it is listed as
#    "unavailable: reason". Before anything is timed, the agentrun rows are warmed up until
#    their runs are what the row says (hack/bench.d/python.py warm: each run's `sandbox.exec`
#    span, exported to a throwaway OTLP receiver, has `sandbox.pool_hit` and `sandbox.zygote`
#    true, resp. not true, for 3 rounds in a row of POOL_SIZE concurrent runs, so every ready
#    shell is used: a fresh shell falls back while its zygote imports); a zygote row whose runs
#    do not use the zygote within 120 s is unavailable, with the span's counts and fallback
#    reasons. After each session, 20 more runs say how many used the zygote.
# 2. Throughput: `print(1)` runs/s, p50, p99 with 1, 4 and 16 closed-loop clients
#    (hack/bench.d/load.py): agentrun with the zygote, without, and bare.
# 3. Host memory per idle pooled shell (hack/bench.d/pool.py mem-row): RSS and PSS summed over
#    the processes in the shell's cgroup (its init, the spare cell and, with the zygote, the
#    zygote), averaged over the pool, with and without the zygote, once the pool is full and
#    warmed up.
# The host needs python3-numpy and python3-pandas for the bare rows (and the host image):
# installed with apt-get if missing, like hyperfine and bubblewrap. The daemon runs with its
# own state dir (on a tmpfs) and image root under a temp dir, is stopped with SIGTERM (bounded
# wait), and the script checks that no cgroup, mount or process is left.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
here=$repo/hack/bench.d
py=/usr/bin/python3
# shellcheck source=common.sh
. "$here/common.sh"

runs=${RUNS:-100}
secs=${THROUGHPUT_SECS:-10}
pool_size=${POOL_SIZE:-4}
start_secs=60     # daemon: socket up, pool full
stop_secs=30      # daemon: exit after SIGTERM
zygote_secs=120   # warm-up: runs use the zygote
session_secs=${HYPERFINE_TIMEOUT:-3600}
preload='["numpy", "pandas"]'

# --- tools ---------------------------------------------------------------------------------
bench_install "bench python" hyperfine:hyperfine bwrap:bubblewrap
command -v hyperfine >/dev/null || { echo "bench python: hyperfine is required" >&2; exit 1; }
if ! "$py" -c 'import numpy, pandas' 2>/dev/null; then
    echo "bench python: installing python3-numpy python3-pandas (the bare rows, the host image)" >&2
    { DEBIAN_FRONTEND=noninteractive timeout 300 apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq python3-numpy python3-pandas >/dev/null; } ||
        echo "bench python: could not install python3-numpy python3-pandas; their rows will say so" >&2
fi
bench_sandlock

# --- agentrun ------------------------------------------------------------------------------
if [ -n "${AGENTRUN_BIN:-}" ]; then
    src=$AGENTRUN_BIN
else
    src=
    for b in target/x86_64-unknown-linux-gnu/release/agentrun target/release/agentrun; do
        if [ -x "$b" ] && { [ -z "$src" ] || [ "$b" -nt "$src" ]; }; then src=$b; fi
    done
    [ -n "$src" ] || { echo "bench python: no release build: run hack/build-static (or AGENTRUN_BIN=path)" >&2; exit 1; }
fi
[ -x "$src" ] || { echo "bench python: $src is not an executable" >&2; exit 1; }
src_info="$src, built $(date -u -r "$src" '+%Y-%m-%d %H:%M UTC')"
tmp=$(mktemp -d /tmp/agentrun-python-bench.XXXXXX)
tmp=$(realpath "$tmp") # pools and runs name a profile file by its canonical path
chmod 755 "$tmp" # the sandbox uid must be able to search the state dir and image root
cp "$src" "$tmp/agentrun" # a rebuild during the bench does not change what is measured
bin=$tmp/agentrun
export AGENTRUN_STATE_DIR=$tmp/state AGENTRUN_ROOT=$tmp/root AGENTRUN_AUDIT_DIR=$tmp/audit
# The state dir on a tmpfs, as /run is on a standard host (see hack/bench).
mkdir -p "$AGENTRUN_STATE_DIR"
mount -t tmpfs -o mode=0755,size=512m agentrun-bench-state "$AGENTRUN_STATE_DIR"
unset AGENTRUN_NO_DAEMON OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT TRACEPARENT
sock=$AGENTRUN_STATE_DIR/agentrun.sock
daemon_pid=

mounts_under_tmp() { awk -v p="$tmp/" -v s="$tmp/state" 'index($5, p) == 1 && $5 != s { print $5 }' /proc/self/mountinfo; }
cleanup() {
    stop_daemon
    if [ -n "$(mounts_under_tmp)" ]; then
        AGENTRUN_NO_DAEMON=1 timeout 60 "$bin" gc >/dev/null 2>&1 || true
    fi
    if [ -n "$(mounts_under_tmp)" ]; then
        echo "bench python: mounts left under $tmp, not removing it:" >&2
        mounts_under_tmp >&2
    else
        umount "$tmp/state" 2>/dev/null || true
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the two profiles ----------------------------------------------------------------------
zprof=$tmp/zygote.toml nprof=$tmp/no-zygote.toml
profile() { # name zygote(true/false/omit)
    sed "s/^name = .*/name = \"$1\"/" "$repo/bundles/default.toml"
    [ "$2" = omit ] || printf '\n[python]\nzygote = %s\npreload = %s\n' "$2" "$preload"
}
profile bench-python-zygote true >"$zprof"
zygote_reason=
if ! "$bin" policy check "$zprof" >/dev/null 2>"$tmp/err"; then
    why=$(grep -o 'unknown field `python`' "$tmp/err" || oneline <"$tmp/err")
    zygote_reason="this agentrun does not take a profile's [python] table (\`agentrun policy check\`: $why)"
    profile bench-python-no-zygote omit >"$nprof"
    nprof_note="bundles/default.toml (no [python] table: this agentrun does not know it)"
else
    profile bench-python-no-zygote false >"$nprof"
    nprof_note="bundles/default.toml + \`[python] zygote = false\`"
fi

# --- the daemon ------------------------------------------------------------------------------
warm_reason=
cgroups_now() { find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d -path '*/agentrun/*' 2>/dev/null | sort; }
load_start=$(cut -d' ' -f1 /proc/loadavg)
# Builds the host image and warms the page cache before anything is timed.
AGENTRUN_NO_DAEMON=1 timeout 120 "$bin" exec -- /bin/true >/dev/null ||
    echo "bench python: agentrun exec -- /bin/true failed" >&2
cgroups_before=$(cgroups_now)
pools=(--pool "host:$nprof=$pool_size")
[ -n "$zygote_reason" ] || pools+=(--pool "host:$zprof=$pool_size")
"$bin" serve "${pools[@]}" >"$tmp/serve.log" 2>&1 &
daemon_pid=$!
if ! r=$("$py" "$here/pool.py" wait-socket "$sock" "$daemon_pid" "$start_secs"); then
    warm_reason="$r: $(tail -n 3 "$tmp/serve.log" | oneline)"
    stop_daemon
fi
[ -z "$warm_reason" ] || zygote_reason=$warm_reason
pool_status() { "$py" "$here/pool.py" status "$bin" "$1" || echo "{}"; }
# The ids of this daemon's shells, for the check that none is left: `ps` now and then, and
# the audit log (every run's shell); another agentrun on the host (tests) may make its own.
ids_seen() {
    [ -z "$daemon_pid" ] || "$bin" ps --json 2>/dev/null | "$py" -c 'import json, sys; [print(s["id"]) for s in json.load(sys.stdin)]' >>"$tmp/ids" 2>/dev/null || true
}
pool_fill() { # profile: waits (bounded) until its pool is full and idle
    [ -n "$daemon_pid" ] || return 0
    "$py" "$here/pool.py" wait-full "$bin" "$AGENTRUN_STATE_DIR" "$start_secs" "$1" >/dev/null || true
    ids_seen
}
pool_delta() {
    "$py" - "$1" "$2" <<'EOF'
import json, sys
b, a = json.loads(sys.argv[1] or "{}"), json.loads(sys.argv[2] or "{}")
if "hits" in a and "hits" in b:
    print(f"{a['hits'] - b['hits']} hits, {a.get('misses', 0) - b.get('misses', 0)} misses")
EOF
}

# Runs of the profile until they are what the row says (see the header); sets `reason`.
print1="python3 -c 'print(1)'"
warmup() { # profile yes|no rounds secs
    local out
    reason=
    pool_fill "$1"
    if ! out=$("$py" "$here/python.py" warm "$bin" "$1" 1 "$2" "$pool_size" "$3" "$4" -- python3 -c 'print(1)'); then
        reason=$("$py" -c 'import json, sys; print(json.loads(sys.stdin.read()).get("reason", "warm-up failed"))' <<<"$out" 2>/dev/null ||
            echo "warm-up failed: $(printf %s "$out" | oneline)")
    fi
    printf '%s\n' "$out" >>"$tmp/warmup.jsonl"
}
nz_reason=$warm_reason
if [ -z "$warm_reason" ]; then
    warmup "$nprof" no 3 "$start_secs"
    nz_reason=$reason
fi
if [ -z "$zygote_reason" ]; then
    warmup "$zprof" yes 3 "$zygote_secs"
    zygote_reason=$reason
fi

# --- host memory per idle pooled shell -----------------------------------------------------------
mem_md=$tmp/mem.md
{
    echo "| idle pooled shell | shells | processes per shell | of them python3 | RSS (MiB) | PSS (MiB) | of it python3's PSS (MiB) | tmpfs (MiB) | **PSS + tmpfs (MiB)** | memory cgroup (MiB) |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for row in "without the zygote|$nprof|$nz_reason" "with the zygote (numpy, pandas)|$zprof|$zygote_reason"; do
        IFS='|' read -r label prof why <<<"$row"
        if [ -n "$why" ]; then
            echo "| $label | unavailable: $why | | | | | | | | |"
        else
            pool_fill "$prof"
            "$py" "$here/pool.py" mem-row "$label" "$bin" "$AGENTRUN_STATE_DIR" "$daemon_pid" "$prof"
        fi
    done
} >"$mem_md"

# --- start latency -------------------------------------------------------------------------
table=$tmp/table.md
{
    echo "| workload | tool | median (ms) | p95 (ms) | p99 (ms) |"
    echo "|---|---|---:|---:|---:|"
} >"$table"
zname="agentrun exec (warm), zygote" nname="agentrun exec (warm), no zygote"
session_notes=
cmds_md=
bench() { # workload expect [name reason cmd]...
    local workload=$1 expect=$2
    shift 2
    local json=$tmp/$RANDOM.json status=$tmp/$RANDOM.tsv args=() name cmd pre p0z p0n
    : >"$status"
    while [ $# -gt 0 ]; do
        name=$1 pre=$2 cmd=$3
        shift 3
        reason=$pre
        [ -n "$reason" ] || check "$cmd" "$expect"
        printf '%s\t%s\n' "$name" "$reason" >>"$status"
        [ -n "$reason" ] || args+=(-n "$name" "$cmd")
        cmds_md+="- \`$workload\`, $name: \`$cmd\`${reason:+ (unavailable)}"$'\n'
    done
    if [ -n "$daemon_pid" ]; then
        pool_fill "$nprof"
        [ -n "$zygote_reason" ] || pool_fill "$zprof"
        p0z=$(pool_status "$zprof") p0n=$(pool_status "$nprof")
    fi
    if [ ${#args[@]} -gt 0 ]; then
        # -i: a failed run is counted in its row instead of aborting the whole session.
        timeout "$session_secs" hyperfine -N -i --warmup 5 --runs "$runs" --export-json "$json" "${args[@]}" >&2 ||
            { echo "bench python: hyperfine session for $workload failed" >&2; rm -f "$json"; }
    fi
    local jargs=()
    [ ! -f "$json" ] || jargs=("$json")
    "$py" "$here/table.py" --p99 "$workload" "$status" "${jargs[@]}" >>"$table"
    if [ -n "$daemon_pid" ]; then
        session_notes+="- \`$workload\` session (warmups included): pool without the zygote $(pool_delta "$p0n" "$(pool_status "$nprof")")"
        if [ -z "$zygote_reason" ]; then
            session_notes+=", with the zygote $(pool_delta "$p0z" "$(pool_status "$zprof")"); then 20 more runs with the zygote: $("$py" "$here/python.py" count "$bin" "$zprof" 20 -- python3 -c 'print(1)')"
        fi
        session_notes+=$'\n'
    fi
}
sandlock_pre=${sandlock_reason:-$([ -x "$sandlock" ] || echo "sandlock not installed")}
bwrap_pre=$(command -v bwrap >/dev/null || echo "bwrap not installed")

bench "print(1)" 1 \
    "bare (/usr/bin/python3 -I)" "" "$py -I -c 'print(1)'" \
    "$zname" "$zygote_reason" "$bin exec --profile $zprof -- $print1" \
    "$nname" "$nz_reason" "$bin exec --profile $nprof -- $print1" \
    bubblewrap "$bwrap_pre" "$bwrap_cmd $py -c 'print(1)'" \
    sandlock "$sandlock_pre" "$sandlock $sandlock_args $py -c 'print(1)'"

code="import numpy, pandas; print(pandas.DataFrame({'a': [1, 2]}).a.sum())"
bench "$code" 3 \
    "bare (/usr/bin/python3 -I)" "" "$py -I -c \"$code\"" \
    "$zname" "$zygote_reason" "$bin exec --profile $zprof -- python3 -c \"$code\"" \
    "$nname" "$nz_reason" "$bin exec --profile $nprof -- python3 -c \"$code\""

# --- throughput --------------------------------------------------------------------------------
thr=$tmp/throughput.md notes=$tmp/notes.md
: >"$notes"
{
    echo "| tool | clients | runs/s | runs | errors | p50 (ms) | p99 (ms) | pool |"
    echo "|---|---:|---:|---:|---:|---:|---:|---|"
} >"$thr"
load() { # name clients profile|"" reason command...
    local name=$1 n=$2 prof=$3 why=$4 j p0='' p1=''
    shift 4
    if [ -n "$why" ]; then
        echo "| $name | $n | unavailable: $why | | | | | |" >>"$thr"
        return
    fi
    if [ -n "$prof" ]; then
        pool_fill "$prof" # every point starts from a full pool
        if [ "$prof" = "$zprof" ]; then
            # Shells replaced since (--shell-max-runs) import again: their runs fall back.
            warmup "$zprof" yes 2 "$zygote_secs"
            [ -z "$reason" ] || echo "- $name, $n clients: before the point: $reason" >>"$notes"
        fi
        p0=$(pool_status "$prof")
    fi
    j=$("$py" "$here/load.py" --clients "$n" --secs "$secs" --timeout 60 -- "$@") || true
    [ -z "$prof" ] || p1=$(pool_status "$prof")
    "$py" - "$name" "$n" "$j" "$(pool_delta "$p0" "$p1")" >>"$thr" 2>>"$notes" <<'EOF' || true
import json, sys
name, n, j, pool = sys.argv[1:]
try:
    r = json.loads(j)
except ValueError:
    print(f"| {name} | {n} | unavailable: the load generator failed | | | | | |")
    sys.exit()
print(f"| {name} | {n} | {r['runs_per_s']} | {r['runs']} | {r['errors']} | {r['p50_ms']} | {r['p99_ms']} | {pool or '-'} |")
if r["errors"]:
    print(f"- {name}, {n} clients: {r['errors']} errors, first: {r['first_error']}", file=sys.stderr)
EOF
}
for n in 1 4 16; do
    load "$zname" $n "$zprof" "$zygote_reason" "$bin" exec --profile "$zprof" -- python3 -c 'print(1)'
    load "$nname" $n "$nprof" "$nz_reason" "$bin" exec --profile "$nprof" -- python3 -c 'print(1)'
    load "bare (/usr/bin/python3 -I)" $n "" "" "$py" -I -c 'print(1)'
done

pool_after=
if [ -n "$daemon_pid" ]; then
    pool_after=$("$bin" pool status --json 2>/dev/null | tr -d '\n ' || true)
    ids_seen
    stop_daemon
fi

# --- nothing left behind ---------------------------------------------------------------------------
leftovers=()
sleep 0.5
grep -o '"sandbox_id":"[^"]*"' "$AGENTRUN_AUDIT_DIR"/*.jsonl 2>/dev/null | cut -d'"' -f4 >>"$tmp/ids" || true
ours() { # cgroup paths of this daemon's shells
    local d
    while read -r d; do
        [ -n "$d" ] && grep -qxF "$(basename "$d")" "$tmp/ids" 2>/dev/null && echo "$d"
    done
    return 0
}
new_cgroups=$(comm -13 <(echo "$cgroups_before") <(cgroups_now) | ours)
if [ -n "$new_cgroups" ]; then # one may be on its way out: look again
    sleep 2
    new_cgroups=$(comm -12 <(echo "$new_cgroups") <(comm -13 <(echo "$cgroups_before") <(cgroups_now)) | sed '/^$/d')
fi
[ -z "$new_cgroups" ] || leftovers+=("cgroups: $(echo "$new_cgroups" | tr '\n' ' ')")
[ -z "$(mounts_under_tmp)" ] || leftovers+=("mounts: $(mounts_under_tmp | tr '\n' ' ')")
left_sb=$(ls -A "$AGENTRUN_STATE_DIR/sandboxes" 2>/dev/null || true)
[ -z "$left_sb" ] || leftovers+=("state dirs: $(echo "$left_sb" | tr '\n' ' ')")
left_procs=$(for p in /proc/[0-9]*; do [ "$(readlink "$p/exe" 2>/dev/null)" = "$bin" ] && echo "${p#/proc/}"; done || true)
[ -z "$left_procs" ] || leftovers+=("agentrun processes: $(echo "$left_procs" | tr '\n' ' ')")

# --- report ------------------------------------------------------------------------------------------
report=$tmp/report.md
{
    echo "Machine: $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%d), load average at start $load_start; state dir on a tmpfs; Python $("$py" -c 'import sys; print(sys.version.split()[0])'), numpy $("$py" -c 'import numpy; print(numpy.__version__)' 2>/dev/null || echo -), pandas $("$py" -c 'import pandas; print(pandas.__version__)' 2>/dev/null || echo -); agentrun: ${src_info#"$repo"/}; command: RUNS=$runs THROUGHPUT_SECS=$secs POOL_SIZE=$pool_size hack/bench python"
    echo
    echo "### Python start latency (hyperfine, $runs runs, whole process)"
    echo
    cat "$table"
    echo
    [ -z "$session_notes" ] || printf '%s\n' "$session_notes"
    echo "### Throughput: \`python3 -c 'print(1)'\` (closed loop, ${secs} s per point, $(nproc) cores)"
    echo
    cat "$thr"
    if [ -s "$notes" ]; then
        echo
        cat "$notes"
    fi
    echo
    echo "### Host memory per idle pooled shell (PSS summed over the shell's processes, averaged over the pool)"
    echo
    cat "$mem_md"
    echo
    echo "### Profiles and commands"
    echo
    echo "- with the zygote: bundles/default.toml + \`[python] zygote = true, preload = $preload\`${zygote_reason:+ (unavailable: $zygote_reason)}"
    echo "- without: $nprof_note"
    echo "- daemon: \`agentrun serve ${pools[*]}\`"
    printf '%s' "$cmds_md" | sed "s|$tmp|\$TMP|g; s|$repo/||g"
    echo
    echo "Warm-up (sandbox.exec spans; python.py warm, one JSON line per warm-up):"
    echo
    echo '```'
    sed "s|$tmp|\$TMP|g" "$tmp/warmup.jsonl" 2>/dev/null || true
    echo '```'
    echo
    if [ -n "$pool_after" ] && [ "$pool_after" != "{}" ]; then
        echo "Pool counters at the end: $(printf %s "$pool_after" | sed "s|$tmp|\$TMP|g")"
        echo
    fi
    if [ -n "$warm_reason" ]; then
        echo "Daemon: $warm_reason."
    else
        echo "Daemon: ${daemon_stop:-stopped}."
        if [ "${daemon_rc:-0}" != 0 ]; then
            echo "Its last words: $(tail -n 3 "$tmp/serve.log" | oneline)"
        fi
    fi
    if [ ${#leftovers[@]} -eq 0 ]; then
        echo "Left behind after the daemon stopped and every run ended: nothing (no agentrun cgroup, mount under the temp dir, state dir or process)."
    else
        echo "**Left behind:** ${leftovers[*]}"
    fi
} >"$report"
echo
cat "$report"
[ -z "${OUT:-}" ] || cp "$report" "$OUT"
exit 0
