//! agentrun's libcontainer `Executor`: the sandbox's PID 1.
//!
//! libcontainer calls [`SandboxExecutor::exec`] in the container's init process after it has
//! entered the namespaces and cgroups, pivoted into the rootfs, set rlimits, no_new_privs and
//! the spec's capabilities. From there agentrun takes over:
//! 1. brings up loopback in the sandbox's (otherwise empty) network namespace, then drops the
//!    capabilities that needed (CAP_NET_ADMIN, CAP_SETPCAP) from every set, bounding included;
//! 2. confines itself with Landlock and the spec's seccomp section (compiled with seccompiler:
//!    libcontainer without libseccomp ignores it), then forks the command (pooled: once its
//!    request has come), which inherits both and gets its own process group, default signal
//!    dispositions, its stdio and working directory, then execs;
//!    With an egress bridge, it first listens on a loopback port and relays each connection to
//!    the host's egress proxy (threads of the init, outside the command's process tree);
//! 3. stays as a minimal init: forwards signals to the command's process group, reaps
//!    orphans, and exits with the command's status (128+N for signal N). Its exit tears down
//!    the pid namespace, so nothing the command started survives it.
//!
//! Confining the init rather than each child keeps the per-run cost to a fork+exec. The init
//! makes itself non-dumpable (`PR_SET_DUMPABLE` 0, first thing) and the command lacks
//! CAP_SYS_PTRACE, so sharing its Landlock domain gives the command no hold on it; SIGKILL
//! from inside the pid namespace cannot reach it, and other signals are only forwarded back to
//! the command.

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use caps::{CapSet, Capability, CapsHashSet};
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;
use oci_spec::runtime::Spec;

use crate::control::{self, InitRequest, InitResult, LiveEvent, LiveRequest, INIT_CONTROL_FD};
use crate::landlock::{self, LandlockRules};
use crate::seccomp;
use crate::spawn::{SpawnSpec, SpawnStep};

/// Exit code when the sandbox could not be set up around the command.
pub const EXIT_SETUP_FAILED: i32 = 125;

/// How the init gets its command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitMode {
    /// Run the spec's `process` (args, env, cwd) on the container's own stdio.
    Spec,
    /// Pooled: wait for one [`InitRequest`] on [`INIT_CONTROL_FD`], run it on the fds that
    /// came with it, answer with an [`InitResult`]. If the first message is a
    /// [`LiveRequest`] instead, the sandbox is long-lived: the init serves requests until the
    /// channel closes (see [`crate::control`]).
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
    /// Working directory of a spec-mode command (the spec's `process.cwd` stays `/`).
    pub cwd: String,
    /// Bridge a loopback port to the egress proxy (see [`crate::net::EgressBridge`]).
    pub egress: Option<crate::net::EgressBridge>,
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

/// The command a sandbox runs, from the spec or from a pooled request.
struct Run {
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: String,
    /// stdin, stdout, stderr for the command (`None`: the init's own).
    stdio: Option<[OwnedFd; 3]>,
    /// Start it in a new session rather than a new process group.
    new_session: bool,
    /// Run it as this user (a Docker `User` spec, resolved inside the sandbox).
    user: Option<String>,
}

impl Run {
    fn from_spec(spec: &Spec, cwd: &str) -> Result<Self, ExecutorError> {
        let process = spec.process().as_ref().ok_or(ExecutorError::InvalidArg)?;
        // libcontainer already set the spec's environment on this process.
        Run::new(
            process.args().clone().unwrap_or_default(),
            std::env::vars().collect(),
            cwd.to_owned(),
            None,
        )
    }

    fn from_request(req: InitRequest, fds: Vec<OwnedFd>) -> Result<Self, ExecutorError> {
        let stdio: [OwnedFd; 3] = fds
            .try_into()
            .map_err(|_| ExecutorError::Other("a run needs exactly 3 fds (stdio)".into()))?;
        let env = req
            .env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Run::new(req.argv, env, req.cwd, Some(stdio))
    }

    fn new(
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: String,
        stdio: Option<[OwnedFd; 3]>,
    ) -> Result<Self, ExecutorError> {
        if argv.is_empty() || argv.iter().chain([&cwd]).any(|a| a.contains('\0')) {
            return Err(ExecutorError::InvalidArg);
        }
        Ok(Run {
            argv,
            env,
            cwd,
            stdio,
            new_session: false,
            user: None,
        })
    }

    /// Where the init writes messages about this command (its stderr).
    fn message_fd(&self) -> RawFd {
        self.stdio.as_ref().map_or(2, |s| s[2].as_raw_fd())
    }

    /// Writes `agentrun: <msg>` on the command's stderr.
    fn say(&self, msg: &str) {
        let line = format!("agentrun: {msg}\n");
        // SAFETY: write(2) of a buffer we own to an fd we hold.
        let _ = unsafe { libc::write(self.message_fd(), line.as_ptr().cast(), line.len()) };
    }

    /// Starts the command (see [`crate::spawn`]). On failure, says why on the command's
    /// stderr and returns the exit code a shell would give, and the message.
    fn spawn(&self) -> Result<Pid, (i32, String)> {
        let cstr = |v: &str| CString::new(v).unwrap_or_default();
        let argv: Vec<CString> = self.argv.iter().map(|a| cstr(a)).collect();
        let env: Vec<CString> = self
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
        if let Some(user) = self.user.as_deref().filter(|u| !u.is_empty()) {
            return self.spawn_as(user, argv, env, cwd, stdio);
        }
        crate::spawn::spawn(&SpawnSpec {
            argv: &argv,
            env: &env,
            cwd: &cwd,
            stdio,
            new_session: self.new_session,
        })
        .map_err(|errno| {
            let (what, code) = match errno {
                nix::Error::ENOENT | nix::Error::ENOTDIR => ("command not found".into(), 127),
                e => (e.desc().to_lowercase(), 126),
            };
            let msg = format!("{}: {what}", self.argv[0]);
            self.say(&msg);
            (code, msg)
        })
    }
}

impl Run {
    /// [`Run::spawn`] as `user`, resolved from the sandbox's own /etc/passwd and /etc/group
    /// (this runs in the init, inside the sandbox's root). `HOME` comes from the user's
    /// passwd entry unless the environment sets it to something non-empty (the Docker API
    /// sends an empty `HOME` when neither the image nor the request set one).
    fn spawn_as(
        &self,
        user: &str,
        argv: Vec<CString>,
        mut env: Vec<CString>,
        cwd: CString,
        stdio: Option<[RawFd; 3]>,
    ) -> Result<Pid, (i32, String)> {
        let creds = crate::user::resolve_here(user).map_err(|e| {
            let msg = e.to_string();
            self.say(&msg);
            (EXIT_SETUP_FAILED, msg)
        })?;
        if !self.env.iter().any(|(k, v)| k == "HOME" && !v.is_empty()) {
            env.retain(|kv| !kv.as_bytes().starts_with(b"HOME="));
            env.push(CString::new(format!("HOME={}", creds.home)).unwrap_or_default());
        }
        let spec = SpawnSpec {
            argv: &argv,
            env: &env,
            cwd: &cwd,
            stdio,
            new_session: self.new_session,
        };
        crate::spawn::spawn_as(&spec, &creds).map_err(|(step, errno)| {
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
                    nix::Error::ENOENT | nix::Error::ENOTDIR => {
                        (format!("{}: command not found", self.argv[0]), 127)
                    }
                    _ => (format!("{}: {why}", self.argv[0]), 126),
                },
            };
            self.say(&msg);
            (code, msg)
        })
    }
}

impl SandboxExecutor {
    /// Sets up, forks the command and supervises it; returns only on a setup error.
    fn start(&self, spec: &Spec) -> Result<(), ExecutorError> {
        let fail = |msg: String| ExecutorError::Other(msg);
        // The init must stay out of the command's reach (no /proc/1/mem, environ, fds): say
        // so explicitly rather than rely on libcontainer's setresuid having cleared the flag.
        // SAFETY: prctl(PR_SET_DUMPABLE, 0) only clears a flag of this process.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
            return Err(fail(format!(
                "prctl(PR_SET_DUMPABLE): {}",
                std::io::Error::last_os_error()
            )));
        }
        let control = self.mode == InitMode::Serve;
        // Nothing of the creating process may stay open in the sandbox: libcontainer only
        // marks these close-on-exec, and this process never execs.
        let first_closed = if control { INIT_CONTROL_FD + 1 } else { 3 };
        // SAFETY: close_range on fds this process owns; none of them is used past this point.
        unsafe { libc::close_range(first_closed as u32, u32::MAX, 0) };
        // Compile before anything runs, so a bad profile fails the setup, not the command.
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
        // Confine the init itself: the command inherits Landlock and seccomp when it is
        // spawned, so a pooled run pays for neither. The init needs nothing either forbids
        // (recvmsg, clone without namespace flags, wait4, kill, execve of the command).
        if let Some(rules) = &self.landlock {
            landlock::restrict(rules, self.landlock_abi).map_err(|e| fail(e.to_string()))?;
        }
        seccomp::install(&filters).map_err(|e| fail(e.to_string()))?;

        let (run, control_fd) = if control {
            // SAFETY: fd 3 was preserved by libcontainer for us and nothing else owns it.
            let fd = unsafe { OwnedFd::from_raw_fd(INIT_CONTROL_FD) };
            let _ = nix::fcntl::fcntl(
                fd.as_raw_fd(),
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            );
            let (bytes, fds) = control::recv(fd.as_fd())
                .map_err(|e| fail(e.to_string()))?
                // The host closed the channel: this sandbox is not wanted any more.
                .ok_or_else(|| fail("control channel closed".into()))?;
            let bad = |e: serde_json::Error| fail(format!("bad control message: {e}"));
            let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(bad)?;
            if value.get("op").is_some() {
                let first: LiveRequest = serde_json::from_value(value).map_err(bad)?;
                // The bridge's threads must not take the signals `serve_live` reads from its
                // signalfd: block them all before they start.
                if let Some(bridge) = &self.egress {
                    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), None)
                        .map_err(|e| fail(format!("sigprocmask: {e}")))?;
                    bridge
                        .start()
                        .map_err(|e| fail(format!("egress bridge: {e}")))?;
                }
                serve_live(fd, first, fds)
            }
            let req: InitRequest = serde_json::from_value(value).map_err(bad)?;
            (Run::from_request(req, fds)?, Some(fd))
        } else {
            (Run::from_spec(spec, &self.cwd)?, None)
        };

        // The init takes every signal synchronously (and forwards it); the command gets
        // default dispositions and an empty mask from the spawn.
        let all = SigSet::all();
        sigprocmask(SigmaskHow::SIG_BLOCK, Some(&all), None)
            .map_err(|e| fail(format!("sigprocmask: {e}")))?;
        // Listening before the command starts: its first connection finds the bridge up.
        // The bridge's threads inherit the blocked mask, so signals still reach only `supervise`.
        if let Some(bridge) = &self.egress {
            bridge
                .start()
                .map_err(|e| fail(format!("egress bridge: {e}")))?;
        }
        let result = match run.spawn() {
            Ok(child) => supervise(child),
            Err((code, _)) => InitResult {
                exit_code: code,
                ..Default::default()
            },
        };
        if let Some(fd) = control_fd {
            let _ = control::send_json(fd.as_fd(), &result, &[]);
        }
        std::process::exit(result.exit_code)
    }
}

/// The long-lived init: serves [`LiveRequest`]s until the host closes the channel, reports
/// every process's start and exit, reaps orphans. Never returns.
fn serve_live(control: OwnedFd, first: LiveRequest, fds: Vec<OwnedFd>) -> ! {
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    use std::collections::HashMap;
    let all = SigSet::all();
    if sigprocmask(SigmaskHow::SIG_BLOCK, Some(&all), None).is_err() {
        std::process::exit(EXIT_SETUP_FAILED);
    }
    let Ok(signals) = SignalFd::with_flags(&all, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    else {
        std::process::exit(EXIT_SETUP_FAILED);
    };
    // pid -> id, and id -> pid (= its process group), of the processes still running.
    let mut by_pid: HashMap<i32, u64> = HashMap::new();
    let mut by_id: HashMap<u64, i32> = HashMap::new();
    let send = |ev: &LiveEvent| {
        // A failed send means the host is gone; the next recv sees EOF and we exit.
        let _ = control::send_json(control.as_fd(), ev, &[]);
    };
    let handle = |req: LiveRequest,
                  fds: Vec<OwnedFd>,
                  by_pid: &mut HashMap<i32, u64>,
                  by_id: &mut HashMap<u64, i32>| match req {
        LiveRequest::Spawn(sp) => {
            let id = sp.id;
            let run = Run::from_request(
                InitRequest {
                    argv: sp.argv,
                    env: sp.env,
                    cwd: sp.cwd,
                },
                fds,
            );
            match run {
                Ok(mut run) => {
                    run.new_session = sp.new_session;
                    run.user = sp.user;
                    match run.spawn() {
                        Ok(pid) => {
                            by_pid.insert(pid.as_raw(), id);
                            by_id.insert(id, pid.as_raw());
                            send(&LiveEvent::Started {
                                id,
                                pid: pid.as_raw(),
                            });
                        }
                        Err((exit_code, message)) => send(&LiveEvent::Failed {
                            id,
                            exit_code,
                            message,
                        }),
                    }
                }
                Err(e) => send(&LiveEvent::Failed {
                    id,
                    exit_code: EXIT_SETUP_FAILED,
                    message: e.to_string(),
                }),
            }
        }
        LiveRequest::Signal { id, signal, group } => {
            if let (Some(&pid), Ok(sig)) = (by_id.get(&id), Signal::try_from(signal)) {
                let target = if group { -pid } else { pid };
                let _ = kill(Pid::from_raw(target), sig);
            }
        }
        LiveRequest::SignalAll { signal } => {
            // From PID 1, kill(-1) reaches every process of the pid namespace but the init
            // itself; a process forking meanwhile cannot leave a child behind (the kernel
            // refuses forks with a fatal signal pending).
            if let Ok(sig) = Signal::try_from(signal) {
                let _ = kill(Pid::from_raw(-1), sig);
            }
        }
    };
    handle(first, fds, &mut by_pid, &mut by_id);
    loop {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut pfds = [
            PollFd::new(control.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut pfds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(_) => std::process::exit(EXIT_SETUP_FAILED),
        }
        let control_ready = pfds[0].revents().is_some_and(|r| !r.is_empty());
        let signal_ready = pfds[1].revents().is_some_and(|r| !r.is_empty());
        if signal_ready {
            // Only SIGCHLD matters; other signals sent to the init are dropped (the host
            // talks to processes through the channel).
            while let Ok(Some(_)) = signals.read_signal() {}
            while let Some((pid, status, usage)) = reap_one() {
                let Some(id) = by_pid.remove(&pid) else {
                    continue; // an orphan
                };
                by_id.remove(&id);
                let (exit_code, signal) = if libc::WIFSIGNALED(status) {
                    let s = libc::WTERMSIG(status);
                    (128 + s, Some(s))
                } else {
                    (libc::WEXITSTATUS(status), None)
                };
                send(&LiveEvent::Exited {
                    id,
                    result: InitResult {
                        exit_code,
                        signal,
                        usage: (&usage).into(),
                    },
                });
            }
        }
        if control_ready {
            match control::recv(control.as_fd()) {
                Ok(Some((bytes, fds))) => match serde_json::from_slice::<LiveRequest>(&bytes) {
                    Ok(req) => handle(req, fds, &mut by_pid, &mut by_id),
                    Err(_) => continue,
                },
                // The host closed the channel: the sandbox is over. Exiting PID 1 kills every
                // process in the namespace.
                Ok(None) | Err(_) => std::process::exit(0),
            }
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

/// The init loop: forward signals, reap, and return how the command ended.
fn supervise(child: Pid) -> InitResult {
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
            return InitResult {
                exit_code,
                signal,
                usage: (&usage).into(),
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
