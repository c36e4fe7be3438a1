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
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use caps::{CapSet, Capability, CapsHashSet};
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::unistd::{fork, pipe2, setpgid, ForkResult, Pid};
use oci_spec::runtime::Spec;

use crate::control::{self, InitRequest, InitResult, INIT_CONTROL_FD};
use crate::landlock::{self, LandlockRules};
use crate::seccomp;

/// Exit code when the sandbox could not be set up around the command.
pub const EXIT_SETUP_FAILED: i32 = 125;

/// How the init gets its command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitMode {
    /// Run the spec's `process` (args, env, cwd) on the container's own stdio.
    Spec,
    /// Pooled: wait for one [`InitRequest`] on [`INIT_CONTROL_FD`], run it on the fds that
    /// came with it, answer with an [`InitResult`].
    Serve,
}

/// What the executor enforces besides what the spec says.
#[derive(Clone, Debug)]
pub struct SandboxExecutor {
    pub mode: InitMode,
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

/// A command ready to fork: C strings prepared before forking.
struct Command {
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
    /// stdin, stdout, stderr for the command (`None`: the init's own).
    stdio: Option<[OwnedFd; 3]>,
}

fn cstrings(v: &[String]) -> Result<Vec<CString>, ExecutorError> {
    v.iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| ExecutorError::InvalidArg))
        .collect()
}

impl Command {
    fn from_spec(spec: &Spec) -> Result<Self, ExecutorError> {
        let process = spec.process().as_ref().ok_or(ExecutorError::InvalidArg)?;
        let args = process.args().clone().unwrap_or_default();
        // libcontainer already set the spec's environment on this process.
        let env: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
        Command::new(&args, &env, &process.cwd().to_string_lossy(), None)
    }

    fn from_request(req: InitRequest, fds: Vec<OwnedFd>) -> Result<Self, ExecutorError> {
        let stdio: [OwnedFd; 3] = fds
            .try_into()
            .map_err(|_| ExecutorError::Other("a run needs exactly 3 fds (stdio)".into()))?;
        Command::new(&req.argv, &req.env, &req.cwd, Some(stdio))
    }

    fn new(
        args: &[String],
        env: &[String],
        cwd: &str,
        stdio: Option<[OwnedFd; 3]>,
    ) -> Result<Self, ExecutorError> {
        if args.is_empty() {
            return Err(ExecutorError::InvalidArg);
        }
        Ok(Command {
            argv: cstrings(args)?,
            env: cstrings(env)?,
            cwd: CString::new(cwd).map_err(|_| ExecutorError::InvalidArg)?,
            stdio,
        })
    }

    /// Where the init writes messages about this command (its stderr).
    fn stderr(&self) -> RawFd {
        self.stdio.as_ref().map_or(2, |s| s[2].as_raw_fd())
    }
}

impl SandboxExecutor {
    /// Sets up, forks the command and supervises it; returns only on a setup error.
    fn start(&self, spec: &Spec) -> Result<(), ExecutorError> {
        let fail = |msg: String| ExecutorError::Other(msg);
        let control = self.mode == InitMode::Serve;
        // Nothing of the creating process may stay open in the sandbox: libcontainer only
        // marks these close-on-exec, and this process never execs.
        let first_closed = if control { INIT_CONTROL_FD + 1 } else { 3 };
        // SAFETY: close_range on fds this process owns; none of them is used past this point.
        unsafe { libc::close_range(first_closed as u32, u32::MAX, 0) };
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

        let (command, control_fd) = if control {
            // SAFETY: fd 3 was preserved by libcontainer for us and nothing else owns it.
            let fd = unsafe { OwnedFd::from_raw_fd(INIT_CONTROL_FD) };
            let _ = nix::fcntl::fcntl(
                fd.as_raw_fd(),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            );
            let (req, fds) = control::recv_json::<InitRequest>(fd.as_fd())
                .map_err(|e| fail(e.to_string()))?
                // The host closed the channel: this sandbox is not wanted any more.
                .ok_or_else(|| fail("control channel closed".into()))?;
            (Command::from_request(req, fds)?, Some(fd))
        } else {
            (Command::from_spec(spec)?, None)
        };

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
                let code = self.run_command(&command, &filters, err_w);
                // SAFETY: leave without running the parent's exit handlers.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => {
                drop(err_w);
                let result = supervise(child, err_r, &command);
                if let Some(fd) = control_fd {
                    let _ = control::send_json(fd.as_fd(), &result, &[]);
                }
                std::process::exit(result.exit_code)
            }
        }
    }

    /// In the forked child: confine, then exec. Returns an exit code only on failure.
    fn run_command(
        &self,
        command: &Command,
        filters: &[seccompiler::BpfProgram],
        err_w: OwnedFd,
    ) -> i32 {
        let report = |msg: String| {
            let line = format!("{}: {msg}\n", self.program);
            // SAFETY: write(2) of a buffer we own to the command's stderr fd.
            let _ = unsafe { libc::write(command.stderr(), line.as_ptr().cast(), line.len()) };
            EXIT_SETUP_FAILED
        };
        let _ = setpgid(Pid::from_raw(0), Pid::from_raw(0));
        reset_signals();
        if let Some(stdio) = &command.stdio {
            for (target, fd) in stdio.iter().enumerate() {
                if let Err(e) = nix::unistd::dup2(fd.as_raw_fd(), target as RawFd) {
                    return report(format!("stdio: {e}"));
                }
            }
        }
        if let Err(e) = nix::unistd::chdir(command.cwd.as_c_str()) {
            return report(format!(
                "cannot enter {}: {e}",
                command.cwd.to_string_lossy()
            ));
        }
        if let Some(rules) = &self.landlock {
            if let Err(e) = landlock::restrict(rules, self.landlock_abi) {
                return report(e.to_string());
            }
        }
        if let Err(e) = seccomp::install(filters) {
            return report(e.to_string());
        }
        let err = nix::unistd::execvpe(&command.argv[0], &command.argv, &command.env).unwrap_err();
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

/// The init loop: forward signals, reap, and return how the command ended.
fn supervise(child: Pid, err_r: OwnedFd, command: &Command) -> InitResult {
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
        let program = command.argv[0].to_string_lossy();
        let line = format!("agentrun: {program}: {what}\n");
        // SAFETY: write(2) of a buffer we own to the command's stderr fd.
        let _ = unsafe { libc::write(command.stderr(), line.as_ptr().cast(), line.len()) };
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
        while let Some((pid, status, usage)) = reap_one() {
            if pid != child.as_raw() {
                continue;
            }
            let (exit_code, signal) = if libc::WIFSIGNALED(status) {
                let s = libc::WTERMSIG(status);
                (128 + s, Some(s))
            } else {
                (libc::WEXITSTATUS(status), None)
            };
            let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
            return InitResult {
                exit_code,
                signal,
                user_us: us(usage.ru_utime),
                system_us: us(usage.ru_stime),
                max_rss_kb: usage.ru_maxrss as u64,
            };
        }
    }
}

/// Reaps one exited child without blocking: (pid, wait status, rusage).
fn reap_one() -> Option<(i32, i32, libc::rusage)> {
    let mut status = 0;
    // SAFETY: rusage is plain old data; wait4 fills it for the reaped child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 with valid out-pointers.
    let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut usage) };
    (pid > 0).then_some((pid, status, usage))
}
