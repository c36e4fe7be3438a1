//! A container's lifecycle: `create`, `start`, `kill`, `delete`, `run` (create + start +
//! wait + delete) and `exec` (a further process in a running container), over
//! libcontainer's `ContainerBuilder` and `Container`.
//!
//! `create` leaves the container's init waiting for `start` and exits; the init is then
//! reparented to the caller's subreaper (containerd's shim), which reaps it. `run` and `exec`
//! without `--detach` wait for their process themselves and exit with its status (128+N when
//! killed by signal N), forwarding the usual terminating signals to it meanwhile.

use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::ContainerStatus;
use libcontainer::signal::Signal;
use libcontainer::syscall::syscall::SyscallType;
use liboci_cli::{Create, Exec, Kill, Run};
use nix::sys::signal::{kill as send_signal, sigprocmask, SigSet, SigmaskHow, Signal as NixSignal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use oci_spec::runtime::{ContainerState, Spec};

use crate::annotations::Hardening;
use crate::container;
use crate::executor::OciExecutor;
use crate::globals::Globals;
use crate::record::Record;
use crate::seccomp_notify::{self, Forwarder, StateTemplate};
use crate::OciError;

/// Signals `run`/`exec` pass on to the process they wait for.
const FORWARDED: &[NixSignal] = &[
    NixSignal::SIGINT,
    NixSignal::SIGTERM,
    NixSignal::SIGHUP,
    NixSignal::SIGQUIT,
    NixSignal::SIGUSR1,
    NixSignal::SIGUSR2,
    NixSignal::SIGWINCH,
];

/// `create`: sets the container up from its bundle; its process waits for `start`.
pub fn create(globals: &Globals, args: Create) -> Result<(), OciError> {
    let id = args.container_id;
    let dir = container::dir(&globals.root, &id)?;
    if globals.systemd_cgroup {
        // libcgroups is built without its systemd manager (it would pull in D-Bus).
        return Err(OciError::Invalid(
            "the systemd cgroup driver is not supported: use cgroupfs (containerd: SystemdCgroup = false)".into(),
        ));
    }
    let bundle =
        std::fs::canonicalize(&args.bundle).map_err(|e| OciError::io("bundle", &args.bundle, e))?;
    let spec = bundle_spec(&bundle)?;
    // Bad annotations and notify rules that cannot work fail here, before anything exists.
    let hardening = Hardening::from_spec(&spec)?;
    let notify_plan = seccomp_notify::plan(hardening.seccomp.as_ref())?;
    if dir.exists() {
        return Err(OciError::Exists(id));
    }
    make_root(&globals.root)?;
    let (forwarder, handover) = Forwarder::spawn_for(notify_plan.as_ref(), || StateTemplate {
        id: id.clone(),
        status: ContainerState::Creating,
        bundle: bundle.clone(),
        annotations: spec.annotations().clone(),
    })?;
    let built = ContainerBuilder::new(id.clone(), SyscallType::default())
        .with_executor(OciExecutor::with_notify(handover))
        .with_pid_file(args.pid_file.as_ref())?
        .with_console_socket(args.console_socket.as_ref())
        .with_root_path(&globals.root)?
        .with_preserved_fds(args.preserve_fds)
        .validate_id()?
        .as_init(&bundle)
        .with_systemd(globals.systemd_cgroup)
        .with_detach(true)
        .with_no_pivot(args.no_pivot)
        .build();
    globals.logger.relay_children();
    // The agent must have the notify fd before `create` returns, as with runc.
    let container = match seccomp_notify::handed_over(built, forwarder) {
        Ok(c) => c,
        Err((_, cause)) => {
            // Nothing of a failed create may stay behind (libcontainer removes what it made
            // on most paths; a half-written directory is not a container).
            if let Ok(mut c) = container::load(&globals.root, &id) {
                if let Some(pid) = c.pid() {
                    // It may be gone already; wait_gone waits either way.
                    let _ = send_signal(pid, NixSignal::SIGKILL);
                    wait_gone(Some(pid.as_raw()));
                }
                if let Err(e) = c.delete(true) {
                    tracing::warn!("deleting the failed container {id}: {e}");
                }
            }
            // What is left of a container that failed to be made; its error is what the caller hears.
            let _ = std::fs::remove_dir_all(&dir);
            return Err(cause);
        }
    };
    Record::new(&spec, &bundle, hardening.profile).save(&container.root)
}

/// `start`: runs the created container's process.
pub fn start(globals: &Globals, id: &str) -> Result<(), OciError> {
    let mut c = container::load(&globals.root, id)?;
    match c.status() {
        ContainerStatus::Created => Ok(c.start()?),
        ContainerStatus::Stopped => Err(OciError::Invalid(
            "cannot start a container that has stopped".into(),
        )),
        ContainerStatus::Running => Err(OciError::Invalid(
            "cannot start an already running container".into(),
        )),
        s => Err(OciError::status("start", s)),
    }
}

/// `kill ID [SIGNAL]`.
pub fn kill(globals: &Globals, args: Kill) -> Result<(), OciError> {
    let mut c = container::load(&globals.root, &args.container_id)?;
    let signal = Signal::try_from(args.signal.as_str())
        .map_err(|_| OciError::Invalid(format!("unknown signal {:?}", args.signal)))?;
    if c.status() == ContainerStatus::Stopped && !args.all {
        return Err(OciError::NotRunning);
    }
    c.kill(signal, args.all)?;
    Ok(())
}

/// `delete [--force] ID`; finishes the container's lifetime span.
pub fn delete(globals: &Globals, id: &str, force: bool) -> Result<(), OciError> {
    let dir = container::dir(&globals.root, id)?;
    let mut c = match container::load(&globals.root, id) {
        Ok(c) => c,
        Err(OciError::NotExist) => {
            // An aborted create can leave a directory without a state file (runc does the same).
            // A directory without a state is no container; delete answers as runc does either way.
            let _ = std::fs::remove_dir_all(&dir);
            return if force {
                Ok(())
            } else {
                Err(OciError::NotExist)
            };
        }
        Err(e) => return Err(e),
    };
    if !force
        && !matches!(
            c.status(),
            ContainerStatus::Stopped | ContainerStatus::Created
        )
    {
        return Err(OciError::Invalid(format!(
            "cannot delete container {id} that is not stopped: {}",
            container::status_str(c.status())
        )));
    }
    let record = Record::load(&dir);
    let pid = c.pid().map(Pid::as_raw);
    if c.status() != ContainerStatus::Stopped {
        // Kill and wait, so that the cgroup is empty when it is removed.
        // The processes may be gone already; wait_gone waits either way.
        let _ = c.kill(Signal::from(NixSignal::SIGKILL), true);
        wait_gone(pid);
    }
    c.delete(true)?;
    if let Some(r) = record {
        r.finish_span(id, pid);
    }
    Ok(())
}

/// `run`: create, start and, unless `--detach`, wait, delete and return the exit code.
pub fn run(globals: &Globals, args: Run) -> Result<i32, OciError> {
    let id = args.container_id.clone();
    if !args.detach && !args.no_subreaper {
        // Orphans of the container's init come to us, not to PID 1.
        // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) only sets a flag on this process.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    }
    create(
        globals,
        Create {
            bundle: args.bundle,
            console_socket: args.console_socket,
            pid_file: args.pid_file,
            no_pivot: args.no_pivot,
            no_new_keyring: args.no_new_keyring,
            preserve_fds: args.preserve_fds,
            container_id: id.clone(),
        },
    )?;
    if args.detach {
        return start(globals, &id).map(|()| 0);
    }
    let pid = container::load(&globals.root, &id)?.pid();
    let forwarding = block_forwarded();
    let started = start(globals, &id);
    let code = match (started, pid) {
        (Ok(()), Some(pid)) => wait_forwarding(pid, &forwarding),
        (Ok(()), None) => Err(OciError::Invalid("container has no process".into())),
        (Err(e), _) => Err(e),
    };
    // What the container's init reported after `start` (a startContainer hook, the exec).
    globals.logger.relay_children();
    let deleted = if args.keep {
        Ok(())
    } else {
        delete(globals, &id, true)
    };
    let code = code?;
    deleted.map(|()| code)
}

/// `exec`: runs a process in a running container (`--process FILE` or `ID CMD...`).
pub fn exec(globals: &Globals, args: Exec) -> Result<i32, OciError> {
    let c = container::load(&globals.root, &args.container_id)?;
    match c.status() {
        ContainerStatus::Running => {}
        ContainerStatus::Paused if args.ignore_paused => {}
        ContainerStatus::Stopped => {
            return Err(OciError::Invalid(
                "cannot exec in a stopped container".into(),
            ))
        }
        s => return Err(OciError::status("exec in", s)),
    }
    if args.process.is_none() && args.command.is_empty() {
        return Err(OciError::Invalid(
            "exec needs --process FILE or a command".into(),
        ));
    }
    let (user, group) = match args.user {
        Some((u, g)) => (Some(u), g),
        None => (None, None),
    };
    // The container's notify rules apply to the new process too: its listener goes to the
    // agent as well (state "running").
    let spec = bundle_spec(c.bundle())?;
    let notify_plan = seccomp_notify::plan(Hardening::from_spec(&spec)?.seccomp.as_ref())?;
    let (forwarder, handover) = Forwarder::spawn_for(notify_plan.as_ref(), || StateTemplate {
        id: c.id().to_owned(),
        status: ContainerState::Running,
        bundle: c.bundle().clone(),
        annotations: c.state.annotations.clone(),
    })?;
    let forwarding = (!args.detach).then(block_forwarded);
    let pid = ContainerBuilder::new(args.container_id.clone(), SyscallType::default())
        .with_executor(OciExecutor::with_notify(handover))
        .with_root_path(&globals.root)?
        .with_console_socket(args.console_socket.as_ref())
        .with_pid_file(args.pid_file.as_ref())?
        .with_preserved_fds(args.preserve_fds)
        .validate_id()?
        .as_tenant()
        .with_detach(args.detach)
        .with_cwd(args.cwd.as_ref())
        .with_env(args.env.into_iter().collect())
        .with_process(args.process.as_ref())
        .with_no_new_privs(args.no_new_privs)
        .with_container_args(args.command)
        .with_capabilities(args.cap)
        .with_additional_gids(args.additional_gids)
        .with_user(user)
        .with_group(group)
        .with_ignore_paused(args.ignore_paused)
        .with_sub_cgroup(args.cgroup)
        .build();
    globals.logger.relay_children();
    let pid = match seccomp_notify::handed_over(pid, forwarder) {
        Ok(p) => p,
        Err((pid, cause)) => {
            if let Some(p) = &pid {
                // Its notified syscalls would never be answered.
                // It may be gone already; waitpid reaps it either way.
                let _ = send_signal(*p, NixSignal::SIGKILL);
                let _ = waitpid(*p, None);
            }
            if let Some(f) = &forwarding {
                // Restoring the mask of this (exiting) command cannot fail with valid arguments.
                let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&f.previous), None);
            }
            return Err(cause);
        }
    };
    match forwarding {
        None => Ok(0),
        Some(f) => wait_forwarding(pid, &f),
    }
}

/// The spec of the bundle at `bundle` (its `config.json`). oci-spec's own message is "serde
/// failed": the cause (e.g. "no variant for CAP_FOO") is in its source, so it is said too.
fn bundle_spec(bundle: &Path) -> Result<Spec, OciError> {
    let config = bundle.join("config.json");
    Spec::load(&config).map_err(|e| {
        OciError::Invalid(format!("{}: {}", config.display(), crate::error::chain(&e)))
    })
}

/// Creates `--root` (owner-only) if it does not exist.
fn make_root(root: &Path) -> Result<(), OciError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)
        .map_err(|e| OciError::io("creating", PathBuf::from(root), e))
}

/// The signal mask to restore, and the signals blocked to be forwarded.
struct Forwarding {
    previous: SigSet,
    set: SigSet,
}

/// Blocks the forwarded signals and SIGCHLD, to take them synchronously.
fn block_forwarded() -> Forwarding {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(*s);
    }
    set.add(NixSignal::SIGCHLD);
    let mut previous = SigSet::empty();
    // Cannot fail with valid arguments (EINVAL only for a bad `how`).
    let _ = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut previous));
    Forwarding { previous, set }
}

/// Waits for `pid` (our child), forwarding signals to it; its exit code (128+N for signal N).
fn wait_forwarding(pid: Pid, f: &Forwarding) -> Result<i32, OciError> {
    let code = loop {
        // Reap whatever exited (orphans reparented to us included); stop at `pid`.
        let mut done = None;
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(p, code)) if p == pid => done = Some(code),
                Ok(WaitStatus::Signaled(p, sig, _)) if p == pid => done = Some(128 + sig as i32),
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => {}
                Err(nix::Error::ECHILD) => {
                    done = done.or(Some(0));
                    break;
                }
                Err(_) => break,
            }
        }
        if let Some(code) = done {
            break code;
        }
        match f.set.wait() {
            Ok(NixSignal::SIGCHLD) | Err(_) => {}
            Ok(sig) => {
                // The process may have exited meanwhile: the signal had nobody to reach.
                let _ = send_signal(pid, sig);
            }
        }
    };
    // Cannot fail with valid arguments (EINVAL only for a bad `how`).
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&f.previous), None);
    Ok(code)
}

/// Waits up to 5 s for `pid` to be gone (or a zombie someone else reaps).
fn wait_gone(pid: Option<i32>) {
    let Some(pid) = pid.filter(|p| *p > 0) else {
        return;
    };
    for _ in 0..500 {
        // Our own child: reap it (a `run` whose start failed).
        // ECHILD: not our child (or reaped already); the /proc check below decides.
        let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        if matches!(state, None | Some("Z") | Some("X")) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
