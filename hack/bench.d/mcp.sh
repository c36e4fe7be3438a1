#!/usr/bin/env bash
# `hack/bench mcp`: a `run_python("print(1)")` MCP tool call over stdio, from the official MCP
# Python SDK client, against agentrun's MCP server (`agentrun mcp`: its own warm pool; the
# default session mode and --one-shot) and sandlock-mcp's `python` tool (sandlock 0.9.0).
#
#   RUNS=300 hack/bench mcp             # timed calls per server, one session (default 300),
#                                       # after WARMUP calls (default 20)
#   THROUGHPUT_SECS=5 hack/bench mcp    # wall time of each throughput point (default 10)
#   CLIENTS="1 4 8" hack/bench mcp      # the throughput points (default 1 4 8)
#   COLD_RUNS=20 hack/bench mcp         # hyperfine runs of the cold-start rows (default 20)
#   POOL_SIZE=N hack/bench mcp          # `agentrun mcp --pool-size N` (default: its own)
#   AGENTRUN_BIN=path hack/bench mcp    # benchmark this binary (default: the newer of
#                                       # target/x86_64-unknown-linux-gnu/release/agentrun and
#                                       # target/release/agentrun; nothing is built)
#   OUT=mcp.md hack/bench mcp           # also write the report to a file
#
# One client for every server in a table: hack/bench.d/mcp_client.py on the official `mcp`
# SDK, in two pinned versions, each in a venv this script makes:
# - mcp==2.3.0 in .venv/mcp-client: every table;
# - mcp==1.30.0 in .venv/sandlock-mcp (with sandlock==0.9.0: sandlock-mcp's server is written
#   against the 1.x `mcp` API and does not start with mcp 2.x): the round trip once more.
#   The 1.x client validates a result against the tool's output schema with
#   `jsonschema.validate()`, which checks the schema against its metaschema at every call
#   (~3.5 ms for agentrun's `run_python` schema on this machine; mcp 2.x compiles the
#   validator once per schema); sandlock-mcp's tools have no output schema, so only servers
#   with one pay it. The floor rows show it.
# sandlock-mcp is the sandlock venv's console script (`sandlock.mcp.server:main`), started as
# `sandlock-mcp --workspace DIR`; its `python` tool runs each call in a fresh sandboxed
# interpreter (Landlock + seccomp, 256M memory limit).
# 1. Round trip (both clients): one server process and session per server; initialize, WARMUP calls, then
#    RUNS calls back to back, each timed in the client around `session.call_tool` (request
#    written to the server's stdin to result parsed and checked): p50, p95, p99, min, max.
#    Also the time from the server's spawn to `initialize` answered and to the first result.
#    The floor row: the same client against hack/bench.d/mcp_null_server.py, a server that
#    answers every call at once (agentrun's tools/list, so the same output-schema check).
# 2. Throughput (mcp 2.3.0): K clients (CLIENTS), EACH ITS OWN SERVER PROCESS AND SESSION, closed loop
#    for THROUGHPUT_SECS after a warm-up: stdio is one server per client (an MCP host spawns
#    the server it talks to), and in agentrun's session mode a session is one sandbox with
#    one interpreter that runs one call at a time, so K concurrent calls on one session
#    would measure a queue, not K agents. Every client is its own Python process (the
#    client's own CPU is not serialized on one GIL).
# 3. Cold start (hyperfine -N, whole process; mcp 2.3.0): a client that spawns the server, initializes,
#    makes one call, and shuts it down (stdin closed, exit awaited, as the SDK does), beside
#    the client alone (SDK imported, nothing spawned: the floor the other rows share) and bare
#    `/usr/bin/python3 -c 'print(1)'`.
# Every server is first checked to answer `1`; one that does not is listed as unavailable,
# with the reason. agentrun runs with its own state dir (on a tmpfs, as /run is on a standard
# host), image root and audit dir under a temp dir; the script checks that no agentrun
# process, mount, cgroup or state is left once every client ended.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
here=$repo/hack/bench.d
py=/usr/bin/python3
# shellcheck source=common.sh
. "$here/common.sh"

runs=${RUNS:-300}
warmup=${WARMUP:-20}
secs=${THROUGHPUT_SECS:-10}
clients=${CLIENTS:-1 4 8}
cold_runs=${COLD_RUNS:-20}
pool_size=${POOL_SIZE:-}
sandlock_ver=0.9.0 mcp1_ver=1.30.0 mcp2_ver=2.3.0
venv=$repo/.venv/sandlock-mcp cvenv=$repo/.venv/mcp-client

# --- tools ---------------------------------------------------------------------------------
bench_install "bench mcp" hyperfine:hyperfine
command -v hyperfine >/dev/null || { echo "bench mcp: hyperfine is required" >&2; exit 1; }
# venv pkg==version...: makes the venv, with exactly these versions, unless it has them
venv_pinned() {
    local v=$1
    shift
    if ! "$v/bin/python" - "$@" <<'EOF' 2>/dev/null; then
import importlib.metadata as m, sys
sys.exit(any(m.version(p.split("==")[0]) != p.split("==")[1] for p in sys.argv[1:]))
EOF
        echo "bench mcp: installing $* into $v" >&2
        [ -x "$v/bin/pip" ] || "$py" -m venv "$v" >&2
        timeout 600 "$v/bin/pip" install -q --disable-pip-version-check "$@" >&2 ||
            { echo "bench mcp: could not install $* into $v" >&2; exit 1; }
    fi
}
venv_pinned "$venv" "sandlock==$sandlock_ver" "mcp==$mcp1_ver"
venv_pinned "$cvenv" "mcp==$mcp2_ver"
client=("$cvenv/bin/python" "$here/mcp_client.py")  # mcp 2.3.0: every table
client1=("$venv/bin/python" "$here/mcp_client.py") # mcp 1.30.0: the round trip again

# --- agentrun ------------------------------------------------------------------------------
if [ -n "${AGENTRUN_BIN:-}" ]; then
    src=$AGENTRUN_BIN
else
    src=
    for b in target/x86_64-unknown-linux-gnu/release/agentrun target/release/agentrun; do
        if [ -x "$b" ] && { [ -z "$src" ] || [ "$b" -nt "$src" ]; }; then src=$b; fi
    done
    [ -n "$src" ] || { echo "bench mcp: no release build: cargo build --release -p agentrun (or AGENTRUN_BIN=path)" >&2; exit 1; }
fi
[ -x "$src" ] || { echo "bench mcp: $src is not an executable" >&2; exit 1; }
src_info="$src, built $(date -u -r "$src" '+%Y-%m-%d %H:%M UTC')"
tmp=$(mktemp -d /tmp/agentrun-mcp-bench.XXXXXX)
tmp=$(realpath "$tmp")
chmod 755 "$tmp" # the sandbox uid must be able to search the state dir and image root
cp "$src" "$tmp/agentrun" # a rebuild during the bench does not change what is measured
bin=$tmp/agentrun
export AGENTRUN_STATE_DIR=$tmp/state AGENTRUN_ROOT=$tmp/root AGENTRUN_AUDIT_DIR=$tmp/audit
mkdir -p "$AGENTRUN_STATE_DIR" "$tmp/sandlock-ws"
mount -t tmpfs -o mode=0755,size=512m agentrun-bench-state "$AGENTRUN_STATE_DIR"
unset AGENTRUN_NO_DAEMON OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT TRACEPARENT

mounts_under_tmp() { awk -v p="$tmp/" -v s="$tmp/state" 'index($5, p) == 1 && $5 != s { print $5 }' /proc/self/mountinfo; }
our_procs() { for p in /proc/[0-9]*; do [ "$(readlink "$p/exe" 2>/dev/null)" = "$bin" ] && echo "${p#/proc/}"; done || true; }
sampler=
cleanup() {
    local p
    [ -z "$sampler" ] || kill "$sampler" 2>/dev/null || true
    for p in $(our_procs); do kill -KILL "$p" 2>/dev/null || true; done
    if [ -n "$(mounts_under_tmp)" ]; then
        AGENTRUN_NO_DAEMON=1 timeout 60 "$bin" gc >/dev/null 2>&1 || true
    fi
    if [ -n "$(mounts_under_tmp)" ]; then
        echo "bench mcp: mounts left under $tmp, not removing it:" >&2
        mounts_under_tmp >&2
    else
        umount "$tmp/state" 2>/dev/null || true
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cgroups_now() { find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d -path '*/agentrun/*' 2>/dev/null | sort; }
load_start=$(cut -d' ' -f1 /proc/loadavg)
# Builds the host image and warms the page cache before anything is timed.
AGENTRUN_NO_DAEMON=1 timeout 120 "$bin" exec -- /bin/true >/dev/null ||
    echo "bench mcp: agentrun exec -- /bin/true failed" >&2
cgroups_before=$(cgroups_now)
# The ids of the sandboxes the servers make, for the check that none is left (MCP tool calls
# write no audit record): their state dirs, looked at twice a second.
(
    while :; do
        for d in "$AGENTRUN_STATE_DIR"/mcp/*/sandboxes/* "$AGENTRUN_STATE_DIR"/sandboxes/*; do
            [ ! -e "$d" ] || echo "${d##*/}"
        done
        sleep 0.5
    done
) >>"$tmp/ids" &
sampler=$!

# --- the servers -----------------------------------------------------------------------------
# name|tool|command (split on spaces; no argument has one)
amcp="$bin mcp${pool_size:+ --pool-size $pool_size}"
servers=(
    "agentrun mcp (session)|run_python|$amcp"
    "agentrun mcp --one-shot|run_python|$amcp --one-shot"
    "sandlock-mcp $sandlock_ver|python|$venv/bin/sandlock-mcp --workspace $tmp/sandlock-ws"
)
declare -A why
agentrun_reason=
if ! timeout 10 "$bin" mcp --help >/dev/null 2>"$tmp/err"; then
    agentrun_reason="this agentrun has no \`mcp\` command ($(oneline <"$tmp/err"))"
fi
for s in "${servers[@]}"; do
    IFS='|' read -r name tool cmd <<<"$s"
    why[$name]=
    if [[ $name == agentrun* ]] && [ -n "$agentrun_reason" ]; then
        why[$name]=$agentrun_reason
        continue
    fi
    # shellcheck disable=SC2086
    if ! out=$(timeout 120 "${client[@]}" latency --tool "$tool" --runs 1 --warmup 0 --err "$tmp/server.err" -- $cmd 2>"$tmp/err"); then
        why[$name]="the check call failed: $(tail -n 3 "$tmp/err" "$tmp/server.err" 2>/dev/null | oneline)"
    fi
    : >"$tmp/server.err"
done

# The floor: a server that runs nothing (hack/bench.d/mcp_null_server.py, raw JSON-RPC, no
# SDK), listing agentrun's tools (as each client read them) so the client validates the same
# output schema.
floor_name="no sandbox: mcp_null_server.py (the client and stdio alone)"
why[$floor_name]=

# --- 1. round trip -----------------------------------------------------------------------------
rt=$tmp/roundtrip.md
{
    echo "| client | server | tool | p50 (ms) | p95 (ms) | p99 (ms) | min (ms) | max (ms) | mean (ms) | spawn → initialized (ms) | spawn → first result (ms) |"
    echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
} >"$rt"
round_trip() { # label client...
    local label=$1 floor_tools=''
    shift
    # shellcheck disable=SC2086
    if [ -z "${why["agentrun mcp (session)"]}" ] &&
        "$@" tools -- $amcp >"$tmp/agentrun-tools.json" 2>/dev/null; then
        floor_tools=$tmp/agentrun-tools.json
    fi
    local s name tool cmd j
    for s in "${servers[@]}" "$floor_name|run_python|$py $here/mcp_null_server.py${floor_tools:+ $floor_tools}"; do
        IFS='|' read -r name tool cmd <<<"$s"
        if [ -n "${why[$name]}" ]; then
            echo "| $label | $name | \`$tool\` | unavailable: ${why[$name]} | | | | | | | |"
            continue
        fi
        # shellcheck disable=SC2086
        j=$("$@" latency --tool "$tool" --runs "$runs" --warmup "$warmup" --err "$tmp/server.err" -- $cmd) || j=
        "$py" - "$label" "$name" "$tool" "$j" <<'EOF'
import json, sys
label, name, tool, j = sys.argv[1:]
try:
    r = json.loads(j)
except ValueError:
    print(f"| {label} | {name} | `{tool}` | unavailable: the client failed | | | | | | | |")
    sys.exit()
print(f"| {label} | {name} | `{tool}` | **{r['p50_ms']:.2f}** | {r['p95_ms']:.2f} | {r['p99_ms']:.2f} | {r['min_ms']:.2f} | "
      f"{r['max_ms']:.2f} | {r['mean_ms']:.2f} | {r['spawn_to_init_ms']:.1f} | {r['spawn_to_first_ms']:.1f} |")
EOF
    done
}
round_trip "mcp $mcp2_ver" "${client[@]}" >>"$rt"
round_trip "mcp $mcp1_ver" "${client1[@]}" >>"$rt"

# --- 2. throughput -----------------------------------------------------------------------------
thr=$tmp/throughput.md notes=$tmp/notes.md
: >"$notes"
{
    echo "| server | clients | calls/s | calls | errors | p50 (ms) | p99 (ms) |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
} >"$thr"
for k in $clients; do
    for s in "${servers[@]}"; do
        IFS='|' read -r name tool cmd <<<"$s"
        if [ -n "${why[$name]}" ]; then
            echo "| $name | $k | unavailable | | | | |" >>"$thr"
            continue
        fi
        # shellcheck disable=SC2086
        j=$("${client[@]}" load --tool "$tool" --clients "$k" --secs "$secs" --warmup "$warmup" --err "$tmp/server.err" -- $cmd 2>>"$notes") || j=
        "$py" - "$name" "$k" "$j" >>"$thr" 2>>"$notes" <<'EOF'
import json, sys
name, k, j = sys.argv[1:]
try:
    r = json.loads(j)
except ValueError:
    print(f"| {name} | {k} | unavailable: the load client failed | | | | |")
    sys.exit()
print(f"| {name} | {k} | {r['calls_per_s']} | {r['calls']} | {r['errors']} | {r['p50_ms']} | {r['p99_ms']} |")
if r["errors"]:
    print(f"- {name}, {k} clients: {r['errors']} errors, first: {r['first_error']}", file=sys.stderr)
EOF
    done
done

# --- 3. cold start -----------------------------------------------------------------------------
cold=$tmp/cold.md status=$tmp/cold.tsv json=$tmp/cold.json
{
    echo "| workload | command | median (ms) | p95 (ms) | p99 (ms) |"
    echo "|---|---|---:|---:|---:|"
} >"$cold"
args=(-n "bare /usr/bin/python3 -c 'print(1)'" "$py -c 'print(1)'"
    -n "MCP client alone (SDK imported, no server)" "${client[*]} import")
printf '%s\t\n' "bare /usr/bin/python3 -c 'print(1)'" "MCP client alone (SDK imported, no server)" >"$status"
for s in "${servers[@]}"; do
    IFS='|' read -r name tool cmd <<<"$s"
    printf '%s\t%s\n' "$name" "${why[$name]}" >>"$status"
    [ -n "${why[$name]}" ] || args+=(-n "$name" "${client[*]} cold --tool $tool -- $cmd")
done
timeout 3600 hyperfine -N -i --warmup 2 --runs "$cold_runs" --export-json "$json" "${args[@]}" >&2 ||
    { echo "bench mcp: the cold-start hyperfine session failed" >&2; rm -f "$json"; }
jargs=()
[ ! -f "$json" ] || jargs=("$json")
"$py" "$here/table.py" --p99 "spawn, initialize, 1 call, exit" "$status" "${jargs[@]}" >>"$cold"

# --- nothing left behind ---------------------------------------------------------------------------
leftovers=()
sleep 0.5
left_procs=$(our_procs)
[ -z "$left_procs" ] || leftovers+=("agentrun processes: $(echo "$left_procs" | tr '\n' ' ')")
left_sl=$(pgrep -f -- "--workspace $tmp/sandlock-ws" | tr '\n' ' ' || true)
[ -z "$left_sl" ] || leftovers+=("sandlock-mcp processes: $left_sl")
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true
sampler=
grep -ho '"sandbox_id":"[^"]*"' "$AGENTRUN_AUDIT_DIR"/*.jsonl 2>/dev/null | cut -d'"' -f4 >>"$tmp/ids" || true
ours() { # cgroup paths of this bench's sandboxes (other agentruns on the host make their own)
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
left_state=$(cd "$AGENTRUN_STATE_DIR" && find sandboxes containers mcp/*/sandboxes mcp/*/containers -mindepth 1 -maxdepth 1 2>/dev/null | tr '\n' ' ')
[ -z "$left_state" ] || leftovers+=("state: $left_state")

# --- report ------------------------------------------------------------------------------------------
report=$tmp/report.md
{
    echo "Machine: $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%d), load average at start $load_start; state dir on a tmpfs; clients: the MCP Python SDK, mcp==$mcp2_ver (every table) and mcp==$mcp1_ver (the round trip), Python $("$cvenv/bin/python" -c 'import sys; print(sys.version.split()[0])'); sandlock $sandlock_ver; agentrun: ${src_info#"$repo"/}; command: RUNS=$runs WARMUP=$warmup THROUGHPUT_SECS=$secs CLIENTS=\"$clients\" COLD_RUNS=$cold_runs${pool_size:+ POOL_SIZE=$pool_size} hack/bench mcp"
    echo
    echo "#### \`run_python(\"print(1)\")\` round trip over stdio (one session, $runs calls after $warmup warm-up calls, timed in the client; the first column says which SDK)"
    echo
    cat "$rt"
    echo
    echo "#### Throughput: K clients, each its own server process and session (mcp $mcp2_ver, closed loop, ${secs} s per point, $(nproc) cores)"
    echo
    cat "$thr"
    if [ -s "$notes" ]; then
        echo
        cat "$notes"
    fi
    echo
    echo "#### Cold start (hyperfine, $cold_runs runs, whole client process (mcp $mcp2_ver): Python, the SDK import, the server's spawn, initialize, one call, stdin closed and the server's exit awaited)"
    echo
    cat "$cold"
    echo
    echo "#### Servers"
    echo
    for s in "${servers[@]}" "$floor_name|run_python|$py $here/mcp_null_server.py AGENTRUN_TOOLS_LIST.json"; do
        IFS='|' read -r name tool cmd <<<"$s"
        echo "- $name: \`$cmd\`, tool \`$tool\`"
    done | sed "s|$tmp|\$TMP|g; s|$repo/||g"
    echo "- clients: \`${client[*]} MODE --tool TOOL -- SERVER...\` (mcp $mcp2_ver), \`${client1[*]} ...\` (mcp $mcp1_ver)" | sed "s|$repo/||g"
    echo
    if [ ${#leftovers[@]} -eq 0 ]; then
        echo "Left behind once every client ended: nothing (no agentrun or sandlock-mcp process, cgroup of the $(sort -u "$tmp/ids" | grep -c .) sandboxes seen, mount under the temp dir, or sandbox/MCP state)."
    else
        echo "**Left behind:** ${leftovers[*]}"
    fi
} >"$report"
echo
cat "$report"
[ -z "${OUT:-}" ] || cp "$report" "$OUT"
exit 0
