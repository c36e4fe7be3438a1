# Shared by hack/bench and hack/bench.d/python.sh (sourced, not run). Expects $repo (the
# repository) and $py (/usr/bin/python3); check() also $tmp, stop_daemon() $daemon_pid and
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
