//! Nothing of a run may stay on the host: processes, mounts, cgroups, state dirs — after
//! normal runs, and after the CLI itself was killed (a cold run's own janitor cleans up at
//! once; `agentrun gc` or the next run collects whatever else was left).
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

/// The sandbox state dirs under `state` (their ids).
fn sandbox_ids(state: &std::path::Path) -> Vec<String> {
    fs::read_dir(state.join("sandboxes"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A cold run killed with SIGKILL: no `agentrun gc` and no next run, yet within a bounded
/// wait none of its mounts remains in any mount namespace, and its state dir, cgroups and
/// processes are gone (its mounts were in its own mount namespace, its janitor collected
/// the rest).
#[test]
fn killed_cold_run_leaves_nothing_without_gc() {
    let Some(_l) = setup_exclusive() else { return };
    let d = Daemon::unstarted();
    let mut bg = d
        .exec(["sleep", "30.5"])
        .env("AGENTRUN_NO_DAEMON", "1")
        .timeout(Duration::from_secs(60))
        .spawn();
    let running = wait_until(Duration::from_secs(20), || {
        let ids = sandbox_ids(d.state());
        let sleeping = all_processes()
            .into_iter()
            .any(|p| p.cmdline == ["sleep", "30.5"] && p.uid >= SANDBOX_UID_BASE);
        (sleeping && ids.len() == 1).then(|| ids[0].clone())
    });
    let Some(id) = running else {
        let out = bg.wait_or_kill(Duration::from_secs(1));
        panic!(
            "the cold run's sleep never showed up (sandboxes: {:?})\n{out}",
            sandbox_ids(d.state())
        );
    };
    assert!(
        !sandbox_mounts_anywhere(&id).is_empty(),
        "the running sandbox {id} shows no mount in any namespace: the check below would \
         prove nothing"
    );
    bg.kill9();
    drop(bg);
    let state_dir = d.state().join("sandboxes").join(&id);
    let left = || {
        let mounts = sandbox_mounts_anywhere(&id);
        let cgroups = sandbox_cgroups(&id);
        let procs: Vec<String> = sandboxed_processes_running(&["sleep", "30.5"])
            .iter()
            .map(|p| p.to_string())
            .collect();
        let dir = state_dir.exists();
        (mounts, cgroups, procs, dir)
    };
    let gone = wait_until(Duration::from_secs(10), || {
        let (m, c, p, dir) = left();
        (m.is_empty() && c.is_empty() && p.is_empty() && !dir).then_some(())
    });
    if gone.is_none() {
        let (m, c, p, dir) = left();
        panic!(
            "10 s after SIGKILL of a cold `agentrun exec` (no gc, no next run), sandbox {id} \
             still has:\n  mounts: {m:#?}\n  cgroups: {c:?}\n  processes: {p:?}\n  state dir \
             {} exists: {dir}",
            state_dir.display()
        );
    }
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
