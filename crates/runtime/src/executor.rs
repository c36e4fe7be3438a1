//! agentrun's libcontainer `Executor`: the sandbox's PID 1.
//!
//! libcontainer calls [`SandboxExecutor::exec`] in the container's init process after it has
//! entered the namespaces and cgroups, pivoted into the rootfs, set rlimits, no_new_privs and
//! the spec's capabilities. From there agentrun takes over:
//! 1. brings up loopback in the sandbox's (otherwise empty) network namespace, then drops the
//!    capabilities that needed (CAP_NET_ADMIN, CAP_SETPCAP) from every set, bounding included;
//! 2. forks the command: the child gets its own process group, default signal dispositions,
//!    Landlock and the spec's seccomp section (compiled with seccompiler: libcontainer without
//!    libseccomp ignores it), then execs;
//! 3. stays as a minimal init: forwards signals to the command's process group, reaps
//!    orphans, and exits with the command's status (128+N for signal N). Its exit tears down
//!    the pid namespace, so nothing the command started survives it.
//!
//! Landlock and seccomp are applied to the command only, so the init can keep serving later
//! requests (pool mode), and the Landlock signal scope keeps the command from signalling it.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;

use caps::{CapSet, Capability, CapsHashSet};
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, pipe2, setpgid, ForkResult, Pid};
use oci_spec::runtime::Spec;

use crate::landlock::{self, LandlockRules};
use crate::seccomp;

/// Exit code when the sandbox could not be set up around the command.
pub const EXIT_SETUP_FAILED: i32 = 125;

/// What the executor enforces besides what the spec says.
#[derive(Clone, Debug)]
pub struct SandboxExecutor {
    /// Landlock rules for the command; `None` in OCI mode without a profile annotation.
    pub landlock: Option<LandlockRules>,
    /// The host's Landlock ABI (probed before the container was created).
    pub landlock_abi: u32,
    /// Capabilities the command keeps; everything else is dropped, bounding set included.
    pub command_caps: Vec<Capability>,
    /// Bring `lo` up before dropping CAP_NET_ADMIN.
    pub loopback: bool,
    /// Program name for messages.
    pub program: String,
}

impl Executor for SandboxExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        // libcontainer only logs an executor error (through `tracing`, unseen here): say it on
        // the sandbox's stderr and exit with agentrun's setup-failure code instead.
        if let Err(e) = self.start(spec) {
            let _ = writeln!(
                std::io::stderr(),
                "{}: sandbox setup failed: {e}",
                self.program
            );
            std::process::exit(EXIT_SETUP_FAILED);
        }
        unreachable!("start() returns only on error")
    }

    fn validate(&self, _spec: &Spec) -> Result<(), ExecutorValidationError> {
        // A missing command is reported by the init as exit 127, like a shell would.
        Ok(())
    }
}

impl SandboxExecutor {
    /// Sets up, forks the command and supervises it; returns only on a setup error.
    fn start(&self, spec: &Spec) -> Result<(), ExecutorError> {
        let fail = |msg: String| ExecutorError::Other(msg);
        let args = spec
            .process()
            .as_ref()
            .and_then(|p| p.args().clone())
            .filter(|a| !a.is_empty())
            .ok_or(ExecutorError::InvalidArg)?;
        let argv: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_bytes()).map_err(|_| ExecutorError::InvalidArg))
            .collect::<Result<_, _>>()?;
        // Compile before forking, so a bad profile fails the setup, not the command.
        let filters = match spec.linux().as_ref().and_then(|l| l.seccomp().as_ref()) {
            Some(section) => seccomp::compile(section).map_err(|e| fail(e.to_string()))?,
            None => Vec::new(),
        };
        if self.loopback {
            crate::net::loopback_up().map_err(|e| fail(format!("bringing up loopback: {e}")))?;
        }
        narrow_capabilities(&self.command_caps).map_err(|e| fail(format!("capabilities: {e}")))?;
        // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag on this process. Set after every
        // credential change (they clear it): if agentrun dies, the sandbox dies with it.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };

        let all = SigSet::all();
        sigprocmask(SigmaskHow::SIG_BLOCK, Some(&all), None)
            .map_err(|e| fail(format!("sigprocmask: {e}")))?;
        let (err_r, err_w) =
            pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| fail(format!("pipe: {e}")))?;
        // SAFETY: the container init is single-threaded (libcontainer clones it without
        // threads), so the child may keep running Rust code until exec.
        match unsafe { fork() }.map_err(|e| fail(format!("fork: {e}")))? {
            ForkResult::Child => {
                drop(err_r);
                let code = self.run_command(&argv, &filters, err_w);
                // SAFETY: leave without running the parent's exit handlers.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => {
                drop(err_w);
                let code = supervise(child, err_r, &args[0]);
                std::process::exit(code)
            }
        }
    }

    /// In the forked child: confine, then exec. Returns an exit code only on failure.
    fn run_command(
        &self,
        argv: &[CString],
        filters: &[seccompiler::BpfProgram],
        err_w: OwnedFd,
    ) -> i32 {
        let report = |msg: String| {
            let _ = writeln!(std::io::stderr(), "{}: {msg}", self.program);
            EXIT_SETUP_FAILED
        };
        let _ = setpgid(Pid::from_raw(0), Pid::from_raw(0));
        reset_signals();
        if let Some(rules) = &self.landlock {
            if let Err(e) = landlock::restrict(rules, self.landlock_abi) {
                return report(e.to_string());
            }
        }
        if let Err(e) = seccomp::install(filters) {
            return report(e.to_string());
        }
        let err = nix::unistd::execvp(&argv[0], argv).unwrap_err();
        let _ = nix::unistd::write(&err_w, &(err as i32).to_ne_bytes());
        match err {
            nix::Error::ENOENT | nix::Error::ENOTDIR => 127,
            _ => 126,
        }
    }
}

/// Drops every capability not in `keep` from the bounding, ambient, inheritable, permitted and
/// effective sets (in an order the kernel accepts: bounding needs CAP_SETPCAP in effective).
fn narrow_capabilities(keep: &[Capability]) -> Result<(), caps::errors::CapsError> {
    let keep: CapsHashSet = keep.iter().copied().collect();
    for cap in caps::all() {
        if !keep.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap)?;
        }
    }
    caps::clear(None, CapSet::Ambient)?;
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new())?;
    let effective: CapsHashSet = caps::read(None, CapSet::Effective)?
        .intersection(&keep)
        .copied()
        .collect();
    caps::set(None, CapSet::Effective, &effective)?;
    let permitted: CapsHashSet = caps::read(None, CapSet::Permitted)?
        .intersection(&keep)
        .copied()
        .collect();
    caps::set(None, CapSet::Permitted, &permitted)
}

/// Restores default dispositions and an empty mask: ignored signals survive exec otherwise
/// (Rust ignores SIGPIPE, and that would leak into the command).
fn reset_signals() {
    for sig in Signal::iterator() {
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: installing SIG_DFL is always sound.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl) };
    }
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
}

/// The init loop: forward signals, reap, and return the command's exit code.
fn supervise(child: Pid, err_r: OwnedFd, program: &str) -> i32 {
    let mut buf = [0u8; 4];
    let exec_errno = match nix::unistd::read(err_r.as_raw_fd(), &mut buf) {
        Ok(4) => Some(nix::Error::from_raw(i32::from_ne_bytes(buf))),
        _ => None,
    };
    drop(err_r);
    if let Some(errno) = exec_errno {
        let what = match errno {
            nix::Error::ENOENT => "command not found".to_string(),
            e => e.desc().to_lowercase(),
        };
        let _ = writeln!(std::io::stderr(), "agentrun: {program}: {what}");
    }
    let all = SigSet::all();
    loop {
        let sig = match all.wait() {
            Ok(s) => s,
            Err(_) => continue,
        };
        if sig != Signal::SIGCHLD {
            // Forward to the command's process group (falls back to the pid if it has none).
            if kill(Pid::from_raw(-child.as_raw()), sig).is_err() {
                let _ = kill(child, sig);
            }
            continue;
        }
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == child => return code,
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => return 128 + sig as i32,
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    }
}

/// The in-sandbox paths that are writable, from the profile's list plus mounts.
pub fn writable_paths(
    profile: &[PathBuf],
    extra: impl IntoIterator<Item = PathBuf>,
) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = profile.iter().cloned().chain(extra).collect();
    v.sort();
    v.dedup();
    v
}
