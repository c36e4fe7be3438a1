//! Throwaway host users for the tests that run agentrun as an ordinary user (rootless.rs,
//! isolation.rs): made with `useradd`, their live processes, and their removal (processes
//! killed, `userdel -r`) when the test binary exits, also after a test failed half-way.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use crate::{all_processes, host, run_with_timeout};

/// The users this binary made (name, uid), set as soon as each exists.
static MADE: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());

extern "C" fn delete_users_at_exit() {
    let made = MADE.lock().map(|m| m.clone()).unwrap_or_default();
    for (name, uid) in made {
        kill_all(uid);
        let mut cmd = Command::new("userdel");
        cmd.args(["-r", &name]);
        // At exit nothing can report a failure; a user left behind is removed by the next
        // binary of the same pid (make_user deletes a user of its name first).
        let _ = run_with_timeout(cmd, None, Duration::from_secs(30));
    }
}

/// A user made by [`make_user`].
pub struct Throwaway {
    pub name: String,
    pub uid: u32,
    pub home: PathBuf,
}

/// Makes user `name` with a home and `/bin/sh` (one of that name left by a killed binary is
/// removed first) and has it removed when this binary exits.
pub fn make_user(name: &str) -> Throwaway {
    let _ = host("userdel", ["-r", name]); // none there is the usual case
    host("useradd", ["-m", "-s", "/bin/sh", name]).success();
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    if made.is_empty() {
        // SAFETY: registering a plain extern "C" fn.
        unsafe { libc::atexit(delete_users_at_exit) };
    }
    let home = PathBuf::from(format!("/home/{name}"));
    let uid = fs::metadata(&home).expect("the new user's home").uid();
    assert_ne!(uid, 0);
    made.push((name.to_string(), uid));
    Throwaway {
        name: name.to_string(),
        uid,
        home,
    }
}

/// Pids of `uid`'s live processes, by real uid in /proc/PID/status (not the owner of
/// /proc/PID: a non-dumpable process's is root), zombies aside.
pub fn pids_of(uid: u32) -> Vec<i32> {
    let uid = uid.to_string();
    all_processes()
        .into_iter()
        .filter(|p| {
            let status = fs::read_to_string(format!("/proc/{}/status", p.pid)).unwrap_or_default();
            let real = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next().map(String::from));
            let zombie = status
                .lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'));
            real.as_deref() == Some(uid.as_str()) && !zombie
        })
        .map(|p| p.pid)
        .collect()
}

/// SIGKILLs every live process of `uid`.
pub fn kill_all(uid: u32) {
    for pid in pids_of(uid) {
        // SAFETY: kill(2) of a process of the test's own throwaway user.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}
