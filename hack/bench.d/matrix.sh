#!/usr/bin/env bash
# `hack/bench matrix`: what users run, in one session, side by side: front ends x shipped
# profiles x workloads (hack/bench.d/matrix.py measures; this script sets up and tears down).
#
#   hack/bench matrix                    # RUNS=60 LATENCY_SECS=6 THROUGHPUT_SECS=3 CLIENTS="4 16"
#   SMOKE=1 hack/bench matrix            # RUNS=5 LATENCY_SECS=2 THROUGHPUT_SECS=1 CLIENTS=4, dockerd 3
#                                        # runs: checks that every row works and is real
#   RUNS=100 hack/bench matrix           # 1-client runs per cell, after WARMUP (default 5)
#   LATENCY_SECS=8 hack/bench matrix     # ... or fewer: a 1-client series stops after this long
#                                        # (10 runs at least; numpy+pandas without a zygote is slow)
#   THROUGHPUT_SECS=5 hack/bench matrix  # wall time of each closed-loop point
#   CLIENTS="4 16" hack/bench matrix     # the closed-loop points
#   SETTLE_SECS=15 hack/bench matrix     # before each point's clock starts, wait (at most this
#                                        # long) for a quiet machine: busy CPU under 15% for
#                                        # 0.3 s (a pool refilling, a zygote importing)
#   DOCKERD_RUNS=10 hack/bench matrix    # 1-client runs of the real dockerd exec_run rows (slow; a
#                                        # third of it for CodeInterpreterTool: ~10 s a run)
#   DOCKERD=0 hack/bench matrix          # no real dockerd rows (n/a)
#   PROFILES="default container" ...     # a subset of the shipped profiles
#   GROUPS_ONLY="agentrun" ONLY=cli,mcp-session ...  # a subset of the rows (anchors, agentrun,
#                                        # dockerd; ONLY: front ends of the agentrun rows)
#   POOL_SIZE=4 hack/bench matrix        # `serve --pool host:PROFILE=N` (default 4)
#   AGENTRUN_BIN=path hack/bench matrix  # benchmark this binary (default: hack/build-static)
#   OUT=matrix.md JSON=matrix.json hack/bench matrix   # also write the report / raw numbers
#
# Front ends, each against image `host` (the host's /usr: python3, numpy, pandas):
#   - CLI `agentrun exec --profile P -- ARGV` (warm: `agentrun serve --pool host:P=N`);
#   - OpenSandbox SDK (opensandbox 1.1.1, sync): `SandboxSync.create("host")` ->
#     `commands.run(CMD)` -> `kill()`, with the SDK's default config (a transport per sandbox)
#     and with one shared transport; beside it the same HTTP requests from one plain httpx
#     client (`serve --listen`, `--opensandbox-profile P`);
#   - docker-py 7.1.0 `container.exec_run(ARGV)` on a container of image `host`
#     (`serve --docker-socket`, `--docker-profile P`), and CrewAI's `CodeInterpreterTool.run`
#     (crewai-tools 1.13.0, DOCKER_HOST = that socket; its image `code-interpreter:latest` is
#     `host` tagged so: the tool builds nothing);
#   - MCP `run_python(CODE)` over stdio (the MCP Python SDK of .venv/test): `agentrun mcp
#     --profile P`, one-shot and session, each client its own server and session.
# Profiles: default, code-interpreter (its Python zygote preloads numpy and pandas), container.
# Workloads: `/bin/true`, `python3 -c 'print(1)'`, `python3 -c "import numpy, pandas; ..."`.
# Anchors: bare (`/bin/true`, `/usr/bin/python3 -I -c`), bubblewrap and sandlock (hack/bench's
# command lines, hack/bench.d/common.sh), sandlock-mcp 0.9.0's `python` tool, and docker-py /
# CodeInterpreterTool against a real dockerd (Debian's docker.io, started here as hack/bench
# docker does, with a python3 image made from the host's files).
# Each cell: p50/p95/p99 of RUNS runs at 1 client, runs/s and p50/p99 at each of CLIENTS
# closed-loop clients; outputs checked on every run. One daemon per profile, one after the
# other (a front end's profile is a `serve` option), each with a full pool before it is
# measured; the script checks that no cgroup, mount or process is left.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
here=$repo/hack/bench.d
py=/usr/bin/python3
# shellcheck source=common.sh
. "$here/common.sh"

if [ "${SMOKE:-0}" = 1 ]; then
    runs=${RUNS:-5} secs=${THROUGHPUT_SECS:-1} dockerd_runs=${DOCKERD_RUNS:-3} warmup=${WARMUP:-1} max_secs=${LATENCY_SECS:-2}
    settle_secs=${SETTLE_SECS:-3}
    clients=${CLIENTS:-4}
else
    runs=${RUNS:-60} secs=${THROUGHPUT_SECS:-3} dockerd_runs=${DOCKERD_RUNS:-10} warmup=${WARMUP:-5} max_secs=${LATENCY_SECS:-6}
    settle_secs=${SETTLE_SECS:-15}
    clients=${CLIENTS:-4 16}
fi
pool_size=${POOL_SIZE:-4}
profiles=${PROFILES:-default code-interpreter container}
groups=" ${GROUPS_ONLY:-anchors agentrun dockerd} "
start_secs=60 stop_secs=30
t_start=$SECONDS

# --- tools and clients ---------------------------------------------------------------------
bench_install "bench matrix" bwrap:bubblewrap
if ! "$py" -c 'import numpy, pandas' 2>/dev/null; then # the bare rows and the host image
    { DEBIAN_FRONTEND=noninteractive timeout 300 apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq python3-numpy python3-pandas >/dev/null; } ||
        echo "bench matrix: could not install python3-numpy python3-pandas; their rows will fail" >&2
fi
bench_sandlock
# The clients: hack/test's .venv/test (docker-py, crewai-tools, the OpenSandbox SDK, mcp);
# installed with hack/test's pins when it lacks them. sandlock-mcp: mcp.sh's venv (its server
# is written against mcp 1.x).
cpy=$repo/.venv/test/bin/python
if ! "$cpy" -c 'import docker, crewai_tools, opensandbox, mcp' 2>/dev/null; then
    echo "bench matrix: installing the clients into .venv/test (hack/test's pins; a few minutes)" >&2
    [ -x "$cpy" ] || "$py" -m venv "$repo/.venv/test"
    timeout 900 "$repo/.venv/test/bin/pip" install -q --disable-pip-version-check \
        opensandbox==1.1.1 opensandbox-code-interpreter==1.1.1 docker==7.1.0 crewai-tools==1.13.0 \
        websockets==17.4 redis==5.3.1 mcpadapt==0.1.19 >&2 ||
        { echo "bench matrix: could not install the Python clients" >&2; exit 1; }
fi
smvenv=$repo/.venv/sandlock-mcp sandlock_mcp='' sandlock_mcp_reason=''
if ! "$smvenv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("sandlock") != "0.9.0")' 2>/dev/null; then
    [ -x "$smvenv/bin/pip" ] || "$py" -m venv "$smvenv" >&2 || true
    timeout 600 "$smvenv/bin/pip" install -q --disable-pip-version-check sandlock==0.9.0 mcp==1.30.0 >&2 ||
        sandlock_mcp_reason="could not install sandlock==0.9.0 mcp==1.30.0 into $smvenv"
fi
dockerd_reason=
if [ "${DOCKERD:-1}" = 0 ] || [[ $groups != *" dockerd "* ]]; then
    dockerd_reason="DOCKERD=0: not measured"
else
    bench_install "bench matrix" dockerd:docker.io containerd:containerd runc:runc skopeo:skopeo
    command -v dockerd >/dev/null || dockerd_reason="dockerd not installed (apt-get install docker.io)"
    command -v skopeo >/dev/null || dockerd_reason="skopeo not installed"
fi

# --- agentrun ------------------------------------------------------------------------------
if [ -n "${AGENTRUN_BIN:-}" ]; then
    src=$AGENTRUN_BIN
else
    src=$("$repo/hack/build-static") ||
        { echo "bench matrix: build failed (AGENTRUN_BIN=path benchmarks an existing binary)" >&2; exit 1; }
fi
[ -x "$src" ] || { echo "bench matrix: $src is not an executable" >&2; exit 1; }
src_info="${src#"$repo"/}, built $(date -u -r "$src" '+%Y-%m-%d %H:%M UTC')"
tmp=$(mktemp -d /tmp/agentrun-matrix.XXXXXX)
tmp=$(realpath "$tmp")
chmod 755 "$tmp" # the sandbox uid must be able to search the state dir and image root
cp "$src" "$tmp/agentrun" # a rebuild during the bench does not change what is measured
bin=$tmp/agentrun
export AGENTRUN_STATE_DIR=$tmp/state AGENTRUN_ROOT=$tmp/root AGENTRUN_AUDIT_DIR=$tmp/audit
export DOCKER_CONFIG=$tmp/docker-config HOME=$tmp/home
mkdir -p "$AGENTRUN_STATE_DIR" "$HOME" "$tmp/sandlock-ws"
# The state dir on a tmpfs, as /run is on a standard host (see hack/bench).
mount -t tmpfs -o mode=0755,size=1g agentrun-bench-state "$AGENTRUN_STATE_DIR"
unset AGENTRUN_NO_DAEMON OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT TRACEPARENT DOCKER_HOST DOCKER_CONTEXT
sock=$AGENTRUN_STATE_DIR/agentrun.sock
dsock=$tmp/docker.sock
d=$tmp/dockerd
daemon_pid='' dockerd_pid=''

mounts_under_tmp() { awk -v p="$tmp/" -v s="$tmp/state" 'index($5, p) == 1 && $5 != s { print $5 }' /proc/self/mountinfo; }
our_procs() { for p in /proc/[0-9]*; do [ "$(readlink "$p/exe" 2>/dev/null)" = "$bin" ] && echo "${p#/proc/}"; done || true; }
stop_dockerd() {
    [ -n "$dockerd_pid" ] || return 0
    kill -TERM "$dockerd_pid" 2>/dev/null || true
    local t0=$SECONDS
    while kill -0 "$dockerd_pid" 2>/dev/null && [ $((SECONDS - t0)) -lt $stop_secs ]; do sleep 0.1; done
    kill -KILL "$dockerd_pid" 2>/dev/null || true
    wait "$dockerd_pid" 2>/dev/null || true
    dockerd_pid=
    # dockerd's containerd and shims of this temp dir
    for p in /proc/[0-9]*; do
        if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q -- "$d/"; then kill -KILL "${p#/proc/}" 2>/dev/null || true; fi
    done
    awk -v p="$d/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null || true; done
}
cleanup() {
    stop_daemon
    stop_dockerd
    if [ -n "$(our_procs)" ]; then sleep 1; for p in $(our_procs); do kill -KILL "$p" 2>/dev/null || true; done; fi
    if [ -n "$(mounts_under_tmp)" ]; then
        AGENTRUN_NO_DAEMON=1 timeout 60 "$bin" gc >/dev/null 2>&1 || true
    fi
    if [ -n "$(mounts_under_tmp)" ]; then
        echo "bench matrix: mounts left under $tmp, not removing it:" >&2
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
    echo "bench matrix: agentrun exec -- /bin/true failed" >&2
cgroups_before=$(cgroups_now)
numpy_code="import numpy, pandas; print(pandas.DataFrame({'a': [1, 2]}).a.sum())"
cells=$tmp/cells.jsonl
: >"$cells"
common=(--out "$cells" --tmp "$tmp" --err "$tmp/server.err" --runs "$runs" --secs "$secs"
    --warmup "$warmup" --clients "$clients" --max-secs "$max_secs" --settle-secs "$settle_secs")

# --- anchors: bare, bubblewrap, sandlock, sandlock-mcp --------------------------------------
sandlock_pre=${sandlock_reason:-$([ -x "$sandlock" ] || echo "sandlock not installed")}
[ -n "$sandlock_mcp_reason" ] || sandlock_mcp="$smvenv/bin/sandlock-mcp --workspace $tmp/sandlock-ws"
echo "bench matrix: anchors" >&2
[[ $groups != *" anchors "* ]] || "$cpy" "$here/matrix.py" cells --group anchors "${common[@]}" \
    --bwrap "$(command -v bwrap >/dev/null && echo "$bwrap_cmd")" \
    --sandlock "$([ -n "$sandlock_pre" ] || echo "$sandlock $sandlock_args")" --sandlock-reason "$sandlock_pre" \
    --sandlock-mcp "$sandlock_mcp" --sandlock-mcp-reason "$sandlock_mcp_reason"

# --- the Docker API's image --------------------------------------------------------------------
# The built-in `host` image is not one the Docker API serves: its containers (and dockerd's)
# run `matrix-python`, made here from the host's own files (tests/src/images.rs's
# host_python_image, plus numpy, pandas and what they import): python3 and its standard
# library, the dist-packages numpy+pandas load, /usr/bin/true and sleep, and every shared
# library these need. CodeInterpreterTool asks for `code-interpreter:latest`: the same image.
echo "bench matrix: making the matrix-python image" >&2
r=$tmp/pyimg
mkdir -p "$r/usr/bin" "$r/usr/lib/python3/dist-packages" "$r/etc" "$r/tmp" "$r/workspace" "$r/root"
chmod 1777 "$r/tmp"
ln -s usr/bin "$r/bin"; ln -s usr/lib "$r/lib"; mkdir -p "$r/usr/lib64"; ln -s usr/lib64 "$r/lib64"
pyreal=$(readlink -f "$py")
cp -a "$pyreal" /usr/bin/true /usr/bin/sleep "$r/usr/bin/"
ln -s "$(basename "$pyreal")" "$r/usr/bin/python3"
cp -a "/usr/lib/$(basename "$pyreal")" "$r/usr/lib/"
for m in $("$py" -I -c 'import sys, numpy, pandas
print(*sorted({f.split("/dist-packages/")[1].split("/")[0] for f in (getattr(m, "__file__", None) or "" for m in list(sys.modules.values())) if "/usr/lib/python3/dist-packages/" in f and "_distutils_hack" not in f}))'); do
    cp -a "/usr/lib/python3/dist-packages/$m" "$r/usr/lib/python3/dist-packages/"
done
cp -a /etc/ld.so.cache "$r/etc/"
mkdir -p "$r/usr/share"
cp -a /usr/share/zoneinfo "$r/usr/share/" # pandas (Debian: pytz and dateutil use the system tzdata)
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
printf 'root:x:0:\n' >"$r/etc/group"
find "$pyreal" /usr/bin/true /usr/bin/sleep "$r/usr/lib" -name '*.so*' -o -type f -perm -u+x 2>/dev/null |
    while read -r f; do ldd "$f" 2>/dev/null || true; done |
    awk '/=> \//{ print $3 } /^\t\/.*ld-linux/{ print $1 }' | sort -u |
    while read -r lib; do
        for p in "$lib" "$(readlink -f "$lib")"; do
            p=${p#/usr}
            mkdir -p "$r/usr$(dirname "$p")"
            cp -anL "/usr$p" "$r/usr$p" 2>/dev/null || cp -anL "$p" "$r/usr$p" 2>/dev/null || true
        done
    done
AGENTRUN_NO_DAEMON=1 "$bin" image add matrix-python "$r" --cmd python3 --workdir /workspace >/dev/null
AGENTRUN_NO_DAEMON=1 "$bin" image tag matrix-python code-interpreter:latest >/dev/null
rm -rf "$r"
AGENTRUN_NO_DAEMON=1 timeout 120 "$bin" exec --image matrix-python -- python3 -I -c "$numpy_code" >"$tmp/out" 2>&1 &&
    [ "$(cat "$tmp/out")" = 3 ] || { echo "bench matrix: the matrix-python image does not run numpy+pandas:" >&2; tail -n 5 "$tmp/out" >&2; exit 1; }

# --- agentrun: one daemon per profile -------------------------------------------------------
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
osb_cost='{}'
pool_notes=''
[[ $groups == *" agentrun "* ]] || profiles=
for prof in $profiles; do
    echo "bench matrix: profile $prof" >&2
    "$bin" serve --pool "host:$prof=$pool_size" --pool "matrix-python:$prof=$pool_size" --docker-socket "$dsock" --docker-profile "$prof" \
        --listen "127.0.0.1:$port" --opensandbox-profile "$prof" >"$tmp/serve-$prof.log" 2>&1 &
    daemon_pid=$!
    if ! r=$("$py" "$here/pool.py" wait-socket "$sock" "$daemon_pid" "$start_secs"); then
        echo "bench matrix: the daemon for $prof did not come up: $r: $(tail -n 3 "$tmp/serve-$prof.log" | oneline)" >&2
        exit 1
    fi
    for _ in $(seq 100); do [ -S "$dsock" ] && break; sleep 0.1; done
    "$py" "$here/pool.py" wait-full "$bin" "$AGENTRUN_STATE_DIR" "$start_secs" >/dev/null || true
    if grep -q '^zygote = true' "$repo/bundles/$prof.toml" 2>/dev/null; then
        # A fresh shell's first runs fall back while its zygote imports: warm until they use it.
        "$py" "$here/python.py" warm "$bin" "$prof" 1 yes "$pool_size" 2 120 -- python3 -c 'print(1)' >"$tmp/warm-$prof.json" ||
            echo "bench matrix: $prof: runs did not use the zygote: $(oneline <"$tmp/warm-$prof.json")" >&2
    fi
    key=$(cat "$AGENTRUN_STATE_DIR/api-key")
    [ "$prof" != default ] || osb_cost=$("$cpy" "$here/matrix.py" osb-cost --domain "127.0.0.1:$port" --key "$key" 2>/dev/null || echo '{}')
    "$cpy" "$here/matrix.py" cells --group agentrun --profile "$prof" "${common[@]}" --bin "$bin" \
        --domain "127.0.0.1:$port" --key "$key" --docker-sock "$dsock" ${ONLY:+--only "$ONLY"}
    pool_notes+="- \`$prof\`: $("$bin" pool status --json 2>/dev/null | "$py" -c 'import json, sys
s = json.load(sys.stdin)
print("; ".join("%s: %s hits, %s misses" % (p.get("image") or p.get("key") or "?", p.get("hits"), p.get("misses")) for p in s["pools"]))' 2>/dev/null || echo '?')"$'\n'
    stop_daemon
    [ "${daemon_rc:-0}" = 0 ] || echo "bench matrix: serve ($prof) exited $daemon_rc: $(tail -n 3 "$tmp/serve-$prof.log" | oneline)" >&2
    rm -f "$dsock"
done

# --- a real dockerd -----------------------------------------------------------------------
dockerd_version=
if [ -z "$dockerd_reason" ]; then
    echo "bench matrix: dockerd" >&2
    AGENTRUN_NO_DAEMON=1 "$bin" image export matrix-python -o "$tmp/pyimg-oci.tar"
    skopeo copy -q "oci-archive:$tmp/pyimg-oci.tar" "docker-archive:$tmp/pyimg.tar:code-interpreter:latest"
    rm -f "$tmp/pyimg-oci.tar"
    mkdir -p "$d/data" "$d/exec"
    echo '{}' >"$d/daemon.json"
    dockerd --config-file "$d/daemon.json" --data-root "$d/data" --exec-root "$d/exec" \
        --pidfile "$d/dockerd.pid" --host "unix://$d/docker.sock" --iptables=false --ip6tables=false \
        --bridge=none --userland-proxy=false --log-level=error >"$tmp/dockerd.log" 2>&1 &
    dockerd_pid=$!
    t0=$SECONDS
    until DOCKER_HOST=unix://$d/docker.sock timeout 5 docker version >/dev/null 2>&1; do
        if ! kill -0 "$dockerd_pid" 2>/dev/null || [ $((SECONDS - t0)) -ge $start_secs ]; then
            dockerd_reason="dockerd did not come up: $(tail -n 3 "$tmp/dockerd.log" | oneline)"
            break
        fi
        sleep 0.2
    done
    if [ -z "$dockerd_reason" ]; then
        DOCKER_HOST=unix://$d/docker.sock docker load -q -i "$tmp/pyimg.tar" >/dev/null
        dockerd_version=$(DOCKER_HOST=unix://$d/docker.sock docker version -f '{{.Server.Version}}')
    fi
fi
"$cpy" "$here/matrix.py" cells --group dockerd "${common[@]}" --docker-sock "$d/docker.sock" \
    --dockerd-image code-interpreter:latest --dockerd-reason "$dockerd_reason" --dockerd-runs "$dockerd_runs"
stop_dockerd

# --- nothing left behind ---------------------------------------------------------------------
leftovers=()
sleep 0.5
new_cgroups=$(comm -13 <(echo "$cgroups_before") <(cgroups_now) | while read -r c; do
    [ -n "$c" ] && [ -e "$AGENTRUN_STATE_DIR/sandboxes/$(basename "$c")" ] && echo "$c"; done || true)
[ -z "$new_cgroups" ] || leftovers+=("cgroups: $(echo "$new_cgroups" | tr '\n' ' ')")
[ -z "$(mounts_under_tmp)" ] || leftovers+=("mounts: $(mounts_under_tmp | tr '\n' ' ')")
left_sb=$(ls -A "$AGENTRUN_STATE_DIR/sandboxes" 2>/dev/null || true)
[ -z "$left_sb" ] || leftovers+=("state dirs: $(echo "$left_sb" | tr '\n' ' ')")
[ -z "$(our_procs)" ] || leftovers+=("agentrun processes: $(our_procs | tr '\n' ' ')")

# --- report ------------------------------------------------------------------------------------
cmd="RUNS=$runs LATENCY_SECS=$max_secs THROUGHPUT_SECS=$secs CLIENTS=\"$clients\" DOCKERD_RUNS=$dockerd_runs POOL_SIZE=$pool_size hack/bench matrix"
[ "${SMOKE:-0}" != 1 ] || cmd="SMOKE=1 $cmd"
meta=$("$py" - "$runs" "$secs" "$clients" "$osb_cost" "$cmd" "$max_secs" "$settle_secs" <<'EOF'
import json, sys
runs, secs, clients, osb, cmd, max_secs = sys.argv[1:7]
print(json.dumps({"runs": int(runs), "secs": float(secs), "clients": [int(c) for c in clients.split()],
                  "max_secs": float(max_secs), "settle_secs": float(sys.argv[7]),
                  "osb_cost": json.loads(osb or "{}"), "command": cmd}))
EOF
)
report=$tmp/report.md
"$cpy" "$here/matrix.py" report --cells "$cells" --md "$tmp/tables.md" --json "$tmp/matrix.json" --meta "$meta" >/dev/null
{
    echo "Machine: $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%d), load average at start $load_start; state dir on a tmpfs; agentrun: $src_info; Python $("$py" -c 'import sys; print(sys.version.split()[0])'); dockerd ${dockerd_version:-n/a}; command: \`$cmd\` ($((SECONDS - t_start)) s)"
    echo
    cat "$tmp/tables.md"
    echo "Pools (hits and misses over each profile's session, warm-ups included):"
    echo
    printf '%s' "$pool_notes"
    echo
    if [ ${#leftovers[@]} -eq 0 ]; then
        echo "Left behind after every daemon stopped and every run ended: nothing (no agentrun cgroup, mount under the temp dir, state dir or process)."
    else
        echo "**Left behind:** ${leftovers[*]}"
    fi
} >"$report"
echo
cat "$report"
[ -z "${OUT:-}" ] || cp "$report" "$OUT"
[ -z "${JSON:-}" ] || cp "$tmp/matrix.json" "$JSON"
exit 0
