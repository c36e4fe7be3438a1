//! Cells: a pooled shell is reused run after run, each run in a fresh cell (its own pid, mount
//! and ipc namespaces, writable layer, /tmp, /dev/shm, /dev/mqueue, /proc), and a shell in any
//! doubt is discarded. Through the real binary, with a daemon keeping one shell where it
//! matters (so consecutive runs land in the same shell).
//!
//! Contract under test (issue 13):
//! - nothing of run 1 is visible to run 2 on the same shell: files in `/`, `/tmp`,
//!   `/var/tmp`, `/dev/shm`; a daemonized, setsid'd, double-forked process (gone, its pid not
//!   visible); SysV shm/sem/msg and POSIX mqueues; abstract and path unix sockets; TCP/UDP
//!   listeners on 127.0.0.1 and ::1; environment, cwd, rlimits and cgroup limits of run 1;
//! - a run cannot change its shell (links, addresses, routes, iptables, sysctls, mounts,
//!   hostname, its shell's init); a shell changed anyway (here: from the host) or with a
//!   process left in it is discarded, and `pool status` says why;
//! - a cell that cannot be made fails that run only (125, one line), the shell is discarded;
//! - OOM (137 + message), timeout (124, the whole cell killed), a client gone mid-run and
//!   10 MB of output on a reused shell; the run's peak memory is its own after a heavy run on the same shell;
//! - an idle shell holds a spare cell (cloned into namespaces of its own, its root built) that
//!   the next run takes; a run asking for another writable-layer size gets a cell of its own;
//! - every run shape takes a pooled shell (workspace, --ro/--rw, limits, env, allowlist
//!   profiles with the run's own egress proxy); a shell serves at most --shell-max-runs runs.
//!
//! Every test holds the exclusive e2e lock (they count shells and host-wide processes).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use agentrun_e2e::otlp::OtlpReceiver;
use agentrun_e2e::*;

const FILL: Duration = Duration::from_secs(60);

/// The one ready shell of a pool of one (waits for it to be back).
fn the_shell(d: &Daemon) -> PsEntry {
    let mut last = Vec::new();
    let found = wait_until(FILL, || {
        last = d.ps();
        let ready: Vec<PsEntry> = last
            .iter()
            .filter(|e| e.state == "ready")
            .cloned()
            .collect();
        (ready.len() == 1 && !last.iter().any(|e| e.state == "running")).then(|| ready[0].clone())
    });
    found.unwrap_or_else(|| panic!("no single ready shell: {last:#?}\n{}", d.log()))
}

/// A daemon keeping one shell of `host` with `profile`.
/// Waits (bounded) until a run that prints `running` first is going.
fn wait_running(client: &mut Running) {
    let going = wait_until(FILL, || {
        client.stdout_so_far().contains("running").then_some(())
    });
    assert!(
        going.is_some(),
        "the run never started: {}",
        client.stderr_so_far()
    );
}

fn one_shell(profile: &str, extra: &[&str]) -> Daemon {
    let mut d = Daemon::unstarted();
    let mut args = vec!["--pool".to_string(), format!("host:{profile}=1")];
    args.extend(extra.iter().map(|s| s.to_string()));
    d.launch(args);
    the_shell(&d);
    d
}

const RUN1: &str = r#"
import ctypes, os, resource, socket, sys, time
port = int(sys.argv[1])
for p in ["/marker", "/etc/marker", "/tmp/marker", "/var/tmp/marker", "/dev/shm/marker"]:
    with open(p, "w") as f:
        f.write("secret")
    print("wrote", p)
os.system("ipcmk -M 4096 >/dev/null && ipcmk -S 1 >/dev/null && ipcmk -Q >/dev/null && echo sysv")
rt = ctypes.CDLL("librt.so.1", use_errno=True)
rt.mq_open.restype = ctypes.c_int
# (Landlock refuses the open itself: the queue's file system is not under the cell's root;
# the queue is made all the same.)
rt.mq_open(b"/agentrun-mq", os.O_CREAT | os.O_RDWR, 0o600, None)
if "agentrun-mq" in os.listdir("/dev/mqueue"):
    print("mqueue")
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        socks = []
        u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); u.bind("\0agentrun-abstract-cell"); u.listen(); socks.append(u)
        u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); u.bind("/tmp/agentrun-cell.sock"); u.listen(); socks.append(u)
        for fam, host in [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]:
            t = socket.socket(fam, socket.SOCK_STREAM); t.bind((host, port)); t.listen(); socks.append(t)
            d = socket.socket(fam, socket.SOCK_DGRAM); d.bind((host, port)); socks.append(d)
        for s in socks:
            os.set_inheritable(s.fileno(), True)
        os.write(w, str(os.getpid()).encode())
        os.execv("/bin/sleep", ["sleep", "3171"])
    os._exit(0)
pid = os.read(r, 32).decode()
print("daemon", pid)
print("cwd", os.getcwd(), "nproc", resource.getrlimit(resource.RLIMIT_NPROC)[0], "SECRET", os.environ.get("SECRET"))
"#;

const RUN2: &str = r#"
import os, resource, socket, subprocess, sys
port = int(sys.argv[1])
for p in ["/marker", "/etc/marker", "/tmp/marker", "/var/tmp/marker", "/dev/shm/marker", "/tmp/agentrun-cell.sock"]:
    if os.path.lexists(p):
        print("SEEN file", p)
ipcs = subprocess.run(["ipcs"], capture_output=True, text=True).stdout
for line in ipcs.splitlines():
    if line.startswith("0x"):
        print("SEEN sysv", line)
if os.listdir("/dev/mqueue"):
    print("SEEN mqueue", os.listdir("/dev/mqueue"))
unix = open("/proc/net/unix").read()
for name in ["@agentrun-abstract-cell", "/tmp/agentrun-cell.sock"]:
    if name in unix:
        print("SEEN unix", name)
hexport = "%04X" % port
for f in ["tcp", "tcp6", "udp", "udp6"]:
    for line in open("/proc/net/" + f).read().splitlines()[1:]:
        if line.split()[1].endswith(":" + hexport):
            print("SEEN", f, line.strip())
for fam, host in [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]:
    for kind in [socket.SOCK_STREAM, socket.SOCK_DGRAM]:
        s = socket.socket(fam, kind)
        try:
            s.bind((host, port))
        except OSError as e:
            print("SEEN port in use", host, kind, e)
        s.close()
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        cmd = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode()
    except OSError:
        continue
    if cmd.startswith("sleep " + "317"):
        print("SEEN process", pid, cmd)
if "SECRET" in os.environ:
    print("SEEN env")
if os.getcwd() == "/tmp":
    print("SEEN cwd")
if resource.getrlimit(resource.RLIMIT_NPROC)[0] == 40:
    print("SEEN rlimit")
x = bytearray(150 * 2**20)
x[::4096] = b"1" * len(x[::4096])
print("allocated", len(x))
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
"#;

#[test]
fn nothing_of_run_one_is_visible_to_run_two_on_the_same_shell() {
    let Some(_l) = setup_exclusive() else { return };
    // `container`: the whole root is writable (files in / and /etc can be tried).
    let d = one_shell("container", &[]);
    let shell = the_shell(&d);
    let port = (40_000 + std::process::id() % 20_000).to_string();
    let out = d
        .exec_with(
            [
                "--profile",
                "container",
                "-e",
                "SECRET=run-one",
                "--cwd",
                "/tmp",
                "--pids",
                "40",
                "--memory",
                "64M",
            ],
            ["python3", "-c", RUN1, &port],
        )
        .run();
    let stdout = out.success();
    for want in [
        "wrote /marker",
        "wrote /etc/marker",
        "wrote /dev/shm/marker",
        "sysv",
        "mqueue",
        "daemon ",
        "cwd /tmp nproc 40 SECRET run-one",
    ] {
        assert!(stdout.contains(want), "run 1 did not do {want:?}\n{out}");
    }
    assert_no_sandboxed_process(
        &["sleep", "3171"],
        Duration::from_secs(10),
        "after run 1 left a daemonized `sleep 3171` holding sockets",
    );
    // The same shell again: run 2 in a fresh cell of it.
    let again = the_shell(&d);
    assert_eq!(again.id, shell.id, "the shell must be reused\n{}", d.log());
    assert_eq!(again.pid, shell.pid, "the shell's init must be the same");
    let out = d
        .exec_with(["--profile", "container"], ["python3", "-c", RUN2, &port])
        .run();
    let stdout = out.success();
    let seen: Vec<&str> = stdout.lines().filter(|l| l.starts_with("SEEN")).collect();
    assert!(
        seen.is_empty(),
        "run 2 sees what run 1 left: {seen:#?}\n{out}"
    );
    assert!(
        stdout.contains("allocated 157286400"),
        "run 1's 64M limit must not hold for run 2\n{out}"
    );
    assert_eq!(the_shell(&d).id, shell.id, "still the same shell");
    let pool = d
        .pool_status()
        .into_iter()
        .find(|p| p.profile == "container")
        .unwrap();
    assert_eq!((pool.hits, pool.misses), (2, 0), "{pool:?}\n{}", d.log());
    assert!(d.discarded().is_empty(), "{:?}", d.discarded());
}

#[test]
fn a_run_cannot_change_its_shell() {
    let Some(_l) = setup_exclusive() else { return };
    let d = one_shell("default", &[]);
    let shell = the_shell(&d);
    let script = r#"
        try() { if "$@" >/dev/null 2>&1; then echo "CHANGED: $*"; else echo "denied: $*"; fi; }
        try ip link set lo down
        try ip addr add 10.9.9.9/32 dev lo
        try ip route add 10.10.0.0/16 dev lo
        try iptables -A INPUT -j DROP
        try sh -c 'echo 0 > /proc/sys/net/ipv4/ip_forward'
        try sh -c 'echo 1 > /proc/sys/net/ipv4/conf/lo/forwarding'
        try sysctl -w net.ipv4.ping_group_range='0 0'
        try mount -t tmpfs x /mnt
        try hostname changed-by-run
        try python3 -c 'import ctypes, sys; sys.exit(ctypes.CDLL(None).ptrace(16, 1, 0, 0) != 0)'
        try python3 -c 'import os, sys; os.unshare(os.CLONE_NEWNET)'
        try python3 -c 'import os; os.setns(os.open("/proc/1/ns/mnt", os.O_RDONLY), 0)'
        echo "pid1: $(tr '\0' ' ' < /proc/1/cmdline)"
        echo "procs: $(ls /proc | grep -c '^[0-9]')"
    "#;
    let out = d.exec(["sh", "-c", script]).run();
    let stdout = out.success();
    assert!(
        !stdout.contains("CHANGED"),
        "a run changed its shell:\n{out}"
    );
    assert_eq!(stdout.matches("denied:").count(), 12, "{out}");
    // Its shell's init is not in the cell: the cell's PID 1 is its own, and the shell's init
    // lives on, same pid, not discarded.
    assert!(
        proc_info(shell.pid).is_some(),
        "the shell's init died\n{}",
        d.log()
    );
    let after = the_shell(&d);
    assert_eq!((after.id, after.pid), (shell.id, shell.pid));
    assert!(d.discarded().is_empty(), "{:?}", d.discarded());
    // And the next run sees the shell as it was.
    let out = d
        .exec([
            "sh",
            "-c",
            "hostname; cat /sys/class/net/lo/operstate; ip -o addr show lo | grep -c 10.9.9.9",
        ])
        .run();
    assert_eq!(out.stdout(), "sandbox\nunknown\n0\n", "{out}");
}

#[test]
fn a_shell_changed_or_left_with_a_process_is_discarded() {
    let Some(_l) = setup_exclusive() else { return };
    let d = one_shell("default", &[]);
    // Changed: while a run goes, its shell's network namespace gets an address (from the
    // host: no run can do that, see a_run_cannot_change_its_shell).
    let shell = the_shell(&d);
    let mut client = d.exec(["sh", "-c", "echo running; sleep 2"]).spawn();
    wait_running(&mut client);
    let added = host(
        "nsenter",
        [
            "-t",
            &shell.pid.to_string(),
            "-n",
            "ip",
            "addr",
            "add",
            "10.77.0.1/32",
            "dev",
            "lo",
        ],
    );
    assert_eq!(added.code(), 0, "{added}");
    client.wait_or_kill(Duration::from_secs(30)).assert_code(0);
    let mut last = BTreeMap::new();
    let gone = wait_until(FILL, || {
        last = d.discarded();
        (last.get("shell_changed") == Some(&1)).then_some(())
    });
    assert!(
        gone.is_some(),
        "changed shell not discarded: {last:?}\n{}",
        d.log()
    );
    let next = the_shell(&d);
    assert_ne!(next.id, shell.id, "a changed shell must not serve again");

    // A process left in the shell's cgroup (as one outliving its cell would be).
    let mut sleeper = std::process::Command::new("sleep")
        .arg("1000")
        .spawn()
        .unwrap();
    let mut client = d.exec(["sh", "-c", "echo running; sleep 2"]).spawn();
    wait_running(&mut client);
    fs::write(shell_procs_file(&next.id), sleeper.id().to_string()).unwrap();
    client.wait_or_kill(Duration::from_secs(30)).assert_code(0);
    let gone = wait_until(FILL, || {
        last = d.discarded();
        (last.get("outlived") == Some(&1)).then_some(())
    });
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(
        gone.is_some(),
        "shell with a stray process kept: {last:?}\n{}",
        d.log()
    );
    assert_ne!(the_shell(&d).id, next.id);
    let out = d.exec(["sh", "-c", "echo still-serving"]).run();
    assert_eq!(out.success(), "still-serving\n");
}

#[test]
fn a_cell_that_cannot_be_made_fails_that_run_only() {
    let Some(_l) = setup_exclusive() else { return };
    let d = one_shell("default", &[]);
    let shell = the_shell(&d);
    let dir = tempdir();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // A directory mounted over a file of the image: the cell cannot attach it.
    let spec = format!("{}:/etc/hostname", dir.path().display());
    let out = d.exec_with(["--ro", spec.as_str()], ["true"]).run();
    out.assert_code(125);
    let err = out.stderr();
    assert_eq!(err.lines().count(), 1, "one line saying why\n{out}");
    assert!(err.contains("/etc/hostname"), "{out}");
    let mut last = BTreeMap::new();
    let gone = wait_until(FILL, || {
        last = d.discarded();
        (last.get("cell_failed") == Some(&1)).then_some(())
    });
    assert!(gone.is_some(), "{last:?}\n{}", d.log());
    let next = the_shell(&d);
    assert_ne!(next.id, shell.id);
    let out = d.exec(["sh", "-c", "echo fine"]).run();
    assert_eq!(out.success(), "fine\n", "{out}\n{}", d.log());
}

#[test]
fn oom_timeout_disconnect_and_big_output_on_a_reused_shell() {
    let Some(_l) = setup_exclusive() else { return };
    let d = one_shell("default", &[]);
    // Warm the shell up: every case below runs on a reused one.
    d.exec(["true"]).run().assert_code(0);
    let shell = the_shell(&d);

    let out = d
        .exec(["sh", "-c", "head -c 10000000 /dev/zero | tr '\\0' x"])
        .run();
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(out.stdout.len(), 10_000_000);
    assert!(out.stdout.iter().all(|b| *b == b'x'));
    assert_eq!(the_shell(&d).id, shell.id, "a clean run keeps its shell");

    let out = d
        .exec_with(
            ["--memory", "64M"],
            ["python3", "-c", "x = bytearray(10**9)"],
        )
        .run();
    out.assert_code(137);
    assert!(out.stderr().contains("out of memory (limit 64M)"), "{out}");
    let next = the_shell(&d);
    assert_ne!(next.id, shell.id, "an OOM discards the shell");

    d.exec(["true"]).run().assert_code(0);
    let out = d
        .exec_with(
            ["--timeout", "1s"],
            ["sh", "-c", "setsid sleep 3172 & trap '' TERM; sleep 3173"],
        )
        .run();
    out.assert_code(124);
    assert_no_sandboxed_process(&["sleep", "3172"], Duration::from_secs(10), "after 124");
    assert_no_sandboxed_process(&["sleep", "3173"], Duration::ZERO, "after 124");
    let d2 = d.discarded();
    assert_eq!(
        (d2.get("oom"), d2.get("timeout")),
        (Some(&1), Some(&1)),
        "{d2:?}"
    );
}

#[test]
fn a_runs_peak_memory_is_its_own_after_a_heavy_run() {
    let Some(_l) = setup_exclusive() else { return };
    let rx = OtlpReceiver::grpc();
    let mut d = Daemon::unstarted();
    for (k, v) in rx.otel_env() {
        d.set_env(k, v);
    }
    d.launch(["--pool", "host:default=1"]);
    the_shell(&d);
    let heavy = "x = bytearray(300 * 2**20); x[::4096] = b'1' * len(x[::4096]); print('heavy')";
    let out = d.exec(["python3", "-c", heavy]).run();
    assert_eq!(out.success(), "heavy\n");
    the_shell(&d);
    let out = d.exec(["sh", "-c", "echo light"]).run();
    assert_eq!(out.success(), "light\n");
    let spans = wait_until(Duration::from_secs(15), || {
        let v: Vec<_> = rx
            .spans()
            .into_iter()
            .filter(|s| s.name == "sandbox.exec")
            .collect();
        (v.len() >= 2).then_some(v)
    })
    .expect("two sandbox.exec spans");
    let peak = |s: &agentrun_e2e::otlp::ReceivedSpan| -> u64 {
        s.typed_attr("sandbox.memory_peak_bytes", "int")
            .parse()
            .unwrap()
    };
    let by_cmd = |c: &str| {
        spans
            .iter()
            .find(|s| {
                s.attributes
                    .get("process.command_line")
                    .is_some_and(|v| v.contains(c))
            })
            .unwrap()
    };
    let (h, l) = (peak(by_cmd("heavy")), peak(by_cmd("light")));
    assert!(h > 300 << 20, "heavy run peak {h}");
    assert!(
        l < 100 << 20,
        "the light run's peak ({l}) must not be the heavy run's ({h})"
    );
    assert_eq!(
        by_cmd("heavy").typed_attr("sandbox.id", "string"),
        by_cmd("light").typed_attr("sandbox.id", "string"),
        "both on the same shell"
    );
}

#[test]
fn every_run_shape_takes_a_pooled_shell() {
    let Some(_l) = setup_exclusive() else { return };
    let server = TcpServer::start("127.0.0.1");
    let d = one_shell("default", &[]);
    let ws = tempdir();
    fs::set_permissions(ws.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let data = tempdir();
    fs::set_permissions(data.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(data.path().join("in.txt"), "in").unwrap();
    let ro = format!("{}:/data", data.path().display());
    let port = server.port();
    let proxied =
        format!("curl -s -o /dev/null -x \"$HTTP_PROXY\" http://127.0.0.1:{port}/; echo proxied");
    let cases: Vec<(Vec<String>, String, &str)> =
        vec![
        (
            vec!["--workspace".into(), ws.path().display().to_string()],
            "echo w > out.txt; pwd".into(),
            "/workspace\n",
        ),
        (
            vec!["--ro".into(), ro.clone()],
            "cat /data/in.txt; echo".into(),
            "in\n",
        ),
        (
            ["--memory", "128M", "--pids", "50", "--cpus", "0.5", "--tmpfs-size", "8M"]
                .map(String::from)
                .to_vec(),
            "python3 -c 'import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[0])'; \
             df -k / | tail -1 | awk '{print $2}'"
                .into(),
            "50\n8192\n",
        ),
        (vec!["-e".into(), "K=V".into()], "echo $K".into(), "V\n"),
        (
            vec!["--allow-host".into(), format!("127.0.0.1:{port}")],
            proxied,
            "proxied\n",
        ),
    ];
    let before = d.default_pool();
    for (opts, cmd, want) in &cases {
        let out = d.exec_with(opts, ["sh", "-c", cmd]).run();
        let stdout = out.success();
        if !want.is_empty() {
            assert_eq!(stdout, *want, "{opts:?}\n{out}");
        }
    }
    assert_eq!(
        fs::read_to_string(ws.path().join("out.txt")).unwrap(),
        "w\n"
    );
    let after = d.default_pool();
    assert_eq!(
        after.hits - before.hits,
        cases.len() as u64,
        "every shape must be a pool hit: {before:?} -> {after:?}\n{}",
        d.log()
    );
    assert!(
        server.accepted() >= 1,
        "the allowed host was reached through the proxy"
    );
    assert!(d.discarded().is_empty(), "{:?}", d.discarded());
}

#[test]
fn a_shell_serves_at_most_its_max_runs() {
    let Some(_l) = setup_exclusive() else { return };
    let d = one_shell("default", &["--shell-max-runs", "2"]);
    let first = the_shell(&d);
    d.exec(["true"]).run().assert_code(0);
    assert_eq!(the_shell(&d).id, first.id);
    d.exec(["true"]).run().assert_code(0);
    let second = the_shell(&d);
    assert_ne!(
        second.id, first.id,
        "a shell past --shell-max-runs is replaced"
    );
    assert_eq!(d.discarded().get("max_runs"), Some(&1));
    let v = d.pool_status_json();
    assert_eq!(v["cells"].as_u64(), Some(2), "{v}");
    assert_eq!(v["shell_max_runs"].as_u64(), Some(2), "{v}");
}

/// A pool grown past its target by concurrent runs keeps its size when one of the shells its
/// runs use retires (`max_runs`): the refill replaces it ahead, not a later run on its path
/// (a miss). Before, a pool at or above its target was never refilled, so under load every
/// retirement became a miss.
#[test]
fn a_grown_pool_replaces_a_retired_shell_ahead_of_its_runs() {
    let Some(_l) = setup_exclusive() else { return };
    let d = one_shell("default", &["--shell-max-runs", "2"]);
    let gate = tempdir();
    fs::set_permissions(gate.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let ro = format!("{}:/gate", gate.path().display());
    // Run A holds the one shell until the gate opens; run B meanwhile grows the pool (a miss).
    let mut a = d
        .exec_with(
            ["--ro", ro.as_str()],
            [
                "sh",
                "-c",
                "echo running; while [ ! -e /gate/go ]; do sleep 0.02; done",
            ],
        )
        .timeout(Duration::from_secs(120))
        .spawn();
    wait_running(&mut a);
    d.exec(["true"]).run().assert_code(0);
    fs::write(gate.path().join("go"), "").unwrap();
    a.wait_or_kill(Duration::from_secs(60)).assert_code(0);
    let grown = |want: u64| {
        let mut last = None;
        let ok = wait_until(FILL, || {
            let p = d.default_pool();
            let ok = p.ready == want && !d.ps().iter().any(|e| e.state == "running");
            last = Some(p);
            ok.then_some(())
        });
        (ok.is_some(), last)
    };
    let (ok, last) = grown(2);
    assert!(
        ok,
        "two shells after two concurrent runs: {last:?}\n{}",
        d.log()
    );
    let before = d.default_pool();
    // Runs go to the shell that came back last: within two runs, one serves its second.
    for _ in 0..2 {
        d.exec(["true"]).run().assert_code(0);
        // The shell is back (or gone) once nothing is listed running.
        let settled = wait_until(FILL, || {
            (!d.ps().iter().any(|e| e.state == "running")).then_some(())
        });
        assert!(
            settled.is_some(),
            "a run's shell never came back: {:?}",
            d.ps()
        );
        if d.discarded().contains_key("max_runs") {
            break;
        }
    }
    assert_eq!(
        d.discarded().get("max_runs"),
        Some(&1),
        "{:?}",
        d.discarded()
    );
    let (ok, last) = grown(2);
    assert!(
        ok,
        "the retired shell of a pool grown to 2 (target 1) is replaced: {last:?}\n{}",
        d.log()
    );
    let after = d.default_pool();
    assert_eq!(
        after.misses, before.misses,
        "no run made a shell: {after:?}"
    );
}

/// The `cgroup.procs` file of shell `id`'s cgroup (a v1 controller's, or the unified one).
fn shell_procs_file(id: &str) -> String {
    ["pids", "memory", "cpu"]
        .iter()
        .map(|c| format!("/sys/fs/cgroup/{c}/agentrun/{id}/cgroup.procs"))
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or_else(|| format!("/sys/fs/cgroup/agentrun/{id}/cgroup.procs"))
}

/// The processes in shell `id`'s cgroup (host pids).
fn shell_processes(id: &str) -> Vec<i32> {
    fs::read_to_string(shell_procs_file(id))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[test]
fn an_idle_shell_holds_a_spare_cell_and_a_run_of_another_size_gets_its_own() {
    let Some(_l) = setup_exclusive() else { return };
    let d = one_shell("default", &[]);
    let shell = the_shell(&d);
    // Idle in its pool, the shell holds its init and one spare cell, cloned ahead of the next
    // run into pid and mount namespaces of its own.
    let ns = |pid: i32, kind: &str| fs::read_link(format!("/proc/{pid}/ns/{kind}")).ok();
    let spare = wait_until(FILL, || {
        let procs = shell_processes(&shell.id);
        (procs.len() == 2).then(|| *procs.iter().find(|p| **p != shell.pid).unwrap())
    })
    .unwrap_or_else(|| {
        panic!(
            "no spare cell beside the init: {:?}\n{}",
            shell_processes(&shell.id),
            d.log()
        )
    });
    for kind in ["pid", "mnt", "ipc"] {
        assert_ne!(ns(spare, kind), ns(shell.pid, kind), "{kind}");
    }
    // A run takes it: the run's command is that process's child.
    // (Shorter than the pool's grace for a lent shell: no replacement is made meanwhile.)
    let mut client = d.exec(["sleep", "0.6"]).spawn();
    let took = wait_until(Duration::from_secs(10), || {
        let children = fs::read_to_string(format!("/proc/{spare}/task/{spare}/children")).ok()?;
        children
            .split_whitespace()
            .any(|c| {
                fs::read_to_string(format!("/proc/{c}/comm")).is_ok_and(|n| n.trim() == "sleep")
            })
            .then_some(())
    });
    client.wait_or_kill(Duration::from_secs(30)).assert_code(0);
    assert!(
        took.is_some(),
        "the run did not take the spare {spare}\n{}",
        d.log()
    );
    // A run asking for another writable-layer size gets a cell of that size, made for it;
    // the next run has the profile's size again; all on the same shell.
    let fill = "dd if=/dev/zero of=/tmp/fill bs=1M count=8 2>&1; echo dd=$?";
    assert_eq!(the_shell(&d).id, shell.id);
    let small = d
        .exec_with(["--tmpfs-size", "4M"], ["sh", "-c", fill])
        .run();
    let stdout = small.success();
    assert!(
        stdout.contains("No space left on device") && stdout.contains("dd=1"),
        "8 MB fit in a 4M writable layer\n{small}"
    );
    assert_eq!(the_shell(&d).id, shell.id);
    let out = d.exec(["sh", "-c", fill]).run();
    assert!(
        out.success().contains("dd=0"),
        "the profile's writable layer is back\n{out}"
    );
    assert_eq!(
        the_shell(&d).id,
        shell.id,
        "the same shell served all three"
    );
    let v = d.pool_status_json();
    assert_eq!(v["cells"].as_u64(), Some(3), "{v}");
    assert!(d.discarded().is_empty(), "{:?}", d.discarded());
    // And a spare again, waiting for the next run.
    let again = wait_until(FILL, || {
        (shell_processes(&shell.id).len() == 2).then_some(())
    });
    assert!(again.is_some(), "{:?}", shell_processes(&shell.id));
}

/// A cell's `/dev/shm` is a directory of the cell's own writable layer, bound there (no tmpfs
/// of its own per cell): sticky and world-writable, nosuid, nodev and noexec, and what is
/// written to it counts against the run's `--tmpfs-size` (before, a separate 64 MB tmpfs).
#[test]
fn dev_shm_is_the_cells_own_layer_bounded_by_its_size() {
    let Some(_l) = setup_exclusive() else { return };
    let d = one_shell("default", &[]);
    let script = "stat -c mode=%a /dev/shm; \
        awk '$5 == \"/dev/shm\" { print \"opts=\" $6 }' /proc/self/mountinfo; \
        cp /bin/true /dev/shm/t && chmod 755 /dev/shm/t && { /dev/shm/t && echo exec=ran || echo exec=denied; }; \
        rm -f /dev/shm/t; \
        dd if=/dev/zero of=/dev/shm/fill bs=1M count=8 2>&1; echo dd=$?";
    let out = d
        .exec_with(["--tmpfs-size", "4M"], ["sh", "-c", script])
        .run();
    let stdout = out.success();
    assert!(stdout.contains("mode=1777"), "{out}");
    let opts = stdout
        .lines()
        .find_map(|l| l.strip_prefix("opts="))
        .unwrap_or_else(|| panic!("no /dev/shm mount\n{out}"));
    for flag in ["nosuid", "nodev", "noexec"] {
        assert!(
            opts.split(',').any(|o| o == flag),
            "{flag} missing: {opts}\n{out}"
        );
    }
    assert!(
        stdout.contains("exec=denied"),
        "a file in /dev/shm ran\n{out}"
    );
    assert!(
        stdout.contains("No space left on device") && stdout.contains("dd=1"),
        "8 MB fit in /dev/shm of a run with a 4M writable layer\n{out}"
    );
}
