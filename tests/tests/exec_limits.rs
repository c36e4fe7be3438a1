//! Resource limits and timeouts through the real binary. Tests that check what is left on the
//! host take the exclusive e2e lock.

use std::time::{Duration, Instant};

use agentrun_e2e::*;

#[test]
fn timeout_kills_and_cleans_up() {
    let Some(_l) = setup_exclusive() else { return };
    let before = Leftovers::snapshot();
    let _guard = CleanupOnPanic {
        before: before.clone(),
    };
    let out = exec_with(["--timeout", "2s"], ["sleep", "60"]).run();
    out.assert_code(124);
    assert!(
        out.elapsed < Duration::from_secs(6),
        "timeout 2s took {:.2}s\n{out}",
        out.elapsed.as_secs_f64()
    );
    assert!(
        out.elapsed >= Duration::from_millis(1900),
        "timed out too early\n{out}"
    );
    assert!(
        !out.pipes_left_open,
        "a sandbox process still holds stdout\n{out}"
    );
    assert_no_new_leftovers(&before, Duration::from_secs(1), "after --timeout 2s");
}

#[test]
fn timeout_kills_process_tree_and_term_ignorers() {
    let Some(_l) = setup_exclusive() else { return };
    let before = Leftovers::snapshot();
    let _guard = CleanupOnPanic {
        before: before.clone(),
    };
    let out = exec_with(
        ["--timeout", "1s"],
        [
            "sh",
            "-c",
            "sleep 60 & python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'",
        ],
    )
    .run();
    out.assert_code(124);
    assert!(
        out.elapsed < Duration::from_secs(15),
        "timeout 1s with a SIGTERM-ignoring command took {:.2}s\n{out}",
        out.elapsed.as_secs_f64()
    );
    assert_no_new_leftovers(&before, Duration::from_secs(1), "after --timeout 1s");
}

#[test]
fn timeout_units() {
    let Some(_l) = setup() else { return };
    let out = exec_with(["--timeout", "500ms"], ["sleep", "10"]).run();
    out.assert_code(124);
    assert!(out.elapsed < Duration::from_secs(4), "{out}");
    // A command that finishes in time keeps its own exit code.
    let out = exec_with(["--timeout", "1m"], ["sh", "-c", "exit 3"]).run();
    out.assert_code(3);
}

#[test]
fn memory_limit_oom_is_137_with_message() {
    let Some(_l) = setup() else { return };
    let out = exec_with(
        ["--memory", "64M"],
        ["python3", "-c", "x = bytearray(10**9)"],
    )
    .run();
    out.assert_code(137);
    assert!(
        out.stderr().contains("out of memory (limit 64M)"),
        "stderr must say 'out of memory (limit 64M)'\n{out}"
    );
}

#[test]
fn memory_below_limit_works() {
    let Some(_l) = setup() else { return };
    let out = exec_with(
        ["--memory", "64M"],
        [
            "python3",
            "-c",
            "x = bytearray(16 * 2**20); x[::4096] = b'1' * len(x[::4096]); print(len(x))",
        ],
    )
    .run();
    assert_eq!(out.success(), "16777216\n", "{out}");
}

/// Max of pids.current over agentrun's cgroups, and the pids.max values seen.
fn pids_usage() -> (u64, Vec<String>) {
    let mut cur = 0;
    let mut maxes = Vec::new();
    for cg in Leftovers::snapshot().cgroups {
        if let Ok(s) = std::fs::read_to_string(cg.join("pids.current")) {
            cur = cur.max(s.trim().parse().unwrap_or(0));
        }
        if let Ok(s) = std::fs::read_to_string(cg.join("pids.max")) {
            maxes.push(s.trim().to_string());
        }
    }
    (cur, maxes)
}

fn host_still_works() {
    let t = Instant::now();
    let out = host("sh", ["-c", "echo alive"]);
    assert_eq!(out.success(), "alive\n");
    assert!(t.elapsed() < Duration::from_secs(5), "host is sluggish");
}

#[test]
fn pids_limit_stops_fork_loop() {
    let Some(_l) = setup_exclusive() else { return };
    let before = Leftovers::snapshot();
    let _guard = CleanupOnPanic {
        before: before.clone(),
    };
    // Forks sleepers until fork fails; reports how many it made and the errno.
    let py = r#"
import os, time
n = 0
try:
    while n < 10000:
        pid = os.fork()
        if pid == 0:
            fd = os.open('/dev/null', os.O_RDWR)
            for i in (0, 1, 2):
                os.dup2(fd, i)
            time.sleep(60)
            os._exit(0)
        n += 1
    print(n, 0)
except OSError as e:
    print(n, e.errno)
"#;
    let out = exec_with(["--pids", "64", "--timeout", "20s"], ["python3", "-c", py])
        .timeout(Duration::from_secs(60))
        .run();
    assert!(
        out.elapsed < Duration::from_secs(25),
        "run did not end\n{out}"
    );
    let stdout = out.stdout();
    let mut it = stdout.split_whitespace();
    let n: u64 = it
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no count printed\n{out}"));
    let errno: i32 = it.next().and_then(|s| s.parse().ok()).unwrap_or(-1);
    assert!(
        (1..64).contains(&n),
        "forks must stop below --pids 64 (made {n})\n{out}"
    );
    assert_eq!(errno, libc::EAGAIN, "fork must fail with EAGAIN\n{out}");
    assert!(
        matches!(out.code(), 0 | 124),
        "the loop's own exit (0), or the timeout\n{out}"
    );
    host_still_works();
    assert_no_new_leftovers(&before, Duration::from_secs(2), "after the fork loop");
}

#[test]
fn fork_bomb_is_contained() {
    let Some(_l) = setup_exclusive() else { return };
    let before = Leftovers::snapshot();
    let _guard = CleanupOnPanic {
        before: before.clone(),
    };
    let mut bg = exec_with(
        ["--pids", "64", "--timeout", "8s"],
        ["sh", "-c", "f() { f | f & }; f; sleep 30"],
    )
    .spawn();
    let mut max_seen = 0;
    let mut limits = Vec::new();
    let start = Instant::now();
    let out = loop {
        if let Some(out) = bg.wait_for(Duration::from_millis(100)) {
            break out;
        }
        let (cur, maxes) = pids_usage();
        max_seen = max_seen.max(cur);
        if !maxes.is_empty() {
            limits = maxes;
        }
        if start.elapsed() > Duration::from_secs(40) {
            break bg.wait_or_kill(Duration::from_secs(0));
        }
    };
    assert!(
        out.elapsed < Duration::from_secs(20),
        "the fork bomb run did not end after its 8s timeout\n{out}"
    );
    assert!(max_seen <= 64, "pids.current reached {max_seen} > 64");
    assert!(
        limits.iter().any(|l| l == "64"),
        "pids.max 64 expected in the sandbox cgroup, saw {limits:?}"
    );
    host_still_works();
    assert_no_new_leftovers(&before, Duration::from_secs(2), "after the fork bomb");
}

#[test]
fn cpus_limit_throttles() {
    let Some(_l) = setup() else { return };
    // Two processes busy-loop for 2 s of wall time; prints the CPU seconds they got.
    let py = r#"
import os, time
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        t = time.time()
        while time.time() - t < 2:
            pass
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
c = os.times()
print(c.children_user + c.children_system)
"#;
    let out = exec_with(["--cpus", "0.5"], ["python3", "-c", py]).run();
    let cpu: f64 = out
        .success()
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{e}\n{out}"));
    // 0.5 CPU for ~2 s is ~1 CPU second; unthrottled it would be up to 4 on 2 cores.
    assert!(
        cpu < 1.5,
        "--cpus 0.5 must throttle: used {cpu:.2} CPU s in 2 s\n{out}"
    );
}
