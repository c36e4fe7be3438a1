//! Holding a rootless sandbox still without a cgroup freezer: every process of its cell's
//! pid namespace stopped with `SIGSTOP` and continued with `SIGCONT` afterwards, what a
//! snapshot of a rootless sandbox reads its writable layer under (root's sandboxes use their
//! cgroup's freezer: [`crate::live::LiveSandbox::with_writable_layer`]).
//!
//! The caller (the daemon, the owner of the sandbox's user namespace, so it may signal every
//! process in it; it may not open their `/proc/PID/ns` links: they are non-dumpable) lists
//! `/proc/*/stat`, keeps the cell's PID 1 and every process descending from it (the pid
//! namespace's orphans are reparented to that PID 1), and stops each through a pidfd opened
//! before its parent is checked again (a reused pid is never signalled). A process that
//! forked meanwhile is found by the next pass; the stop is complete when a pass, after every
//! stopped process is seen stopped (`T` in `/proc/PID/stat`), finds no new one. Weaker than
//! the freezer, and said so in docs/rootless.md: the stop is visible to the sandbox (a parent
//! waiting with `WUNTRACED` sees it), and a process of the cell whose parent is outside it (a
//! Python zygote's child) is not stopped. Processes stopped already (by the sandbox itself)
//! are left stopped afterwards.

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
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

fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    agentrun_runtime::sandbox::pidfd_open(nix::unistd::Pid::from_raw(pid)).ok()
}

/// The parent pid of `pid` (`/proc/PID/stat`, readable without ptrace access).
fn ppid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// `init` and every process descending from it now (orphans of its pid namespace are
/// reparented to it, its PID 1).
fn family(init: i32) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) {
                if let Some(pp) = ppid(pid) {
                    parent_of.push((pid, pp));
                }
            }
        }
    }
    let mut members = vec![init];
    let mut i = 0;
    while i < members.len() {
        let p = members[i];
        members.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    members
}

/// Stops the cell's PID 1 (`init_pid`) and every process descending from it.
pub fn stop_all(init_pid: i32) -> Result<Stopped, PoolError> {
    let mut seen: HashSet<i32> = HashSet::new();
    let mut stopped = Stopped { pidfds: Vec::new() };
    let deadline = Instant::now() + STOP_DEADLINE;
    let init_fd = pidfd_open(init_pid)
        .ok_or_else(|| PoolError::Invalid(format!("the sandbox's init ({init_pid}) is gone")))?;
    loop {
        let mut new = Vec::new();
        let members = family(init_pid);
        for &pid in &members {
            if seen.contains(&pid) {
                continue;
            }
            // The pidfd first: if the process checked next still descends from the cell,
            // the pidfd is that process (a pid reused before the open is the one checked).
            let Some(fd) = (if pid == init_pid {
                init_fd.try_clone().ok()
            } else {
                pidfd_open(pid)
            }) else {
                continue;
            };
            if pid != init_pid && !ppid(pid).is_some_and(|pp| members.contains(&pp)) {
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
