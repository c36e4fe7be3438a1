#!/bin/bash
# CPU per run of a burst on a fresh pool (issue 30; docs/benchmarks.md, "code-interpreter vs
# default under a burst"): burst_cpu.sh ROUNDS C N PROFILE BIN...
# Per round, for each binary in turn (interleaved A/B): a fresh daemon (state dir on a tmpfs,
# `--pool host:PROFILE=4 --pool host:default=4`), its pools full and zygotes ready, then C
# clients x N runs of `agentrun exec --profile PROFILE -- /bin/true`; prints runs/s, the CPU per
# run of the daemon and its clients (one cpuacct cgroup) plus that of its shells (their
# `agentrun/ar-*` cgroups, sampled every 20 ms so that shells destroyed meanwhile count), and
# the pool misses. Root; cgroup v1 cpuacct (this machine's layout).
set -u
R=$1; C=$2; N=$3; P=$4; shift 4
CG=/sys/fs/cgroup/cpuacct
W=$(mktemp -d); chmod 755 "$W"  # the shells' uid must reach the state dir
cat >"$W/sampler.py" <<'PY'
import os, sys, time
st, out, stop = sys.argv[1:4]
CG = "/sys/fs/cgroup/cpuacct/agentrun"
last = {}
while not os.path.exists(stop):
    try:
        mine = set(os.listdir(st + "/sandboxes"))
    except OSError:
        mine = set()
    for d in mine:
        try:
            last[d] = int(open(f"{CG}/{d}/cpuacct.usage").read())
        except OSError:
            pass
    open(out + ".tmp", "w").write(str(sum(last.values())))
    os.replace(out + ".tmp", out)
    time.sleep(0.02)
PY
for r in $(seq $R); do
  for BIN in "$@"; do
    ST=$W/st; mkdir -p $ST; mountpoint -q $ST || mount -t tmpfs tmpfs $ST
    rmdir $CG/agentrun-bench-burst 2>/dev/null; mkdir -p $CG/agentrun-bench-burst
    ( echo $BASHPID > $CG/agentrun-bench-burst/cgroup.procs; export AGENTRUN_STATE_DIR=$ST; exec setsid $BIN serve --pool host:$P=4 --pool host:default=4 > $W/serve.log 2>&1 ) &
    dpid=$!
    for i in $(seq 100); do AGENTRUN_STATE_DIR=$ST $BIN pool status --json 2>/dev/null | python3 -c '
import json,sys; s=json.load(sys.stdin); ok=all(p["ready"]>=p["target"] and (p.get("zygote") or {}).get("ready", True) for p in s["pools"]); sys.exit(0 if ok else 1)' && break; sleep 0.3; done
    sleep 2
    # shells' CPU: sampled every 50 ms so that shells destroyed during the burst still count
    rm -f $W/stop; echo 0 > $W/shells; python3 $W/sampler.py $ST $W/shells $W/stop &
    spid=$!; sleep 0.5
    s0=$(cat $W/shells); d0=$(cat $CG/agentrun-bench-burst/cpuacct.usage); t0=$(date +%s%N)
    st0=$(AGENTRUN_STATE_DIR=$ST $BIN pool status --json)
    cl=(); for c in $(seq $C); do ( echo $BASHPID > $CG/agentrun-bench-burst/cgroup.procs; for i in $(seq $N); do AGENTRUN_STATE_DIR=$ST $BIN exec --profile $P -- /bin/true || echo FAIL; done ) & cl+=($!); done; wait "${cl[@]}"
    t1=$(date +%s%N); d1=$(cat $CG/agentrun-bench-burst/cpuacct.usage); sleep 0.2; s1=$(cat $W/shells)
    st1=$(AGENTRUN_STATE_DIR=$ST $BIN pool status --json)
    touch $W/stop; wait $spid
    misses=$(python3 -c 'import json,sys; a,b=(json.loads(x) for x in sys.argv[1:]); print(sum(p["misses"] for p in b["pools"])-sum(p["misses"] for p in a["pools"]), b["created"]-a["created"])' "$st0" "$st1")
    echo "round $r $(basename $BIN) $P C=$C: runs/s $(( C*N*1000000000/(t1-t0) )) cpu/run $(( (d1-d0+s1-s0)/C/N/1000 )) us (clients+daemon $(( (d1-d0)/C/N/1000 )), shells $(( (s1-s0)/C/N/1000 ))) misses,created: $misses"
    kill $dpid; wait $dpid 2>/dev/null; sleep 1
    AGENTRUN_STATE_DIR=$ST AGENTRUN_NO_DAEMON=1 $BIN gc >/dev/null 2>&1
    umount $ST 2>/dev/null
  done
done
rmdir $CG/agentrun-bench-burst 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$W"
