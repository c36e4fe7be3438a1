//! The warm pool and its daemon, end to end: `agentrun serve` in the foreground on a private
//! state dir, `agentrun exec` as its client (same flags, exit codes and stdio as the cold
//! path), `agentrun ps`, `agentrun pool status`, and what the daemon leaves on the host after
//! SIGTERM or SIGKILL.
//!
//! Contract under test (issue 4):
//! - `agentrun serve [--socket PATH] [--pool-size N] [--max-sandboxes N]`; default socket
//!   `$AGENTRUN_STATE_DIR/agentrun.sock`, root-only (0600); keeps `--pool-size` ready sandboxes
//!   for the default key (image `host`, profile `default`); SIGTERM drains running runs, destroys
//!   the pool, removes everything it made and exits 0; after SIGKILL the next `serve` (or `gc`)
//!   cleans up.
//! - `agentrun exec` uses the daemon when its socket answers, else the cold path
//!   (`AGENTRUN_NO_DAEMON=1` forces the cold path); runs a pooled sandbox cannot serve
//!   (`--workspace`, `--memory`, another image) are created on demand by the daemon and work.
//! - A pooled sandbox is a shell, reused run after run: each run gets a fresh cell in it
//!   (tests/tests/cells.rs checks what that isolates); a shell in doubt is discarded and the
//!   pool refilled in the background.
//! - `ps --json`: array of {"id","state" ("ready"|"running"),"pid","image","profile",...};
//!   `pool status --json`: {"pools":[{"image","profile","ready","target","hits","misses"}],
//!   "unpooled", "created", "create_failures", "running", "max_sandboxes"}.
//! - The `sandbox.exec` span of a pool hit has `sandbox.pool_hit=true`.
//!
//! Every test holds the exclusive e2e lock: they count host-wide things (sandbox processes,
//! `agentrun/` cgroups), and garbage collection (a daemon's start, every cold run) looks at every
//! `agentrun/` cgroup on the host whatever its state dir. Sandboxes of agentrun processes
//! outside the tests (a developer's daemon) are left out of the counts
//! ([`Leftovers::snapshot_own`]). Every daemon is a [`Daemon`]: private state dir, stopped and
//! cleaned on drop.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use agentrun_e2e::otlp::{OtlpReceiver, ReceivedSpan};
use agentrun_e2e::*;

/// How long a pool of a few sandboxes may take to fill (debug build, 2 shared cores).
const FILL: Duration = Duration::from_secs(60);
/// How long the daemon may take to notice and clean up after a run (client gone, init killed).
const CLEANUP: Duration = Duration::from_secs(15);

/// Total runs the daemon says it served: hits + misses over every pool, plus the runs no pool
/// could serve.
fn served(d: &Daemon) -> u64 {
    d.pool_status()
        .iter()
        .map(|p| p.hits + p.misses)
        .sum::<u64>()
        + d.unpooled()
}

fn ready_ids(d: &Daemon) -> BTreeSet<String> {
    d.ps()
        .into_iter()
        .filter(|e| e.state == "ready")
        .map(|e| e.id)
        .collect()
}

/// Waits until `ps` shows a running sandbox; returns it.
fn wait_running(d: &Daemon, client: &mut Running) -> PsEntry {
    let mut last = Vec::new();
    let found = wait_until(Duration::from_secs(20), || {
        last = d.ps();
        last.iter().find(|e| e.state == "running").cloned()
    });
    match found {
        Some(e) => e,
        None => {
            let out = client.wait_or_kill(Duration::from_secs(1));
            panic!(
                "no running sandbox in `ps` within 20 s; last ps: {last:#?}\nclient:\n{out}\n{}",
                d.log()
            );
        }
    }
}

/// Waits until a sandboxed process runs `cmdline` on the host.
fn wait_sandboxed(cmdline: &[&str], d: &Daemon, client: &mut Running) -> ProcInfo {
    let seen = wait_until(Duration::from_secs(20), || {
        sandboxed_processes_running(cmdline).into_iter().next()
    });
    match seen {
        Some(p) => p,
        None => {
            let out = client.wait_or_kill(Duration::from_secs(1));
            panic!(
                "{cmdline:?} never showed up on the host as a sandboxed process\n{out}\n{}",
                d.log()
            );
        }
    }
}

/// Waits (at most `grace`) until nothing is left since the daemon's creation.
fn assert_daemon_left_nothing(d: &Daemon, grace: Duration, context: &str) {
    let mut new = Leftovers::default();
    let clean = wait_until(grace, || {
        new = Leftovers::snapshot_own(d.state()).new_since(d.before());
        new.is_empty().then_some(())
    });
    assert!(
        clean.is_some(),
        "{context}: left behind (after {:.1}s grace):\n{new}",
        grace.as_secs_f64()
    );
}

/// Entries of a directory (empty if it does not exist).
fn entries(dir: &std::path::Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The `sandbox.exec` span the receiver got for one run: waits for it, then a little more to
/// catch duplicates; exactly one expected.
fn the_exec_span(rx: &OtlpReceiver, context: &str) -> ReceivedSpan {
    let execs = |rx: &OtlpReceiver| -> Vec<ReceivedSpan> {
        rx.spans()
            .into_iter()
            .filter(|s| s.name == "sandbox.exec")
            .collect()
    };
    let got = wait_until(Duration::from_secs(15), || {
        let v = execs(rx);
        (!v.is_empty()).then_some(())
    });
    assert!(
        got.is_some(),
        "{context}: no sandbox.exec span within 15 s at {}; received: {:#?}",
        rx.endpoint(),
        rx.spans()
    );
    std::thread::sleep(Duration::from_millis(700));
    let v = execs(rx);
    assert_eq!(
        v.len(),
        1,
        "{context}: expected exactly one sandbox.exec span (whether the client or the daemon \
         exports it), got {}: {v:#?}",
        v.len()
    );
    v[0].clone()
}

#[test]
fn pool_hit_runs_the_command_and_the_pool_refills() {
    let Some(_l) = setup_exclusive() else { return };
    let rx = OtlpReceiver::grpc();
    let mut d = Daemon::unstarted();
    // The span may come from the client or the daemon: both are told where to send it.
    for (k, v) in rx.otel_env() {
        d.set_env(k, v);
    }
    d.launch(["--pool-size", "2"]);
    let before = d.wait_pool_full(FILL);
    assert_eq!(before.target, 2, "--pool-size 2: {before:?}");
    let pooled = ready_ids(&d);
    assert_eq!(pooled.len(), 2, "two ready sandboxes expected: {pooled:?}");

    let out = d.exec(["sh", "-c", "echo hi"]).run();
    assert_eq!(out.success(), "hi\n", "{out}\n{}", d.log());
    assert_eq!(out.stderr(), "", "{out}");

    let after = d.default_pool();
    assert_eq!(
        after.hits,
        before.hits + 1,
        "one pool hit expected: before {before:?}, after {after:?}"
    );
    assert_eq!(
        after.misses, before.misses,
        "no miss expected: before {before:?}, after {after:?}"
    );

    let span = the_exec_span(&rx, "pool hit");
    assert_eq!(
        span.typed_attr("sandbox.pool_hit", "bool"),
        "true",
        "{span:#?}"
    );
    assert_eq!(span.typed_attr("process.exit.code", "int"), "0");
    assert_eq!(span.typed_attr("container.image.name", "string"), "host");
    assert_eq!(span.typed_attr("sandbox.profile", "string"), "default");
    let used = span.typed_attr("sandbox.id", "string").to_string();
    assert!(
        pooled.contains(&used),
        "the run's sandbox {used:?} must be one of the ready ones {pooled:?}"
    );

    // Reused: the shell the run had is back in the pool (its cell is gone), two ready.
    let mut last = Vec::new();
    let back = wait_until(FILL, || {
        last = d.ps();
        let ready: Vec<&PsEntry> = last.iter().filter(|e| e.state == "ready").collect();
        (ready.len() == 2 && ready.iter().any(|e| e.id == used)).then_some(())
    });
    assert!(
        back.is_some(),
        "within {FILL:?} after the run, ps must show 2 ready shells, {used:?} among them: \
         {last:#?}\n{}",
        d.log()
    );
    let st = d.wait_pool_full(FILL);
    assert_eq!((st.ready, st.target), (2, 2), "{st:?}");
}

#[test]
fn runs_the_pool_cannot_serve_are_created_on_demand() {
    let Some(_l) = setup_exclusive() else { return };
    let d = Daemon::start(1);
    d.wait_pool_full(FILL);

    // --workspace: files appear in the host dir, owned by its owner.
    let parent = tempdir();
    let ws = parent.path().join("ws");
    fs::create_dir(&ws).unwrap();
    std::os::unix::fs::chown(&ws, Some(1234), Some(1234)).unwrap();
    fs::set_permissions(&ws, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(ws.join("existing.txt"), "x").unwrap();
    let n0 = served(&d);
    let out = d
        .exec_with(
            ["--workspace".as_ref(), ws.as_os_str()],
            ["sh", "-c", "ls; pwd; echo hi > out.txt; id -u"],
        )
        .run();
    let stdout = out.success();
    assert!(stdout.contains("existing.txt"), "{out}");
    assert!(stdout.lines().any(|l| l == "/workspace"), "{out}");
    assert_eq!(stdout.lines().last(), Some("0"), "{out}");
    let f = ws.join("out.txt");
    assert_eq!(
        fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}\n{out}", f.display())),
        "hi\n"
    );
    assert_eq!(
        fs::metadata(&f).unwrap().uid(),
        1234,
        "out.txt must be owned by the workspace's owner on the host\n{out}"
    );
    assert_eq!(
        served(&d),
        n0 + 1,
        "the --workspace run must go through the daemon (hits + misses + unpooled + 1)\n{}",
        d.log()
    );

    // --memory: the limit holds (OOM is 137 with the message) and a run below it works.
    let n0 = served(&d);
    let out = d
        .exec_with(
            ["--memory", "64M"],
            ["python3", "-c", "x = bytearray(10**9)"],
        )
        .run();
    out.assert_code(137);
    assert!(
        out.stderr().contains("out of memory (limit 64M)"),
        "stderr must say 'out of memory (limit 64M)'\n{out}"
    );
    let out = d
        .exec_with(
            ["--memory", "64M"],
            [
                "python3",
                "-c",
                "x = bytearray(16 * 2**20); x[::4096] = b'1' * len(x[::4096]); print(len(x))",
            ],
        )
        .run();
    assert_eq!(out.success(), "16777216\n", "{out}");
    assert_eq!(
        served(&d),
        n0 + 2,
        "the --memory runs must go through the daemon (hits + misses + unpooled + 2)\n{}",
        d.log()
    );

    // The pool is untouched by all this (or refilled).
    d.wait_pool_full(FILL);
}

#[test]
fn other_image_through_the_daemon() {
    let Some(_l) = setup_exclusive() else { return };
    let root = busybox_root();
    let mut d = Daemon::unstarted().with_env("AGENTRUN_ROOT", &root);
    d.launch(["--pool-size", "1"]);
    d.wait_pool_full(FILL);
    let n0 = served(&d);
    let out = d
        .exec_with(
            ["--image", "busybox"],
            [
                "/bin/sh",
                "-c",
                "cat /etc/os-release; if [ -e /usr/bin/python3 ]; then echo HOST-USR; else echo clean; fi",
            ],
        )
        .run();
    let stdout = out.success();
    assert!(
        stdout.contains("agentrun busybox test image"),
        "busybox image's /etc/os-release expected\n{out}"
    );
    assert!(stdout.ends_with("clean\n"), "{out}");
    assert_eq!(served(&d), n0 + 1, "through the daemon\n{}", d.log());
    // And the default image still works (pool hit).
    let out = d.exec(["sh", "-c", "echo host"]).run();
    assert_eq!(out.success(), "host\n", "{out}");
}

/// The host image's trees an update moved aside (`rootfs.old.*`).
fn old_host_trees(root: &std::path::Path) -> Vec<String> {
    entries(&root.join("images/host"))
        .into_iter()
        .filter(|n| n.starts_with("rootfs.old."))
        .collect()
}

#[test]
fn a_host_update_while_shells_run_leaves_them_working() {
    // A host update (here: the image's stamp made stale, as a changed /etc/ld.so.cache makes
    // it) rebuilds the host image; the pooled shells still have the old tree as their lower
    // layer. Emptying it under them made every later run of those shells "command not found".
    let Some(_l) = setup_exclusive() else { return };
    let root = tempdir();
    fs::set_permissions(root.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let mut d = Daemon::unstarted().with_env("AGENTRUN_ROOT", root.path());
    d.launch(["--pool-size", "2"]);
    d.wait_pool_full(FILL);
    let probe = ["sh", "-c", "ls /bin/sh >/dev/null && cat /etc/hostname"];
    assert_eq!(d.exec(probe).run().success(), "sandbox\n");

    let stamp = root.path().join("images/host/layout");
    fs::write(&stamp, "stale\n").unwrap();
    // A cold run rebuilds it (as the first run after a host update does).
    let out = d.agentrun(["exec", "--no-daemon", "--", "/bin/true"]).run();
    out.assert_code(0);
    assert_ne!(fs::read_to_string(&stamp).unwrap(), "stale\n", "rebuilt");
    assert_eq!(
        old_host_trees(root.path()).len(),
        1,
        "the old tree stays while the pooled shells use it"
    );
    // Every pooled shell still runs commands (two shells: runs enough to reach both).
    for n in 0..4 {
        let out = d.exec(probe).run();
        assert_eq!(
            out.success(),
            "sandbox\n",
            "run {n} after the rebuild\n{out}"
        );
    }

    d.terminate(Duration::from_secs(30)).assert_code(0);
    // Nothing uses the old tree now: gc removes it and keeps the current one.
    d.agentrun(["gc"]).run().assert_code(0);
    assert_eq!(old_host_trees(root.path()), Vec::<String>::new());
    assert!(root.path().join("images/host/rootfs/etc/passwd").is_file());
}

#[test]
fn without_a_daemon_exec_takes_the_cold_path() {
    let Some(_l) = setup_exclusive() else { return };

    // No daemon ever started in this state dir.
    let mut d = Daemon::unstarted();
    let out = d.exec(["sh", "-c", "echo cold; exit 3"]).run();
    out.assert_code(3);
    assert_eq!(out.stdout(), "cold\n", "{out}");
    assert!(!d.socket().exists(), "a client must not create the socket");

    // A daemon is up, but AGENTRUN_NO_DAEMON=1: the pool is not touched.
    d.launch(["--pool-size", "1"]);
    d.wait_pool_full(FILL);
    let ids = ready_ids(&d);
    let n0 = served(&d);
    let out = d
        .exec(["sh", "-c", "echo forced-cold"])
        .env("AGENTRUN_NO_DAEMON", "1")
        .run();
    assert_eq!(out.success(), "forced-cold\n", "{out}");
    assert_eq!(
        served(&d),
        n0,
        "AGENTRUN_NO_DAEMON=1 must not go through the daemon"
    );
    assert_eq!(
        ready_ids(&d),
        ids,
        "AGENTRUN_NO_DAEMON=1 took a pooled sandbox"
    );
    // The same with `--no-daemon`.
    let out = d
        .exec_with(["--no-daemon"], ["sh", "-c", "echo flag-cold"])
        .run();
    assert_eq!(out.success(), "flag-cold\n", "{out}");
    assert_eq!(served(&d), n0, "--no-daemon must not go through the daemon");
    assert_eq!(ready_ids(&d), ids, "--no-daemon took a pooled sandbox");

    // The daemon was SIGKILLed: its socket file may be left, nobody answers it.
    d.kill9();
    let start = Instant::now();
    let out = d
        .exec(["sh", "-c", "echo after-kill"])
        .timeout(Duration::from_secs(30))
        .run();
    assert_eq!(out.success(), "after-kill\n", "{out}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "falling back from a dead socket took {:?}",
        start.elapsed()
    );
}

#[test]
fn consecutive_runs_share_nothing() {
    let Some(_l) = setup_exclusive() else { return };
    let d = Daemon::start(1);
    d.wait_pool_full(FILL);
    let first = ready_ids(&d);

    let run1 = "for f in /tmp/marker /var/tmp/marker /dev/shm/marker /workspace/marker; do \
                  echo secret > $f 2>/dev/null && echo wrote $f; \
                done; \
                setsid nohup sleep 317 >/dev/null 2>&1 </dev/null & \
                i=0; while [ $i -lt 100 ]; do \
                  for c in /proc/[0-9]*/cmdline; do \
                    if tr '\\0' ' ' < $c 2>/dev/null | grep -q '^sleep 317'; then echo started; exit 0; fi; \
                  done; sleep 0.1; i=$((i+1)); \
                done; echo not-started; exit 3";
    let out = d.exec(["sh", "-c", run1]).run();
    let stdout = out.success();
    assert!(stdout.contains("wrote /tmp/marker"), "{out}");
    assert!(stdout.ends_with("started\n"), "{out}");
    assert_no_sandboxed_process(
        &["sleep", "317"],
        Duration::from_secs(10),
        "after a pooled run that left `setsid nohup sleep 317 &` behind",
    );

    d.wait_pool_full(FILL);
    let second = ready_ids(&d);
    assert_eq!(
        first, second,
        "the shell of run 1 serves run 2 too (in a fresh cell)"
    );
    let run2 = "for f in /tmp/marker /var/tmp/marker /dev/shm/marker /workspace/marker; do \
                  [ -e $f ] && echo SEEN $f; \
                done; \
                for c in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $c 2>/dev/null; echo; done";
    let out = d.exec(["sh", "-c", run2]).run();
    let stdout = out.success();
    assert!(
        !stdout.lines().any(|l| l.starts_with("SEEN ")),
        "run 2 sees run 1's files\n{out}"
    );
    assert!(
        !stdout.lines().any(|l| l.starts_with("sleep 317")),
        "run 2 sees run 1's background process\n{out}"
    );
    assert!(
        stdout.lines().any(|l| l.starts_with("sh -c")),
        "the process listing of run 2 should show itself\n{out}"
    );
    assert_no_sandboxed_process(&["sleep", "317"], Duration::ZERO, "after run 2");
}

#[test]
fn thirty_two_concurrent_runs_each_get_their_own_result() {
    let Some(_l) = setup_exclusive() else { return };
    let d = Daemon::start(4);
    d.wait_pool_full(FILL);
    let n0 = served(&d);
    let tag = std::process::id();
    let mut running: Vec<(usize, Running)> = (0..32)
        .map(|i| {
            let script = format!("echo token-{tag}-{i}; echo err-{i} >&2; exit {}", i % 7);
            (i, d.exec(["sh", "-c", &script]).spawn())
        })
        .collect();
    for (i, r) in running.iter_mut() {
        let out = r.wait_or_kill(Duration::from_secs(180));
        assert_eq!(
            out.status.code(),
            Some((*i % 7) as i32),
            "run {i}: exit code\n{out}\n{}",
            d.log()
        );
        assert_eq!(out.stdout(), format!("token-{tag}-{i}\n"), "run {i}\n{out}");
        assert_eq!(out.stderr(), format!("err-{i}\n"), "run {i}\n{out}");
    }
    assert_eq!(
        served(&d),
        n0 + 32,
        "all 32 runs through the daemon\n{}",
        d.log()
    );
    let mut last = Vec::new();
    let idle = wait_until(CLEANUP, || {
        last = d.ps();
        (!last.iter().any(|e| e.state == "running")).then_some(())
    });
    assert!(idle.is_some(), "sandboxes still running: {last:#?}");
    d.wait_pool_full(FILL);
}

#[test]
fn ten_megabytes_of_output_arrive_intact_and_in_order() {
    let Some(_l) = setup_exclusive() else { return };
    let d = Daemon::start(1);
    d.wait_pool_full(FILL);
    const LINES: usize = 104_858; // 100-byte lines: 10 MiB and a bit
    let script = format!(
        "import sys\n\
         pad = 'x' * 91\n\
         for i in range({LINES}):\n\
         \x20   sys.stdout.write('%07d %s\\n' % (i, pad))\n\
         \x20   if i % 1000 == 0:\n\
         \x20       sys.stdout.flush()\n\
         \x20       sys.stderr.write('err %d\\n' % i)\n\
         \x20       sys.stderr.flush()\n\
         sys.stdout.flush()\n"
    );
    let out = d
        .exec(["python3", "-c", &script])
        .timeout(Duration::from_secs(180))
        .run();
    assert_eq!(out.status.code(), Some(0), "{out}");
    let pad = "x".repeat(91);
    let mut expected = String::with_capacity(LINES * 100);
    let mut expected_err = String::new();
    for i in 0..LINES {
        expected.push_str(&format!("{i:07} {pad}\n"));
        if i % 1000 == 0 {
            expected_err.push_str(&format!("err {i}\n"));
        }
    }
    if out.stdout != expected.as_bytes() {
        let got = String::from_utf8_lossy(&out.stdout);
        let first_bad = got
            .lines()
            .zip(expected.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(got.lines().count().min(LINES));
        panic!(
            "stdout differs: {} bytes, {} expected; first differing line {first_bad}: got {:?}, \
             expected {:?}\n{}",
            out.stdout.len(),
            expected.len(),
            got.lines().nth(first_bad),
            expected.lines().nth(first_bad),
            d.log()
        );
    }
    assert_eq!(out.stderr(), expected_err, "stderr separate and complete");
}

#[test]
fn exit_codes_and_stdin_through_the_daemon() {
    let Some(_l) = setup_exclusive() else { return };
    let d = Daemon::start(2);
    d.wait_pool_full(FILL);
    let n0 = served(&d);
    let mut runs = 0;

    for code in [0, 1, 42, 255] {
        d.exec(["sh", "-c", &format!("exit {code}")])
            .run()
            .assert_code(code);
        runs += 1;
    }
    d.exec(["no-such-command-agentrun-e2e"])
        .run()
        .assert_code(127);
    d.exec(["/etc/passwd"]).run().assert_code(126);
    d.exec(["sh", "-c", "kill -15 $$"]).run().assert_code(143);
    d.exec(["sh", "-c", "kill -9 $$"]).run().assert_code(137);
    runs += 4;

    // Not executable, in a workspace (an on-demand sandbox).
    let ws = tempdir();
    fs::set_permissions(ws.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let script = ws.path().join("script.sh");
    fs::write(&script, "#!/bin/sh\necho should-not-run\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o644)).unwrap();
    let out = d
        .exec_with(
            ["--workspace".as_ref(), ws.path().as_os_str()],
            ["./script.sh"],
        )
        .run();
    out.assert_code(126);
    assert!(!out.stdout().contains("should-not-run"), "{out}");
    runs += 1;

    // Timeout: 124, quickly, and nothing survives.
    let out = d
        .exec_with(["--timeout", "1s"], ["sleep", "30.3"])
        .timeout(Duration::from_secs(30))
        .run();
    out.assert_code(124);
    assert!(
        out.elapsed < Duration::from_secs(5),
        "--timeout 1s took {:?}\n{out}",
        out.elapsed
    );
    assert_no_sandboxed_process(
        &["sleep", "30.3"],
        Duration::from_secs(5),
        "after a timed-out run",
    );
    runs += 1;

    // stdin passes through; none given means EOF.
    let out = d.exec(["wc", "-c"]).stdin("data\n").run();
    assert_eq!(out.success().trim(), "5", "{out}");
    let big = vec![b'x'; 1 << 20];
    let out = d.exec(["wc", "-c"]).stdin(big).run();
    assert_eq!(out.success().trim(), (1 << 20).to_string(), "{out}");
    let out = d.exec(["cat"]).timeout(Duration::from_secs(30)).run();
    assert_eq!(out.success(), "", "{out}");
    runs += 3;

    // -e, --cwd, and the host's environment not leaking.
    let out = d
        .exec_with(
            ["-e", "FOO=bar", "--cwd", "/tmp"],
            [
                "sh",
                "-c",
                "echo $FOO; pwd; echo key=${OPENAI_API_KEY:-unset}",
            ],
        )
        .env("OPENAI_API_KEY", "sk-host-secret")
        .run();
    assert_eq!(out.success(), "bar\n/tmp\nkey=unset\n", "{out}");
    runs += 1;

    assert_eq!(
        served(&d),
        n0 + runs,
        "every run above went through the daemon\n{}",
        d.log()
    );
}

#[test]
fn client_killed_mid_run_ends_its_sandbox() {
    let Some(_l) = setup_exclusive() else { return };
    let d = Daemon::start(1);
    d.wait_pool_full(FILL);
    let mut client = d
        .exec(["sleep", "30.5"])
        .timeout(Duration::from_secs(60))
        .spawn();
    wait_sandboxed(&["sleep", "30.5"], &d, &mut client);
    let sandbox = wait_running(&d, &mut client);
    std::thread::sleep(Duration::from_secs(1));
    client.kill9();
    drop(client);

    assert_no_sandboxed_process(&["sleep", "30.5"], CLEANUP, "after SIGKILL of the client");
    let mut last = Vec::new();
    let gone = wait_until(CLEANUP, || {
        last = d.ps();
        (!last.iter().any(|e| e.id == sandbox.id)).then_some(())
    });
    assert!(
        gone.is_some(),
        "sandbox {} of the killed client still in ps after {CLEANUP:?}: {last:#?}\n{}",
        sandbox.id,
        d.log()
    );
    assert!(
        sandbox_cgroups(&sandbox.id).is_empty(),
        "cgroups of {} left: {:?}",
        sandbox.id,
        sandbox_cgroups(&sandbox.id)
    );

    let out = d.exec(["sh", "-c", "echo still-serving"]).run();
    assert_eq!(out.success(), "still-serving\n", "{out}\n{}", d.log());
    d.wait_pool_full(FILL);
}

#[test]
fn sandbox_init_killed_from_the_host_fails_the_run_not_the_daemon() {
    let Some(_l) = setup_exclusive() else { return };
    let mut d = Daemon::start(1);
    d.wait_pool_full(FILL);
    let mut client = d
        .exec(["sleep", "30.6"])
        .timeout(Duration::from_secs(60))
        .spawn();
    wait_sandboxed(&["sleep", "30.6"], &d, &mut client);
    let sandbox = wait_running(&d, &mut client);
    let init = proc_info(sandbox.pid)
        .unwrap_or_else(|| panic!("ps says pid {} but it does not exist", sandbox.pid));
    assert!(
        is_sandbox_process(&init),
        "ps pid {} is not a sandbox process: {init}",
        sandbox.pid
    );
    // SAFETY: plain kill of a sandbox init this test started.
    unsafe { libc::kill(sandbox.pid, libc::SIGKILL) };

    let out = client.wait_for(CLEANUP).unwrap_or_else(|| {
        panic!(
            "the client did not end within {CLEANUP:?} of its sandbox's init being killed\n{}",
            d.log()
        )
    });
    let code = out.code();
    eprintln!(
        "init killed from the host: client exit {code}, stderr {:?}",
        out.stderr()
    );
    assert!(
        code == 137 || code == 125,
        "expected 137 or 125 when the sandbox's init is killed\n{out}"
    );
    assert!(
        !out.stderr().trim().is_empty(),
        "stderr must say what happened\n{out}"
    );
    assert_no_sandboxed_process(&["sleep", "30.6"], CLEANUP, "after its init was killed");

    assert!(d.is_running(), "the daemon died\n{}", d.log());
    let out = d.exec(["sh", "-c", "echo still-serving"]).run();
    assert_eq!(out.success(), "still-serving\n", "{out}\n{}", d.log());
    d.wait_pool_full(FILL);
    let mut last = Vec::new();
    let gone = wait_until(CLEANUP, || {
        last = d.ps();
        (!last.iter().any(|e| e.id == sandbox.id)).then_some(())
    });
    assert!(gone.is_some(), "crashed sandbox still listed: {last:#?}");
}

#[test]
fn sigterm_drains_runs_and_removes_everything() {
    let Some(_l) = setup_exclusive() else { return };
    let mut d = Daemon::start(2);
    d.wait_pool_full(FILL);
    let socket = d.socket();
    let mut client = d
        .exec(["sh", "-c", "sleep 2; echo drained"])
        .timeout(Duration::from_secs(60))
        .spawn();
    wait_running(&d, &mut client);

    let out = d.terminate(Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "exit code after SIGTERM\n{out}");
    assert!(
        out.elapsed < Duration::from_secs(60),
        "daemon took {:?} in all",
        out.elapsed
    );
    let run = client.wait_or_kill(Duration::from_secs(30));
    assert_eq!(
        run.success(),
        "drained\n",
        "the run in progress at SIGTERM must finish\n{run}"
    );

    assert_daemon_left_nothing(&d, Duration::from_secs(2), "after SIGTERM");
    assert!(
        !out.pipes_left_open,
        "some process still holds the daemon's stdout/stderr after it exited\n{out}"
    );
    assert!(!socket.exists(), "socket {} left", socket.display());
    assert_eq!(entries(&d.state().join("containers")), Vec::<String>::new());
    assert_eq!(mounts_under(d.state()), Vec::<std::path::PathBuf>::new());
}

#[test]
fn sigkill_then_restart_cleans_up_and_serves() {
    let Some(_l) = setup_exclusive() else { return };
    let mut d = Daemon::start(2);
    d.wait_pool_full(FILL);
    let mut client = d
        .exec(["sleep", "30.9"])
        .timeout(Duration::from_secs(60))
        .spawn();
    wait_sandboxed(&["sleep", "30.9"], &d, &mut client);
    wait_running(&d, &mut client);
    // The pool refills while the run goes on.
    d.wait_pool_full(FILL);
    let old = d.ps();
    assert_eq!(old.len(), 3, "2 ready + 1 running: {old:#?}");

    d.kill9();
    // The client of the killed daemon must not hang.
    let out = client
        .wait_for(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the client of a SIGKILLed daemon was still running after 20 s"));
    assert_ne!(out.status.code(), Some(0), "{out}");

    d.launch(["--pool-size", "2"]);
    d.wait_pool_full(FILL);
    let now = d.ps();
    // The old daemon's factories see their channel close and destroy what they made, while
    // the new daemon starts (its gc leaves sandboxes whose factory is still alive to it): on
    // a loaded machine that can take a few seconds, bounded here.
    let gone = |id: &str| {
        !d.state().join("sandboxes").join(id).exists()
            && sandbox_cgroups(id).is_empty()
            && mounts_under(&d.state().join("sandboxes").join(id)).is_empty()
    };
    wait_until(Duration::from_secs(30), || {
        old.iter().all(|o| gone(&o.id)).then_some(())
    });
    for o in &old {
        assert!(
            !now.iter().any(|e| e.id == o.id),
            "old sandbox {} listed by the new daemon: {now:#?}",
            o.id
        );
        assert!(
            !d.state().join("sandboxes").join(&o.id).exists(),
            "state dir of old sandbox {} left after restart",
            o.id
        );
        assert!(
            sandbox_cgroups(&o.id).is_empty(),
            "cgroups of old sandbox {} left after restart: {:?}",
            o.id,
            sandbox_cgroups(&o.id)
        );
        assert!(
            mounts_under(&d.state().join("sandboxes").join(&o.id)).is_empty(),
            "mounts of old sandbox {} left after restart",
            o.id
        );
        if let Some(p) = proc_info(o.pid) {
            assert!(
                !is_sandbox_process(&p),
                "init of old sandbox {} still alive: {p}",
                o.id
            );
        }
    }
    assert_no_sandboxed_process(&["sleep", "30.9"], Duration::ZERO, "after restart");

    let out = d.exec(["sh", "-c", "echo served"]).run();
    assert_eq!(out.success(), "served\n", "{out}\n{}", d.log());
    let out = d.terminate(Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{out}");
    assert_daemon_left_nothing(
        &d,
        Duration::from_secs(2),
        "after SIGKILL, restart, SIGTERM",
    );
}

#[test]
fn sigkill_then_gc_cleans_up() {
    let Some(_l) = setup_exclusive() else { return };
    let mut d = Daemon::start(2);
    d.wait_pool_full(FILL);
    d.kill9();
    let out = d.agentrun(["gc"]).run();
    out.assert_code(0);
    assert_daemon_left_nothing(
        &d,
        Duration::from_secs(5),
        &format!("after SIGKILL of the daemon and `agentrun gc`\n{out}"),
    );
}

#[test]
fn ps_and_pool_status_reflect_reality() {
    let Some(_l) = setup_exclusive() else { return };
    let d = Daemon::start(3);
    let st = d.wait_pool_full(FILL);
    assert_eq!((st.ready, st.target), (3, 3), "{st:?}");

    let sock = fs::symlink_metadata(d.socket()).expect("socket");
    assert!(sock.file_type().is_socket(), "{:?}", sock.file_type());
    assert_eq!(sock.mode() & 0o777, 0o600, "socket mode {:o}", sock.mode());
    assert_eq!(sock.uid(), 0, "socket owner");

    let ps = d.ps();
    assert_eq!(ps.len(), 3, "idle daemon with --pool-size 3: {ps:#?}");
    let ids: BTreeSet<&str> = ps.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), 3, "ids must be unique: {ps:#?}");
    for e in &ps {
        assert_eq!(e.state, "ready", "{e:?}");
        assert_eq!(e.image, "host", "{e:?}");
        assert_eq!(e.profile, "default", "{e:?}");
        let p = proc_info(e.pid).unwrap_or_else(|| panic!("pid of {e:?} does not exist"));
        assert!(is_sandbox_process(&p), "pid of {e:?} is not sandboxed: {p}");
        assert!(
            p.cgroup.contains(&e.id),
            "pid of {e:?} is not in the sandbox's cgroup: {p}"
        );
    }

    // The human forms answer and name what they list.
    let out = d.agentrun(["ps"]).timeout(Duration::from_secs(30)).run();
    let text = out.success();
    for e in &ps {
        assert!(
            text.contains(&e.id),
            "`agentrun ps` does not list {}\n{out}",
            e.id
        );
    }
    let out = d
        .agentrun(["pool", "status"])
        .timeout(Duration::from_secs(30))
        .run();
    assert!(out.success().contains("host"), "{out}");

    // A run in progress is listed as running.
    let mut client = d
        .exec(["sleep", "30.2"])
        .timeout(Duration::from_secs(60))
        .spawn();
    wait_sandboxed(&["sleep", "30.2"], &d, &mut client);
    let run = wait_running(&d, &mut client);
    assert_eq!(run.image, "host", "{run:?}");
    assert_eq!(run.profile, "default", "{run:?}");
    let ps = d.ps();
    assert_eq!(
        ps.iter().filter(|e| e.state == "running").count(),
        1,
        "{ps:#?}"
    );
    client.kill9();
    drop(client);
    let mut last = Vec::new();
    let back = wait_until(FILL, || {
        last = d.ps();
        (last.len() == 3 && last.iter().all(|e| e.state == "ready")).then_some(())
    });
    assert!(
        back.is_some(),
        "back to 3 ready sandboxes and nothing else after the run: {last:#?}"
    );
}

#[test]
fn second_daemon_on_the_same_socket_refuses_and_leaves_the_first_alone() {
    let Some(_l) = setup_exclusive() else { return };
    let mut d = Daemon::start(1);
    d.wait_pool_full(FILL);
    let ids = ready_ids(&d);
    let out = d
        .agentrun(["serve", "--pool-size", "1"])
        .timeout(Duration::from_secs(30))
        .run();
    assert_ne!(
        out.status.code(),
        Some(0),
        "a second daemon on a live socket must refuse\n{out}"
    );
    assert!(!out.stderr().trim().is_empty(), "and say why\n{out}");
    assert!(d.is_running(), "the first daemon died\n{}", d.log());
    assert_eq!(ready_ids(&d), ids, "the first daemon's pool was touched");
    let out = d.exec(["sh", "-c", "echo first"]).run();
    assert_eq!(out.success(), "first\n", "{out}\n{}", d.log());
}

/// Starts `agentrun exec -- sleep TAG` (through the daemon unless `cold`), sends `sig` to the
/// client once the sleep runs, and returns what the client did.
fn signalled_run(d: &Daemon, tag: &str, sig: libc::c_int, cold: bool) -> RunOutput {
    let mut a = d.exec(["sleep", tag]).timeout(Duration::from_secs(60));
    if cold {
        a = a.env("AGENTRUN_NO_DAEMON", "1");
    }
    let mut client = a.spawn();
    wait_sandboxed(&["sleep", tag], d, &mut client);
    client.signal(sig);
    let out = client.wait_for(Duration::from_secs(10)).unwrap_or_else(|| {
        panic!(
            "the client did not exit within 10 s of signal {sig} (cold: {cold})\n{}",
            d.log()
        )
    });
    assert_no_sandboxed_process(
        &["sleep", tag],
        CLEANUP,
        &format!("after signal {sig} to the client (cold: {cold})"),
    );
    out
}

#[test]
fn signals_to_the_client_end_the_run_as_on_the_cold_path() {
    let Some(_l) = setup_exclusive() else { return };
    let mut d = Daemon::start(1);
    d.wait_pool_full(FILL);
    for (sig, tag) in [(libc::SIGTERM, "30.41"), (libc::SIGINT, "30.42")] {
        let n0 = served(&d);
        let warm = signalled_run(&d, tag, sig, false);
        assert_eq!(served(&d), n0 + 1, "the run went through the daemon");
        assert!(
            !matches!(warm.status.code(), Some(0) | None),
            "signal {sig}: non-zero exit code expected\n{warm}"
        );
        let mut last = Vec::new();
        let idle = wait_until(CLEANUP, || {
            last = d.ps();
            (!last.iter().any(|e| e.state == "running")).then_some(())
        });
        assert!(
            idle.is_some(),
            "signal {sig}: a sandbox still runs: {last:#?}"
        );
        let cold = signalled_run(&d, &format!("{tag}1"), sig, true);
        assert_eq!(
            warm.status.code(),
            cold.status.code(),
            "signal {sig} to the client: the daemon path and the cold path must give the same \
             exit code\n--- through the daemon ---\n{warm}\n--- cold ---\n{cold}"
        );
    }
    assert!(d.is_running(), "the daemon died\n{}", d.log());
}

#[test]
fn background_process_holding_stdout_does_not_keep_the_run_alive() {
    let Some(_l) = setup_exclusive() else { return };
    let d = Daemon::start(1);
    d.wait_pool_full(FILL);
    // The command's stdout is the client's own pipe: a leftover holder would hang `$(...)`.
    let out = d
        .exec(["sh", "-c", "sleep 61 & echo started"])
        .timeout(Duration::from_secs(60))
        .run();
    assert_eq!(out.success(), "started\n", "{out}");
    assert!(
        out.elapsed < Duration::from_secs(10),
        "the run must end when the command exits\n{out}"
    );
    assert!(
        !out.pipes_left_open,
        "a sandboxed process still held the client's stdout/stderr 5 s after the run\n{out}"
    );
    assert_no_sandboxed_process(&["sleep", "61"], CLEANUP, "after the run");
}

#[test]
fn timeout_kills_a_command_that_ignores_sigterm() {
    let Some(_l) = setup_exclusive() else { return };
    let d = Daemon::start(1);
    d.wait_pool_full(FILL);
    let out = d
        .exec_with(
            ["--timeout", "1s"],
            ["sh", "-c", "trap '' TERM INT; sleep 30.7; echo survived"],
        )
        .timeout(Duration::from_secs(30))
        .run();
    out.assert_code(124);
    assert!(!out.stdout().contains("survived"), "{out}");
    assert!(
        out.elapsed < Duration::from_secs(5),
        "--timeout 1s took {:?}\n{out}",
        out.elapsed
    );
    assert_no_sandboxed_process(&["sleep", "30.7"], CLEANUP, "after the timeout");
}

#[test]
fn max_sandboxes_queues_runs_instead_of_failing_them() {
    let Some(_l) = setup_exclusive() else { return };
    let mut d = Daemon::unstarted();
    d.launch(["--pool-size", "1", "--max-sandboxes", "2"]);
    d.wait_pool_full(FILL);
    let before = d.before().clone();
    let mut running: Vec<(usize, Running)> = (0..6)
        .map(|i| {
            let script = format!("sleep 1; echo run-{i}");
            (
                i,
                d.exec(["sh", "-c", &script])
                    .timeout(Duration::from_secs(120))
                    .spawn(),
            )
        })
        .collect();
    // While they run, never more than 2 sandboxes (by cgroup) on the host.
    let mut most = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(120) && running.iter_mut().any(|(_, r)| !r.exited())
    {
        let ids: BTreeSet<String> = Leftovers::snapshot_own(d.state())
            .new_since(&before)
            .cgroups
            .iter()
            .filter_map(|c| c.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        most = most.max(ids.len());
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, r) in running.iter_mut() {
        let out = r.wait_or_kill(Duration::from_secs(10));
        assert_eq!(
            out.success(),
            format!("run-{i}\n"),
            "run {i} with --max-sandboxes 2\n{out}\n{}",
            d.log()
        );
    }
    assert!(
        most >= 1,
        "no sandbox cgroup ever seen: the sampling is broken"
    );
    assert!(
        most <= 2,
        "--max-sandboxes 2, but {most} sandbox cgroups existed at once"
    );
}

#[test]
fn sigterm_with_a_run_that_outlasts_the_drain_still_exits_cleanly() {
    let Some(_l) = setup_exclusive() else { return };
    let mut d = Daemon::start(1);
    d.wait_pool_full(FILL);
    let mut client = d
        .exec(["sleep", "300.1"])
        .timeout(Duration::from_secs(120))
        .spawn();
    wait_sandboxed(&["sleep", "300.1"], &d, &mut client);
    let out = d.terminate(Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "exit code after SIGTERM\n{out}");
    let run = client
        .wait_for(Duration::from_secs(15))
        .unwrap_or_else(|| panic!("the client outlived the daemon's shutdown by 15 s"));
    assert_ne!(run.status.code(), Some(0), "{run}");
    assert!(
        !run.stderr().trim().is_empty(),
        "the client must say why it failed\n{run}"
    );
    assert_no_sandboxed_process(
        &["sleep", "300.1"],
        Duration::from_secs(2),
        "after shutdown",
    );
    assert_daemon_left_nothing(&d, Duration::from_secs(2), "after SIGTERM with a long run");
    assert!(!d.socket().exists(), "socket left");
}

#[test]
fn a_pool_kept_for_another_image_serves_its_runs() {
    let Some(_l) = setup_exclusive() else { return };
    let root = busybox_root();
    let mut d = Daemon::unstarted().with_env("AGENTRUN_ROOT", &root);
    d.launch(["--pool", "host:default=1", "--pool", "busybox=2"]);
    // Both pools fill: 1 host + 2 busybox sandboxes ready.
    let deadline = std::time::Instant::now() + FILL;
    loop {
        let pools = d.pool_status();
        let ready = |img: &str| pools.iter().find(|p| p.image == img).map(|p| p.ready);
        if ready("host") == Some(1) && ready("busybox") == Some(2) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pools did not fill: {pools:?}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let busybox_ready: BTreeSet<String> = d
        .ps()
        .into_iter()
        .filter(|e| e.state == "ready" && e.image == "busybox")
        .map(|e| e.id)
        .collect();
    assert_eq!(busybox_ready.len(), 2, "{}", d.log());

    let out = d
        .exec_with(
            ["--image", "busybox"],
            ["/bin/sh", "-c", "cat /etc/os-release"],
        )
        .run();
    assert!(
        out.success().contains("agentrun busybox test image"),
        "busybox image expected\n{out}"
    );
    let busybox = d
        .pool_status()
        .into_iter()
        .find(|p| p.image == "busybox")
        .expect("busybox pool");
    assert_eq!((busybox.hits, busybox.misses), (1, 0), "{busybox:?}");
    assert_eq!(d.unpooled(), 0, "a kept pool served the run");

    // An image or profile that does not exist is refused when the daemon starts.
    let bad = std::process::Command::new(agentrun_bin())
        .args(["serve", "--pool", "no-such-image=1"])
        .env("AGENTRUN_ROOT", &root)
        .env("AGENTRUN_STATE_DIR", d.state())
        .output()
        .expect("run agentrun serve");
    assert_eq!(bad.status.code(), Some(125), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("no-such-image"),
        "{bad:?}"
    );
}
