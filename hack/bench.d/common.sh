# Shared by hack/bench, hack/bench.d/python.sh and the `agentrun serve` benches (e2b.sh,
# opensandbox.sh, snapshot.sh, fork.sh); sourced, not run. Expects $repo (the repository);
# bench_sandlock also $py (/usr/bin/python3); check() also $tmp, stop_daemon() $daemon_pid and
# $stop_secs.
#
# bench_install WHO CMD:PKG...  apt-get installs PKG for each CMD not found (WHO prefixes the
#                               message when that fails; the caller decides what is fatal)
# bench_sandlock                sets $sandlock (its CLI) and $sandlock_reason (empty, or why
#                               there is none); installs it into .venv/bench once
# $bwrap_cmd, $sandlock_args    the bubblewrap and sandlock command lines, up to the command
# oneline                       stdin as one line for a table cell
# check CMD EXPECT              runs CMD once (60 s at most): sets $reason, empty when it
#                               exited 0 and printed EXPECT
# stop_daemon                   SIGTERM $daemon_pid, bounded wait, then SIGKILL; sets
#                               $daemon_rc and $daemon_stop, clears $daemon_pid
#
# For the scripts that bench one `agentrun serve` (e2b, opensandbox, snapshot, fork):
# bench_venv VENV CHECK PKG...   makes VENV and pip-installs PKG... unless its python runs
#                               the Python CHECK (exits 0)
# bench_setup NAME              copies $AGENTRUN_BIN (else hack/build-static's binary) to
#                               $tmp/agentrun ($tmp a new /tmp/agentrun-NAME-bench.*), exports a
#                               private AGENTRUN_STATE_DIR (on a tmpfs) and AGENTRUN_ROOT under
#                               it, unsets the OTLP endpoints, sets $port (a free loopback port)
# bench_serve ARGS...           starts `$tmp/agentrun serve ARGS...` (log $tmp/serve.log;
#                               $serve_pid) and traps EXIT to stop it and remove $tmp
# bench_serve_stop              SIGTERM $serve_pid, 30 s at most, then SIGKILL
# bench_pool_full               waits (60 s at most) for the daemon's first pool to be full
# bench_pool_summary            prints the pool's hits, misses and discarded shells
# bench_leftovers               sets $left: the daemon's cgroups, sandbox state dirs and
#                               mounts under $tmp still there (empty: none)

bench_install() {
    local who=$1 t need=()
    shift
    for t in "$@"; do
        command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
    done
    [ ${#need[@]} -gt 0 ] || return 0
    export DEBIAN_FRONTEND=noninteractive
    { timeout 300 apt-get update -qq && timeout 600 apt-get install -y -qq "${need[@]}" >/dev/null; } ||
        echo "$who: could not install ${need[*]}; continuing without what is missing" >&2
}

# sandlock: `sandlock run` (Landlock + seccomp, with its seccomp-notify supervisor; no
# namespaces). The PyPI package `sandlock` has no CLI (only the SDK and `sandlock-mcp`); the
# CLI is the same project's `sandlock-cli` crate, built with cargo at the PyPI package's
# version into the venv .venv/bench.
bench_sandlock() {
    local venv=$repo/.venv/bench ver target
    sandlock=$venv/bin/sandlock
    sandlock_reason=
    [ ! -x "$sandlock" ] || return 0
    echo "bench: installing sandlock into $venv (PyPI package; its CLI from crates.io: a few minutes, once)" >&2
    if [ ! -x "$venv/bin/pip" ]; then
        "$py" -m venv "$venv" >&2 || sandlock_reason="could not create a venv (python3-venv missing?)"
    fi
    if [ -z "$sandlock_reason" ]; then
        timeout 300 "$venv/bin/pip" install -q sandlock >&2 || sandlock_reason="pip install sandlock failed"
    fi
    if [ -z "$sandlock_reason" ]; then
        ver=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("sandlock"))') || ver=0.9.0
        target=$(mktemp -d /tmp/sandlock-build.XXXXXX)
        timeout 1800 cargo install -q --locked --root "$venv" --target-dir "$target" \
            sandlock-cli --version "$ver" >&2 ||
            sandlock_reason="the PyPI package has no CLI and cargo install sandlock-cli@$ver failed"
        rm -rf "$target"
    fi
}
# Read-only /usr /bin /lib /lib64 /etc/ld.so.cache /proc /dev, writable /tmp, clean
# environment, no network (its default).
sandlock_args="run -r /usr -r /bin -r /lib -r /lib64 -r /etc/ld.so.cache -r /proc -r /dev -w /tmp --clean-env --"
# bubblewrap: user, pid, ipc, uts, net namespaces, read-only host /usr; no cgroups, no
# seccomp, no Landlock, no overlay.
bwrap_cmd="bwrap --unshare-user --unshare-pid --unshare-ipc --unshare-uts --unshare-net \
--die-with-parent --new-session --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib \
--symlink usr/lib64 /lib64 --proc /proc --dev /dev --tmpfs /tmp --"

oneline() { tr '\n\t|' '  /' | sed 's/  */ /g; s/^ //; s/ $//' | cut -c1-160; }

# Checks that a command does the workload: exit 0 and the expected stdout. Sets `reason`.
check() {
    local cmd=$1 expect=$2 rc=0 out
    out=$(timeout 60 bash -c "exec $cmd" </dev/null 2>"$tmp/err") || rc=$?
    if [ $rc -eq 124 ]; then
        reason="timed out after 60 s"
    elif [ $rc -ne 0 ]; then
        reason="exit $rc: $(oneline <"$tmp/err")"
    elif [ "$out" != "$expect" ]; then
        reason="printed '$(printf %s "$out" | oneline)', expected '$expect'"
    else
        reason=
    fi
}

stop_daemon() { # bounded: SIGTERM, wait, then SIGKILL; sets daemon_rc and daemon_stop
    daemon_stop=
    [ -n "$daemon_pid" ] || return 0
    kill -TERM "$daemon_pid" 2>/dev/null || true
    local t0
    t0=$(date +%s%N)
    while kill -0 "$daemon_pid" 2>/dev/null && [ $((($(date +%s%N) - t0) / 1000000000)) -lt $stop_secs ] &&
        ! grep -q '^State:.*Z' "/proc/$daemon_pid/status" 2>/dev/null; do
        sleep 0.1
    done
    if kill -0 "$daemon_pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$daemon_pid/status" 2>/dev/null; then
        daemon_stop="did not exit within ${stop_secs} s of SIGTERM: SIGKILLed"
        kill -KILL "$daemon_pid" 2>/dev/null || true
    else
        daemon_stop="exited $((($(date +%s%N) - t0) / 1000000)) ms after SIGTERM"
    fi
    daemon_rc=0
    wait "$daemon_pid" 2>/dev/null || daemon_rc=$?
    daemon_stop+=", exit code $daemon_rc"
    daemon_pid=
}

bench_venv() {
    local venv=$1 check=$2
    shift 2
    if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check "$@"
    fi
}

bench_setup() {
    local name=$1 src
    if [ -n "${AGENTRUN_BIN:-}" ]; then
        src=$AGENTRUN_BIN
    else
        src=$("$repo/hack/build-static")
    fi
    tmp=$(mktemp -d "/tmp/agentrun-$name-bench.XXXXXX")
    chmod 755 "$tmp"
    cp "$src" "$tmp/agentrun"
    export AGENTRUN_STATE_DIR=$tmp/state AGENTRUN_ROOT=$tmp/root
    # The state dir on a tmpfs, as the default /run/agentrun is on a standard host (see hack/bench).
    mkdir -p "$AGENTRUN_STATE_DIR"
    mount -t tmpfs -o mode=0755,size=512m agentrun-bench-state "$AGENTRUN_STATE_DIR"
    unset OTEL_EXPORTER_OTLP_ENDPOINT OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
}

bench_serve() {
    "$tmp/agentrun" serve "$@" >"$tmp/serve.log" 2>&1 &
    serve_pid=$!
    trap 'bench_serve_stop; umount "$tmp/state" 2>/dev/null; rm -rf "$tmp"' EXIT
}

bench_serve_stop() {
    kill -TERM "$serve_pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
}

bench_pool_full() { # up, and the pool full (status lists ready >= target), at most 60 s
    local ready
    for _ in $(seq 600); do
        ready=$("$tmp/agentrun" pool status --json 2>/dev/null | python3 -c 'import json,sys; p=json.load(sys.stdin)["pools"][0]; print(p["ready"] >= p["target"])' 2>/dev/null || true)
        [ "$ready" = True ] && break
        sleep 0.1
    done
}

bench_pool_summary() {
    "$tmp/agentrun" pool status --json | python3 -c 'import json,sys; s=json.load(sys.stdin); p=s["pools"][0]; print(p["hits"], "pool hits,", p["misses"], "misses; shells discarded:", s.get("discarded") or "none")'
}

bench_leftovers() {
    left=$(find /sys/fs/cgroup -mindepth 2 -maxdepth 3 -type d -path '*/agentrun/*' 2>/dev/null | while read -r d; do [ -e "$tmp/state/sandboxes/$(basename "$d")" ] && echo "$d"; done || true)
    left+=$(ls -A "$tmp/state/sandboxes" 2>/dev/null || true)
    left+=$(awk -v p="$tmp/" -v s="$tmp/state" 'index($5, p) == 1 && $5 != s { print $5 }' /proc/self/mountinfo)
}
