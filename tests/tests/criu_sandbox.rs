//! What CRIU refuses on a process of an agentrun sandbox, for each shipped profile (issue 31:
//! the memory half of "pause to disk" and of fork; docs/opensandbox-compat.md says it):
//! `criu dump -t PID` of a sandboxed process, as root on the host, fails on the cell's masked
//! `/proc` paths ("doesn't have a proper root mount"); with every mount external (and the
//! cell's `/dev/shm`, a bind of a directory of its own tmpfs, named as one), CRIU's
//! parasite, running inside the process's Landlock domain, cannot connect its transport
//! socket ("Unable to connect a transport socket: Operation not permitted"). A CRIU that gets
//! past these (a kernel or profile change) makes this test fail, so the docs and the fork's
//! `"carried": ["files"]` are looked at again.
//!
//! Needs root and a CRIU that works here (hack/criu).

use std::fs;
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::{
    agentrun_bin, all_processes, run_with_timeout, setup, tempdir, wait_until, Running,
};

/// The built-in profiles, and `bundles/supervised.toml` (an example file, not built in).
const PROFILES: &[&str] = &[
    "default",
    "strict",
    "code-interpreter",
    "container",
    "build",
    "bundles/supervised.toml",
];

/// `criu dump` of `pid` with `extra` flags: its exit code and log.
fn dump(pid: i32, extra: &[&str]) -> (Option<i32>, String) {
    let dir = tempdir();
    let mut c = Command::new("criu");
    c.args(["dump", "-t", &pid.to_string(), "-D"])
        .arg(dir.path())
        .args(["-o", "dump.log", "-v4", "--shell-job", "--leave-running"])
        .args(extra);
    let out = run_with_timeout(c, None, Duration::from_secs(60));
    let log = fs::read_to_string(dir.path().join("dump.log")).unwrap_or_default();
    (out.status.code(), log)
}

fn errors(log: &str) -> String {
    log.lines()
        .filter(|l| l.contains("Error (") && !l.contains("RLIMIT_NOFILE for self"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn criu_cannot_dump_a_sandboxed_process_of_any_shipped_profile() {
    let Some(_lock) = setup() else { return };
    let check = run_with_timeout(
        {
            let mut c = Command::new("criu");
            c.arg("check");
            c
        },
        None,
        Duration::from_secs(30),
    );
    assert_eq!(
        check.status.code(),
        Some(0),
        "this test needs a CRIU that works on this kernel (run hack/criu as root)\n{check}"
    );
    for (n, name) in PROFILES.iter().enumerate() {
        let path = agentrun_e2e::workspace_root().join(name);
        let profile = if name.ends_with(".toml") {
            path.to_str().unwrap()
        } else {
            name
        };
        let tag = format!("300.{}{n}", std::process::id());
        let mut cmd = Command::new(agentrun_bin());
        cmd.args([
            "exec",
            "--no-daemon",
            "--profile",
            profile,
            "--",
            "sleep",
            &tag,
        ]);
        let mut run = Running::spawn(cmd, None);
        let pid = wait_until(Duration::from_secs(60), || {
            all_processes()
                .into_iter()
                .find(|p| p.cmdline == ["sleep", tag.as_str()])
                .map(|p| p.pid)
        })
        .unwrap_or_else(|| panic!("{profile}: the sandboxed sleep never started"));

        let (code, log) = dump(pid, &[]);
        assert_ne!(
            code,
            Some(0),
            "{profile}: criu dumped a sandboxed process:\n{log}"
        );
        let errs = errors(&log);
        assert!(
            errs.contains("doesn't have a proper root mount"),
            "{profile}: another refusal than the masked /proc paths':\n{errs}"
        );
        let (code, log) = dump(
            pid,
            &["--external", "mnt[]", "--external", "mnt[/dev/shm]:shm"],
        );
        assert_ne!(
            code,
            Some(0),
            "{profile}: criu dumped a sandboxed process:\n{log}"
        );
        let errs = errors(&log);
        assert!(
            errs.contains("Unable to connect a transport socket: Operation not permitted"),
            "{profile}: another refusal than Landlock's (the parasite's socket):\n{errs}"
        );
        println!("{profile}: {}", errs.lines().next().unwrap_or_default());
        // The sandbox is unharmed: it runs on until it is stopped.
        assert!(!run.exited(), "{profile}: the sandbox died of the dump");
        run.stop();
    }
}
