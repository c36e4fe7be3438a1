//! The PID 1 of a cell (and of a build sandbox): starts the command, forwards signals to it,
//! reaps orphans, and reports how the command ended. These are the PID-1 building blocks a
//! cell's PID 1, the zygote's runs and a long-lived cell's server
//! ([`crate::inside::live`]) share.
//!
//! It runs confined (Landlock, seccomp, the command's capabilities), so the command inherits
//! the confinement from it with its spawn and a run pays for neither. It is non-dumpable and
//! the command lacks CAP_SYS_PTRACE, so sharing its Landlock domain gives the command no hold
//! on it; SIGKILL from inside its pid namespace cannot reach it, and other signals are only
//! forwarded back to the command. Its exit tears down the pid namespace: nothing the command
//! started survives it.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use caps::{CapSet, Capability, CapsHashSet};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;

use crate::control::{InitResult, ResourceUsage};
use crate::exit::{EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_SETUP_FAILED, EXIT_SIGNAL_BASE};
use crate::inside::spawn::{SpawnSpec, SpawnStep};
use crate::inside::user::Credentials;

/// One command to start.
pub(crate) struct Command {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: String,
    /// stdin, stdout, stderr for the command (`None`: the caller's own 0, 1, 2).
    pub stdio: Option<[OwnedFd; 3]>,
    /// Start it in a new session rather than a new process group.
    pub new_session: bool,
    /// Run it as this user (a Docker `User` spec, resolved inside the sandbox).
    pub user: Option<String>,
    /// Rlimits set on the command itself (a rootless sandbox's memory and CPU limits).
    pub rlimits: crate::confine::limits::RlimitFallback,
}

/// Why a [`Command`] could not be made.
#[derive(Debug)]
pub(crate) struct BadCommand(pub String);

impl Command {
    pub fn new(
        argv: Vec<String>,
        env: &[String],
        cwd: String,
        stdio: Option<[OwnedFd; 3]>,
    ) -> Result<Self, BadCommand> {
        if argv.is_empty() {
            return Err(BadCommand("no command given".into()));
        }
        if argv.iter().chain([&cwd]).any(|a| a.contains('\0')) {
            return Err(BadCommand("the command contains a NUL byte".into()));
        }
        let env = env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok(Command {
            argv,
            env,
            cwd,
            stdio,
            new_session: false,
            user: None,
            rlimits: Default::default(),
        })
    }

    /// Where messages about this command go (its stderr).
    fn message_fd(&self) -> RawFd {
        self.stdio.as_ref().map_or(2, |s| s[2].as_raw_fd())
    }

    /// Writes `agentrun: <msg>` on the command's stderr.
    pub fn say(&self, msg: &str) {
        say_on(self.message_fd(), msg);
    }

    /// Starts the command (see [`crate::inside::spawn`]). On failure, says why on the command's
    /// stderr and returns the exit code a shell would give, and the message.
    pub fn spawn(&self) -> Result<Pid, (i32, String)> {
        let cstr = |v: &str| CString::new(v).unwrap_or_default();
        let argv: Vec<CString> = self.argv.iter().map(|a| cstr(a)).collect();
        let mut env: Vec<CString> = self
            .env
            .iter()
            .map(|(k, v)| cstr(&format!("{k}={v}")))
            .collect();
        // posix_spawnp looks the program up in *our* PATH: make it the command's.
        match self.env.iter().find(|(k, _)| k == "PATH") {
            Some((_, path)) => std::env::set_var("PATH", path),
            None => std::env::remove_var("PATH"),
        }
        let cwd = cstr(&self.cwd);
        if !std::path::Path::new(&self.cwd).is_dir() {
            let msg = format!("cannot enter {}: no such directory", self.cwd);
            self.say(&msg);
            return Err((EXIT_SETUP_FAILED, msg));
        }
        let stdio = self
            .stdio
            .as_ref()
            .map(|s| [s[0].as_raw_fd(), s[1].as_raw_fd(), s[2].as_raw_fd()]);
        let user = self.user.as_deref().filter(|u| !u.is_empty());
        let creds = match user {
            Some(user) => Some(self.credentials(user, &mut env)?),
            None => None,
        };
        let spec = SpawnSpec {
            argv: &argv,
            env: &env,
            cwd: &cwd,
            stdio,
            new_session: self.new_session,
            rlimits: self.rlimits,
        };
        if let (Some(user), Some(creds)) = (user, creds) {
            return self.spawn_as(user, &spec, &creds);
        }
        crate::inside::spawn::spawn(&spec).map_err(|errno| {
            let (what, code) = match errno {
                nix::Error::ENOENT | nix::Error::ENOTDIR => {
                    ("command not found".into(), EXIT_NOT_FOUND)
                }
                e => (e.desc().to_lowercase(), EXIT_NOT_EXECUTABLE),
            };
            let msg = format!("{}: {what}", self.argv[0]);
            self.say(&msg);
            (code, msg)
        })
    }

    /// `user`, resolved from the sandbox's own /etc/passwd and /etc/group (this runs inside
    /// the sandbox's root). `HOME` in `env` becomes the user's passwd entry's unless the
    /// environment sets it to something non-empty (the Docker API sends an empty `HOME` when
    /// neither the image nor the request set one).
    fn credentials(
        &self,
        user: &str,
        env: &mut Vec<CString>,
    ) -> Result<Credentials, (i32, String)> {
        let creds = crate::inside::user::resolve_here(user).map_err(|e| {
            let msg = e.to_string();
            self.say(&msg);
            (EXIT_SETUP_FAILED, msg)
        })?;
        if !self.env.iter().any(|(k, v)| k == "HOME" && !v.is_empty()) {
            env.retain(|kv| !kv.as_bytes().starts_with(b"HOME="));
            env.push(CString::new(format!("HOME={}", creds.home)).unwrap_or_default());
        }
        Ok(creds)
    }

    /// [`Command::spawn`] as `user`, whose [`Self::credentials`] are `creds`.
    fn spawn_as(
        &self,
        user: &str,
        spec: &SpawnSpec<'_>,
        creds: &Credentials,
    ) -> Result<Pid, (i32, String)> {
        crate::inside::spawn::spawn_as(spec, Some(creds)).map_err(|(step, errno)| {
            let why = errno.desc().to_lowercase();
            let (msg, code) = match step {
                SpawnStep::Credentials => (
                    format!(
                        "cannot run as user {user} ({}:{}): {why}",
                        creds.uid, creds.gid
                    ),
                    EXIT_SETUP_FAILED,
                ),
                SpawnStep::Chdir => (
                    format!("cannot enter {} as user {user}: {why}", self.cwd),
                    EXIT_SETUP_FAILED,
                ),
                SpawnStep::Exec => match errno {
                    nix::Error::ENOENT | nix::Error::ENOTDIR => (
                        format!("{}: command not found", self.argv[0]),
                        EXIT_NOT_FOUND,
                    ),
                    _ => (format!("{}: {why}", self.argv[0]), EXIT_NOT_EXECUTABLE),
                },
            };
            self.say(&msg);
            (code, msg)
        })
    }
}

/// Exits at once with `code`: no atexit handlers or destructors, which in a cell's PID 1 (a
/// copy-on-write copy of the shell's init) would only fault in pages to run. Nothing here
/// buffers output (messages are written with `write(2)`).
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the process; nothing after it runs.
    unsafe { libc::_exit(code) }
}

/// Writes `agentrun: <msg>` on `fd`.
pub(crate) fn say_on(fd: RawFd, msg: &str) {
    let line = format!("agentrun: {msg}\n");
    // SAFETY: write(2) of a buffer we own to an fd we hold.
    // Dropped: nowhere left to report a failed report to (this is PID 1 saying why).
    let _ = unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
}

/// Blocks every signal: PID 1 takes them synchronously (and forwards them); commands get
/// default dispositions and an empty mask from their spawn. Threads started afterwards inherit
/// the mask, so signals still reach only the PID 1's own wait.
pub(crate) fn block_all_signals() -> nix::Result<()> {
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), None)
}

/// Runs `cmd` to its end (signals blocked by the caller): forwards signals, reaps, and returns
/// how it ended. A command that cannot start ends with the code a shell would give.
pub(crate) fn run_to_end(cmd: &Command) -> InitResult {
    match cmd.spawn() {
        Ok(child) => supervise(child),
        Err((code, _)) => InitResult {
            exit_code: code,
            ..Default::default()
        },
    }
}

/// The init loop: forward signals, reap, and return how the command ended (with the CPU time
/// and peak RSS of everything reaped so far: the command and the orphans it left).
fn supervise(child: Pid) -> InitResult {
    let all = SigSet::all();
    loop {
        // SAFETY: siginfo_t is plain old data; sigwaitinfo fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: sigwaitinfo(2) with a full set (every signal is blocked) and an out-pointer.
        let signo = unsafe { libc::sigwaitinfo(all.as_ref(), &mut info) };
        if signo < 0 || crate::inside::net::woken(signo, info.si_code) {
            continue;
        }
        // Real-time signals are not forwarded (as before: `Signal` has none of them).
        let Ok(sig) = Signal::try_from(signo) else {
            continue;
        };
        if sig != Signal::SIGCHLD {
            // Forward to the command's process group (falls back to the pid if it has none).
            if kill(Pid::from_raw(-child.as_raw()), sig).is_err() {
                // Dropped: ESRCH only, the command is gone; its exit is reaped next.
                let _ = kill(child, sig);
            }
            continue;
        }
        while let Some((pid, status, _)) = reap_one() {
            if pid != child.as_raw() {
                continue;
            }
            let (exit_code, signal) = decode_status(status);
            return InitResult {
                exit_code,
                signal,
                usage: children_usage(),
                ..Default::default()
            };
        }
    }
}

/// Exit code (128+N for signal N) and signal of a wait status.
pub(crate) fn decode_status(status: i32) -> (i32, Option<i32>) {
    if libc::WIFSIGNALED(status) {
        let s = libc::WTERMSIG(status);
        (EXIT_SIGNAL_BASE + s, Some(s))
    } else {
        (libc::WEXITSTATUS(status), None)
    }
}

/// CPU time and peak RSS of every child reaped so far.
pub(crate) fn children_usage() -> ResourceUsage {
    // SAFETY: rusage is plain old data; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage with a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    (&usage).into()
}

/// Reaps one exited child without blocking: (pid, wait status, rusage).
pub(crate) fn reap_one() -> Option<(i32, i32, libc::rusage)> {
    let mut status = 0;
    // SAFETY: rusage is plain old data; wait4 fills it for the reaped child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 with valid out-pointers.
    let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut usage) };
    (pid > 0).then_some((pid, status, usage))
}

/// Drops every capability not in `keep` from the bounding, ambient, inheritable, permitted and
/// effective sets (in an order the kernel accepts: bounding needs CAP_SETPCAP in effective).
pub(crate) fn narrow_capabilities(keep: &[Capability]) -> Result<(), caps::errors::CapsError> {
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

/// Blocks until `control` or `signals` is readable (an interrupted wait is retried) and says
/// which: the event loop of a PID 1 that serves a channel and reaps its children (a shell's
/// init, a long-lived cell's PID 1).
pub(crate) fn wait_either(
    control: std::os::fd::BorrowedFd<'_>,
    signals: &nix::sys::signalfd::SignalFd,
) -> nix::Result<(bool, bool)> {
    let ready = wait_readable_any(&[control, signals.as_fd()])?;
    Ok((ready[0], ready[1]))
}

/// Blocks until one of `fds` is readable (or hung up; an interrupted wait is retried); says
/// which are.
pub(crate) fn wait_readable_any(fds: &[std::os::fd::BorrowedFd<'_>]) -> nix::Result<Vec<bool>> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    loop {
        match poll(&mut pfds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e),
        }
        return Ok(pfds
            .iter()
            .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
            .collect());
    }
}
