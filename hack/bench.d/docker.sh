#!/usr/bin/env bash
# `hack/bench docker`: `docker run --rm --network none busybox /bin/true` with the docker CLI
# (hyperfine -N, whole CLI process; median and p95) against
#   - agentrun: `agentrun serve --docker-socket` (a container = a pooled sandbox), and
#   - dockerd: Debian's docker.io dockerd (+ the containerd and runc it starts), started here
#     with --iptables=false --bridge=none and its own data-root, exec-root, pidfile, config
#     and socket under a temp dir, the same busybox image loaded into it with `docker load`
#     (`agentrun image export` writes an OCI layout, which dockerd 20.10 cannot load: skopeo
#     turns it into a `docker save` archive). It is stopped and its files removed afterwards.
# Both have no network in the container (`--network none`); the image is the test busybox
# (images/busybox/build.sh, one static binary). A third row is the floor: the same docker CLI
# command against a stand-in daemon that answers at once (hack/bench.d/docker_floor.py), the
# CLI's own time, below which no daemon can go.
#
#   RUNS=50 hack/bench docker           # runs per command (default 30), after 3 warmups
#   POOL_SIZE=4 hack/bench docker       # ready sandboxes kept for busybox containers (default
#                                       # 2): `agentrun serve --pool busybox:container=N`; the
#                                       # Docker API's containers (asked by image id) come from
#                                       # that pool. POOL_SIZE=0: every container made on demand.
#   AGENTRUN_BIN=path hack/bench docker # benchmark this binary (default: hack/build-static)
#   OUT=docker.md hack/bench docker     # also write the report to a file
#
# Prints a markdown table and the ratio of the medians (the issue's target: agentrun >= 15x
# faster than dockerd), and the best ratio the CLI's own time allows. Checks that no mount,
# agentrun cgroup or process is left.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
repo=$PWD
here=$repo/hack/bench.d
py=/usr/bin/python3
runs=${RUNS:-30}
pool_size=${POOL_SIZE:-2}
start_secs=60
stop_secs=30

need=()
for t in hyperfine:hyperfine dockerd:docker.io containerd:containerd runc:runc busybox:busybox-static skopeo:skopeo; do
    command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    { timeout 300 apt-get update -qq && timeout 600 apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } ||
        { echo "bench docker: could not install ${need[*]}" >&2; exit 1; }
fi
command -v docker >/dev/null || { echo "bench docker: the docker CLI is required" >&2; exit 1; }

if [ -n "${AGENTRUN_BIN:-}" ]; then
    src=$AGENTRUN_BIN
else
    src=$("$repo/hack/build-static") ||
        { echo "bench docker: build failed (AGENTRUN_BIN=path benchmarks an existing binary)" >&2; exit 1; }
fi
tmp=$(mktemp -d /tmp/agentrun-docker-bench.XXXXXX)
chmod 755 "$tmp" # the sandbox uid must be able to search the state dir and image root
cp "$src" "$tmp/agentrun"
bin=$tmp/agentrun
export AGENTRUN_STATE_DIR=$tmp/state AGENTRUN_ROOT=$tmp/root DOCKER_CONFIG=$tmp/docker-config
unset AGENTRUN_NO_DAEMON OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT DOCKER_HOST DOCKER_CONTEXT
asock=$tmp/agentrun-docker.sock
d=$tmp/dockerd
dsock=$d/docker.sock
fsock=$tmp/floor.sock
agentrun_pid='' dockerd_pid='' floor_pid=''

mounts_under_tmp() { awk -v p="$tmp/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo; }

stop_pid() { # pid name: SIGTERM, bounded wait, SIGKILL
    local pid=$1 t0
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    t0=$SECONDS
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt $stop_secs ]; do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "bench docker: $2 did not exit within ${stop_secs} s of SIGTERM: SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    stop_pid "$floor_pid" "the stand-in daemon"
    floor_pid=
    stop_pid "$agentrun_pid" "agentrun serve"
    agentrun_pid=
    stop_pid "$dockerd_pid" dockerd
    dockerd_pid=
    # dockerd's managed containerd normally exits with it; anything of it still running from
    # this temp dir goes now.
    for p in /proc/[0-9]*; do
        if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q -- "$d/"; then
            kill -KILL "${p#/proc/}" 2>/dev/null || true
        fi
    done
    mounts_under_tmp | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
    if [ -n "$(mounts_under_tmp)" ]; then
        echo "bench docker: mounts left under $tmp, not removing it:" >&2
        mounts_under_tmp >&2
    else
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

oneline() { tr '\n\t|' '  /' | sed 's/  */ /g; s/^ //; s/ $//' | cut -c1-200; }

# --- the image, in agentrun's store and as a tar for dockerd ------------------------------
"$repo/images/busybox/build.sh" "$tmp/busybox" >/dev/null
AGENTRUN_NO_DAEMON=1 "$bin" image add busybox "$tmp/busybox" --cmd /bin/sh >/dev/null
AGENTRUN_NO_DAEMON=1 "$bin" image export busybox -o "$tmp/busybox-oci.tar"
skopeo copy -q "oci-archive:$tmp/busybox-oci.tar" "docker-archive:$tmp/busybox.tar:busybox:latest"
rm -rf "$tmp/busybox"

# --- agentrun -------------------------------------------------------------------------------
cgroups_now() { find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d -path '*/agentrun/*' 2>/dev/null | sort; }
cgroups_before=$(cgroups_now)
"$bin" serve --pool "busybox:container=$pool_size" --docker-socket "$asock" >"$tmp/serve.log" 2>&1 &
agentrun_pid=$!
# --- dockerd --------------------------------------------------------------------------------
mkdir -p "$d/data" "$d/exec"
echo '{}' >"$d/daemon.json"
dockerd --config-file "$d/daemon.json" --data-root "$d/data" --exec-root "$d/exec" \
    --pidfile "$d/dockerd.pid" --host "unix://$dsock" --iptables=false --ip6tables=false \
    --bridge=none --userland-proxy=false --log-level=error >"$d/dockerd.log" 2>&1 &
dockerd_pid=$!

wait_ping() { # socket pid name
    local t0=$SECONDS
    until DOCKER_HOST=unix://$1 timeout 5 docker version >/dev/null 2>&1; do
        if ! kill -0 "$2" 2>/dev/null || [ $((SECONDS - t0)) -ge $start_secs ]; then
            echo "bench docker: $3 did not come up: $(tail -n 5 "$4" | oneline)" >&2
            exit 1
        fi
        sleep 0.2
    done
}
"$py" "$here/docker_floor.py" "$fsock" >"$tmp/floor.log" 2>&1 &
floor_pid=$!
wait_ping "$asock" "$agentrun_pid" "agentrun serve --docker-socket" "$tmp/serve.log"
wait_ping "$dsock" "$dockerd_pid" dockerd "$d/dockerd.log"
DOCKER_HOST=unix://$dsock docker load -q -i "$tmp/busybox.tar" >/dev/null
dockerd_version=$(DOCKER_HOST=unix://$dsock docker version -f '{{.Server.Version}}')
# The pool full before anything is timed (bounded).
"$py" "$here/pool.py" wait-full "$bin" "$AGENTRUN_STATE_DIR" "$start_secs" >/dev/null || true

# --- measure --------------------------------------------------------------------------------
argv="run --rm --network none busybox /bin/true"
status=$tmp/status.tsv json=$tmp/hyperfine.json
: >"$status"
args=()
floor_name="floor: the CLI alone (a stand-in daemon that answers at once)"
for row in "agentrun (docker API)|$asock" "dockerd $dockerd_version (Debian docker.io)|$dsock" "$floor_name|$fsock"; do
    name=${row%%|*} sock=${row#*|}
    cmd="docker -H unix://$sock $argv"
    reason=
    if ! out=$(timeout 60 $cmd 2>&1 </dev/null); then
        reason="failed: $(printf %s "$out" | oneline)"
    elif [ -n "$out" ]; then
        reason="printed '$(printf %s "$out" | oneline)'"
    fi
    printf '%s\t%s\n' "$name" "$reason" >>"$status"
    [ -n "$reason" ] || args+=(-n "$name" "$cmd")
done
if [ ${#args[@]} -gt 0 ]; then
    hyperfine -N -i --warmup 3 --runs "$runs" --export-json "$json" "${args[@]}" >&2
fi
table=$("$py" "$here/table.py" "docker $argv" "$status" ${args:+"$json"})
ratio=$("$py" - "$json" <<'EOF'
import json, sys
try:
    r = {x.get("command_name", x["command"]): x["median"] for x in json.load(open(sys.argv[1]))["results"]}
except (OSError, ValueError, KeyError):
    sys.exit()
a = next((v for k, v in r.items() if k.startswith("agentrun")), None)
d = next((v for k, v in r.items() if k.startswith("dockerd")), None)
f = next((v for k, v in r.items() if k.startswith("floor")), None)
if a and d:
    print(f"dockerd / agentrun median: {d / a:.1f}x (the issue's target: >= 15x)")
if d and f:
    print(f"dockerd / the CLI alone (the best ratio any daemon could reach here): {d / f:.1f}x")
if a and f:
    print(f"agentrun's part of its median (over the CLI alone): {(a - f) * 1000:.1f} ms")
EOF
)

pool=$("$bin" pool status --json 2>/dev/null | "$py" -c 'import json,sys; p=json.load(sys.stdin); q=p["pools"][0]; print("%d pool hits, %d misses, %d made on demand" % (q["hits"], q["misses"], p["unpooled"]))' 2>/dev/null || true)

# --- stop, and nothing left behind -------------------------------------------------------
stop_pid "$floor_pid" "the stand-in daemon"
floor_pid=
stop_pid "$agentrun_pid" "agentrun serve"
agentrun_pid=
stop_pid "$dockerd_pid" dockerd
dockerd_pid=
left=()
sleep 0.5
new_cgroups=$(comm -13 <(echo "$cgroups_before") <(cgroups_now) | sed '/^$/d')
[ -z "$new_cgroups" ] || left+=("agentrun cgroups: $(echo "$new_cgroups" | tr '\n' ' ')")
[ -z "$(ls -A "$AGENTRUN_STATE_DIR/sandboxes" 2>/dev/null)" ] || left+=("agentrun state dirs")
for p in /proc/[0-9]*; do
    if [ "$(readlink "$p/exe" 2>/dev/null)" = "$bin" ] ||
        tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q -- "$d/"; then
        left+=("process ${p#/proc/}: $(tr '\0' ' ' <"$p/cmdline" | cut -c1-80)")
    fi
done
[ -z "$(mounts_under_tmp)" ] || left+=("mounts: $(mounts_under_tmp | tr '\n' ' ')")

report=$tmp/report.md
{
    echo "Machine: $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%d), load average $(cut -d' ' -f1-3 /proc/loadavg); command: RUNS=$runs POOL_SIZE=$pool_size hack/bench docker"
    echo
    echo "### \`docker $argv\` (docker CLI $(docker version -f '{{.Client.Version}}' 2>/dev/null), hyperfine, $runs runs, whole CLI process)"
    echo
    echo "| workload | daemon | median (ms) | p95 (ms) |"
    echo "|---|---|---:|---:|"
    echo "$table"
    echo
    [ -z "$ratio" ] || echo "$ratio"
    [ -z "$pool" ] || echo "agentrun's busybox:container pool (warmups included): $pool"
    echo
    if [ ${#left[@]} -eq 0 ]; then
        echo "Left behind: nothing (no agentrun cgroup, state dir, mount or process of either daemon)."
    else
        printf 'Left behind: %s\n' "${left[@]}"
    fi
} >"$report"
cat "$report"
[ -z "${OUT:-}" ] || cp "$report" "$OUT"
[ ${#left[@]} -eq 0 ]
