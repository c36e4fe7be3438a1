//! Holding a rootless sandbox still without a cgroup freezer: every process of its cell's
//! pid namespace stopped with `SIGSTOP` and continued with `SIGCONT` afterwards, what a
//! snapshot of a rootless sandbox reads its writable layer under (root's sandboxes use their
//! cgroup's freezer: [`crate::live::LiveSandbox::with_writable_layer`]).
//!
//! The caller (the daemon, the owner of the sandbox's user namespace, so it may signal and
//! inspect every process in it) lists `/proc`, keeps the processes whose pid namespace is the
//! cell's, and stops each through a pidfd opened before its namespace is checked (a reused
//! pid is never signalled). A process that forked meanwhile is found by the next pass; the
//! stop is complete when a pass, after every stopped process is seen stopped (`T` in
//! `/proc/PID/stat`), finds no new one. Weaker than the freezer, and said so in
//! docs/rootless.md: the stop is visible to the sandbox (a parent waiting with `WUNTRACED`
//! sees it), and processes of a pid namespace nested in the cell's are not stopped.
//! Processes stopped already (by the sandbox itself) are left stopped afterwards.

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use crate::PoolError;

/// How long the stop may take before the snapshot is refused (and everything continued).
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// The processes stopped, continued when dropped.
pub struct Stopped {
    pidfds: Vec<OwnedFd>,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for fd in &self.pidfds {
            agentrun_runtime::cellrun::pidfd_signal(fd.as_fd(), libc::SIGCONT);
        }
    }
}

/// The state letter of `/proc/PID/stat` (after the command's closing parenthesis).
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

fn pid_ns(pid: i32) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    agentrun_runtime::sandbox::pidfd_open(nix::unistd::Pid::from_raw(pid)).ok()
}

/// Stops every process in the pid namespace of `init_pid` (the cell's PID 1, itself too).
pub fn stop_all(init_pid: i32) -> Result<Stopped, PoolError> {
    let gone = || PoolError::Invalid(format!("the sandbox's init ({init_pid}) is gone"));
    let ns = pid_ns(init_pid).ok_or_else(gone)?;
    let mut seen: HashSet<i32> = HashSet::new();
    let mut stopped = Stopped { pidfds: Vec::new() };
    let deadline = Instant::now() + STOP_DEADLINE;
    loop {
        let mut new = Vec::new();
        let entries = std::fs::read_dir("/proc").map_err(|e| PoolError::Io("list /proc", e))?;
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if seen.contains(&pid) {
                continue;
            }
            // The pidfd first: if the namespace checked next is the cell's, the pidfd is
            // that process (a pid reused before the open is the process checked).
            let Some(fd) = pidfd_open(pid) else { continue };
            if pid_ns(pid) != Some(ns) {
                continue;
            }
            seen.insert(pid);
            if matches!(state(pid), Some('T' | 't' | 'Z' | 'X')) {
                continue; // stopped by the sandbox itself (left as it is), or dead
            }
            agentrun_runtime::cellrun::pidfd_signal(fd.as_fd(), libc::SIGSTOP);
            new.push((pid, fd));
        }
        if new.is_empty() {
            return Ok(stopped);
        }
        for (pid, fd) in new {
            // Seen stopped (or gone) before the next pass.
            while agentrun_runtime::cellrun::pidfd_exists(fd.as_fd())
                && !matches!(state(pid), Some('T' | 't' | 'Z' | 'X') | None)
            {
                if Instant::now() > deadline {
                    stopped.pidfds.push(fd);
                    return Err(PoolError::Invalid(format!(
                        "process {pid} of the sandbox did not stop within {}s",
                        STOP_DEADLINE.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            stopped.pidfds.push(fd);
        }
        if Instant::now() > deadline {
            return Err(PoolError::Invalid(format!(
                "the sandbox's processes did not all stop within {}s (forking)",
                STOP_DEADLINE.as_secs()
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first child of `pid`, once it has one (bounded).
    fn child_of(pid: u32) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let children =
                std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap();
            if let Some(c) = children.split_whitespace().next() {
                return c.parse().unwrap();
            }
            assert!(Instant::now() < deadline, "no child of {pid}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn every_process_of_the_pid_namespace_stops_and_continues() {
        // A pid namespace of its own (a user namespace makes it possible for any user): its
        // PID 1 is a shell with two children; this process is outside it.
        let mut ns = std::process::Command::new("unshare")
            .args(["--user", "--pid", "--fork", "--kill-child", "sh", "-c"])
            .arg("sleep 30 & sleep 30 & wait")
            .spawn()
            .expect("unshare");
        let init = child_of(ns.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .count()
            < 2
        {
            assert!(Instant::now() < deadline, "the sleeps did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        let members: Vec<i32> = std::iter::once(init)
            .chain(
                std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
                    .unwrap()
                    .split_whitespace()
                    .map(|p| p.parse().unwrap()),
            )
            .collect();
        let stopped = stop_all(init).expect("stopped");
        for p in &members {
            assert_eq!(state(*p), Some('T'), "process {p} while stopped");
        }
        assert_ne!(state(std::process::id() as i32), Some('T'), "this process");
        assert_eq!(stopped.pidfds.len(), members.len());
        drop(stopped);
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in &members {
            while state(*p) == Some('T') {
                assert!(Instant::now() < deadline, "process {p} still stopped after");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = ns.kill();
        let _ = ns.wait();
    }
}
