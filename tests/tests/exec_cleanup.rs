//! Nothing of a run may stay on the host: processes, mounts, cgroups, state dirs — after
//! normal runs, and after the CLI itself was killed (then `agentrun gc` cleans up).
//!
//! Every test here holds the exclusive e2e lock, so no other e2e sandbox exists meanwhile
//! (in this binary or any other) and host-wide counts are meaningful.

use std::fs;
use std::time::{Duration, Instant};

use agentrun_e2e::*;

fn mount_count() -> usize {
    fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .count()
}

#[test]
fn many_sequential_runs_leave_nothing() {
    let Some(_l) = setup_exclusive() else { return };
    let before = Leftovers::snapshot();
    let _guard = CleanupOnPanic {
        before: before.clone(),
    };
    let mounts_before = mount_count();
    let runs = 200;
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 0..runs {
        let out = exec(["true"]).timeout(Duration::from_secs(30)).run();
        assert_eq!(out.status.code(), Some(0), "run {i} of {runs}\n{out}");
        slowest = slowest.max(out.elapsed);
    }
    let total = start.elapsed();
    eprintln!(
        "{runs} runs of `agentrun exec -- true`: {:.1}s, mean {:.1} ms, slowest {:.1} ms",
        total.as_secs_f64(),
        total.as_secs_f64() * 1000.0 / runs as f64,
        slowest.as_secs_f64() * 1000.0
    );
    assert_no_new_leftovers(&before, Duration::from_secs(2), "after 200 runs");
    assert_eq!(
        mount_count(),
        mounts_before,
        "host mount table grew after {runs} runs"
    );
}

#[test]
fn main_exit_ends_the_run_and_kills_background_processes() {
    let Some(_l) = setup_exclusive() else { return };
    let before = Leftovers::snapshot();
    let _guard = CleanupOnPanic {
        before: before.clone(),
    };
    let out = exec([
        "sh",
        "-c",
        "sleep 60 >/dev/null 2>&1 </dev/null & echo started",
    ])
    .run();
    assert_eq!(out.success(), "started\n");
    assert!(
        out.elapsed < Duration::from_secs(10),
        "the run must end when the command exits\n{out}"
    );
    assert_no_new_leftovers(
        &before,
        Duration::from_secs(2),
        "after a run with a background child",
    );
}

#[test]
fn parallel_runs_leave_nothing() {
    let Some(_l) = setup_exclusive() else { return };
    let before = Leftovers::snapshot();
    let _guard = CleanupOnPanic {
        before: before.clone(),
    };
    for round in 0..5 {
        let mut running: Vec<(usize, Running)> = (0..8)
            .map(|i| {
                (
                    i,
                    exec(["sh", "-c", &format!("echo run-{i}; sleep 0.2")]).spawn(),
                )
            })
            .collect();
        for (i, r) in running.iter_mut() {
            let out = r.wait_or_kill(Duration::from_secs(60));
            assert_eq!(
                out.success(),
                format!("run-{i}\n"),
                "round {round}, run {i}\n{out}"
            );
        }
    }
    assert_no_new_leftovers(
        &before,
        Duration::from_secs(2),
        "after 5 rounds of 8 parallel runs",
    );
}

/// Starts `agentrun exec -- sleep 30` and waits until its sleep shows up on the host.
fn start_sleeper(tag: &str) -> Running {
    let mut bg = exec(["sleep", tag])
        .timeout(Duration::from_secs(60))
        .spawn();
    let seen = wait_until(Duration::from_secs(20), || {
        all_processes()
            .into_iter()
            .find(|p| p.cmdline == ["sleep", tag] && p.uid >= SANDBOX_UID_BASE)
    });
    if seen.is_none() {
        let out = bg.wait_or_kill(Duration::from_secs(1));
        panic!("the sandboxed sleep never showed up on the host\n{out}");
    }
    bg
}

#[test]
fn killed_cli_then_gc_leaves_nothing() {
    let Some(_l) = setup_exclusive() else { return };
    let before = Leftovers::snapshot();
    let _guard = CleanupOnPanic {
        before: before.clone(),
    };
    let mut bg = start_sleeper("30.1");
    bg.kill9();
    drop(bg);
    let out = agentrun(["gc"]).run();
    out.assert_code(0);
    assert_no_new_leftovers(
        &before,
        Duration::from_secs(5),
        &format!("after SIGKILL of the CLI and `agentrun gc`\n{out}"),
    );
}

#[test]
fn killed_cli_then_next_run_works_and_gc_cleans() {
    let Some(_l) = setup_exclusive() else { return };
    let before = Leftovers::snapshot();
    let _guard = CleanupOnPanic {
        before: before.clone(),
    };
    let mut bg = start_sleeper("30.2");
    bg.kill9();
    drop(bg);
    let out = exec(["echo", "next"]).run();
    assert_eq!(out.success(), "next\n", "the run after a killed one\n{out}");
    let out = agentrun(["gc"]).run();
    out.assert_code(0);
    assert_no_new_leftovers(
        &before,
        Duration::from_secs(5),
        &format!("after SIGKILL of the CLI, another run and `agentrun gc`\n{out}"),
    );
}

#[test]
fn interrupted_cli_cleans_up_itself() {
    let Some(_l) = setup_exclusive() else { return };
    let before = Leftovers::snapshot();
    let _guard = CleanupOnPanic {
        before: before.clone(),
    };
    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let mut bg = start_sleeper(if sig == libc::SIGINT { "30.3" } else { "30.4" });
        bg.signal(sig);
        let out = bg
            .wait_for(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("agentrun did not exit within 10 s of {name}"));
        assert_ne!(
            out.status.code(),
            Some(0),
            "{name}: nonzero exit expected\n{out}"
        );
        assert_no_new_leftovers(
            &before,
            Duration::from_secs(2),
            &format!("after {name} to the CLI (no gc)\n{out}"),
        );
    }
}

#[test]
fn gc_with_nothing_to_do_succeeds() {
    let Some(_l) = setup_exclusive() else { return };
    let before = Leftovers::snapshot();
    agentrun(["gc"]).run().assert_code(0);
    assert_no_new_leftovers(&before, Duration::ZERO, "after an idle gc");
}
