//! `agentrun exec --isolation landlock-only`: the command confined by Landlock, seccomp and
//! rlimits only, with **no namespaces** — for hosts where user namespaces are disabled or
//! restricted (sysctl, AppArmor), and only when asked for.
//!
//! Clearly weaker than a sandbox, and named so: the command runs on the host's file system
//! (not the image: reading is limited to the profile's readable paths and the run's mounts,
//! by their host paths; writing to its writable ones), sees the host's processes in /proc
//! (Landlock's scoping stops it signalling them or reaching their abstract sockets), and has
//! the host's network but for TCP (Landlock denies every TCP bind and connect; UDP and other
//! families are left to the profile's seccomp socket rules). Its memory, task and CPU
//! limits are rlimits ([`crate::confine::limits`]), the wall time the caller's watchdog.
//!
//! This module owns that confinement: a fork, then in the child rlimits, no_new_privs,
//! Landlock (file system rules, then a TCP-denying ruleset), the seccomp filter, exec; the
//! parent waits (pidfd) until the command exits or the timeout passes (its process group is
//! killed).

use std::ffi::CString;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use crate::confine::landlock::LandlockRules;
use crate::confine::limits::{RlimitFallback, Rlimits};
use crate::error::RuntimeError;
use crate::outcome::RunOutcome;

/// What the command is confined by.
pub struct LandlockOnly<'a> {
    pub argv: &'a [String],
    /// The whole environment (`KEY=VALUE`).
    pub env: &'a [String],
    pub cwd: &'a Path,
    /// Host paths: readable (and executable), writable.
    pub rules: LandlockRules,
    pub landlock_abi: u32,
    pub filters: Vec<seccompiler::BpfProgram>,
    pub rlimits: RlimitFallback,
    pub limits: Rlimits,
}

/// Runs the command (stdio inherited) until it exits or `timeout` passes.
pub fn run(c: &LandlockOnly, timeout: Option<Duration>) -> Result<RunOutcome, RuntimeError> {
    if c.landlock_abi == 0 {
        return Err(RuntimeError::Unsupported(
            "--isolation landlock-only needs Landlock, and this kernel has none".into(),
        ));
    }
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| RuntimeError::InvalidInput("a NUL byte in the command".into()))
    };
    let argv: Vec<CString> = c.argv.iter().map(|a| cstr(a)).collect::<Result<_, _>>()?;
    let env: Vec<CString> = c.env.iter().map(|e| cstr(e)).collect::<Result<_, _>>()?;
    if argv.is_empty() {
        return Err(RuntimeError::InvalidInput("no command given".into()));
    }
    let started = Instant::now();
    // SAFETY: fork(2) from the CLI, which is single-threaded here; the child confines itself
    // and execs (or exits).
    let pid = match unsafe { nix::unistd::fork() }.map_err(|e| RuntimeError::sys("fork", e))? {
        nix::unistd::ForkResult::Child => {
            let code = match confine_and_exec(c, &argv, &env) {
                Ok(never) => match never {},
                Err(msg) => {
                    eprintln!("agentrun: {msg}");
                    crate::exit::EXIT_SETUP_FAILED
                }
            };
            // SAFETY: _exit ends the child without the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => child,
    };
    let pidfd = crate::sandbox::pidfd_open(pid)?;
    let deadline = timeout.map(|t| started + t);
    let mut timed_out = false;
    loop {
        let wait = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                PollTimeout::try_from(left.as_millis().min(i32::MAX as u128) as i32)
                    .unwrap_or(PollTimeout::MAX)
            }
            None => PollTimeout::NONE,
        };
        let mut fds = [PollFd::new(
            std::os::fd::AsFd::as_fd(&pidfd),
            PollFlags::POLLIN,
        )];
        match poll(&mut fds, wait) {
            Ok(0) => {
                timed_out = true;
                // Dropped: ESRCH at most (the group or the command is already gone); the waitpid below
                // reaps it either way.
                let _ = killpg(pid, Signal::SIGKILL);
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
                break;
            }
            Ok(_) => break,
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(RuntimeError::sys("poll", e)),
        }
    }
    let status = loop {
        match waitpid(pid, None) {
            Err(nix::Error::EINTR) => continue,
            Ok(s @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) => break Some(s),
            Ok(_) => continue,
            Err(_) => break None,
        }
    };
    // Whatever it left in its process group goes with it.
    let _ = killpg(pid, Signal::SIGKILL);
    Ok(RunOutcome::of_init(
        status,
        None,
        timed_out,
        Default::default(),
        started.elapsed(),
    ))
}

enum Never {}

/// A step of confining the command that failed, in the forked child (which prints it and
/// exits 125).
#[derive(Debug, thiserror::Error)]
enum ConfineError {
    #[error("setpgid: {0}")]
    Setpgid(nix::Error),
    #[error("setrlimit: {0}")]
    Setrlimit(std::io::Error),
    #[error("no_new_privs: {0}")]
    NoNewPrivs(std::io::Error),
    #[error("cannot enter {}: {errno}", dir.display())]
    Cwd {
        dir: std::path::PathBuf,
        errno: nix::Error,
    },
    #[error("landlock: {0}")]
    Landlock(crate::confine::landlock::LandlockError),
    #[error("landlock (network): {0}")]
    LandlockNet(landlock::RulesetError),
    #[error("seccomp: {0}")]
    Seccomp(crate::confine::seccomp::SeccompError),
}

fn confine_and_exec(
    c: &LandlockOnly,
    argv: &[CString],
    env: &[CString],
) -> Result<Never, ConfineError> {
    use landlock::{Access, AccessNet, Ruleset, RulesetAttr, ABI};
    nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0)).map_err(ConfineError::Setpgid)?;
    let lims = [
        (libc::RLIMIT_NOFILE, Some(c.limits.nofile)),
        (libc::RLIMIT_NPROC, Some(c.limits.nproc)),
        (libc::RLIMIT_CORE, Some(0)),
        (libc::RLIMIT_AS, c.rlimits.address_space),
        (libc::RLIMIT_CPU, c.rlimits.cpu_seconds),
    ];
    for (res, v) in lims {
        if let Some(v) = v {
            let l = libc::rlimit {
                rlim_cur: v,
                rlim_max: v,
            };
            // SAFETY: setrlimit reads the struct we pass.
            if unsafe { libc::setrlimit(res, &l) } != 0 {
                return Err(ConfineError::Setrlimit(std::io::Error::last_os_error()));
            }
        }
    }
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) only sets a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(ConfineError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    nix::unistd::chdir(c.cwd).map_err(|errno| ConfineError::Cwd {
        dir: c.cwd.to_path_buf(),
        errno,
    })?;
    crate::confine::landlock::restrict(&c.rules, c.landlock_abi).map_err(ConfineError::Landlock)?;
    if c.landlock_abi >= 4 {
        Ruleset::default()
            .handle_access(AccessNet::from_all(ABI::V4))
            .and_then(|r| r.create())
            .and_then(|r| r.restrict_self())
            .map_err(ConfineError::LandlockNet)?;
    }
    crate::confine::seccomp::install(&c.filters).map_err(ConfineError::Seccomp)?;
    let path = env
        .iter()
        .find_map(|e| e.to_str().ok()?.strip_prefix("PATH=").map(String::from))
        .unwrap_or_else(|| crate::inside::spawn::DEFAULT_PATH.into());
    let prog = if argv[0].as_bytes().contains(&b'/') {
        argv[0].clone()
    } else {
        let name = argv[0].to_str().unwrap_or_default();
        match crate::inside::spawn::find_program(name, &path) {
            Some(p) => CString::new(p.into_os_string().into_encoded_bytes()).unwrap_or_default(),
            None => {
                eprintln!("agentrun: {name}: command not found");
                // SAFETY: _exit in the child.
                unsafe { libc::_exit(crate::exit::EXIT_NOT_FOUND) }
            }
        }
    };
    let e = nix::unistd::execve(&prog, argv, env).unwrap_err();
    eprintln!(
        "agentrun: {}: {}",
        argv[0].to_string_lossy(),
        e.desc().to_lowercase()
    );
    // SAFETY: _exit in the child.
    unsafe {
        libc::_exit(if e == nix::Error::ENOENT {
            crate::exit::EXIT_NOT_FOUND
        } else {
            crate::exit::EXIT_NOT_EXECUTABLE
        })
    }
}
