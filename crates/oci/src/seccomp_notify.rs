//! Seccomp user notification in OCI mode: a spec whose `linux.seccomp` has `SCMP_ACT_NOTIFY`
//! rules and a `listenerPath` (the runtime spec's "seccomp notify" section). The runtime
//! installs those rules with `SECCOMP_FILTER_FLAG_NEW_LISTENER` in the container's process and
//! sends the listener fd, with the container process state (`ContainerProcessState`: the
//! container's `State`, the process pid, `listenerMetadata`), to the agent listening on
//! `listenerPath`, over `SCM_RIGHTS`; the agent then answers the notified syscalls.
//!
//! How the fd travels, and why:
//! - In the container's process, the executor's `setup_envs` (the last step of libcontainer's
//!   init before it reports ready, i.e. during `create`, or for `exec` before the process
//!   runs) installs the notify filter ([`Handover::run`]) and sends the listener through a
//!   socketpair the runtime made before libcontainer cloned (libcontainer clones without exec,
//!   so the process has the fd; it is close-on-exec, so the container's program never does).
//! - In the runtime, a [`Forwarder`] process forked before libcontainer's clone receives it,
//!   learns the sender's pid from `SCM_CREDENTIALS` (as the runtime sees it), and sends the
//!   state and the fd to the agent. It runs concurrently with libcontainer (which blocks the
//!   runtime until the init is ready, or for `exec` until the process has exec'd), so a
//!   notified syscall the init or the new process makes after the handover (`close`, `read`,
//!   `execve`, ...) waits for the agent instead of deadlocking. If the agent cannot be reached
//!   the forwarder kills the sender, so nothing waits for an answer that cannot come, and the
//!   command fails naming the listener ("failed to connect with seccomp agent").
//!
//! Refused at `create`/`exec`, with a one-line error: `SCMP_ACT_NOTIFY` as the default action,
//! a notify rule for `sendmsg` (the handover uses it: it could never be answered, as runc
//! refuses `write`), a missing, relative or abstract (`@name`) `listenerPath`, and a
//! `listenerPath` that is not a unix socket. Without notify rules `listenerPath` is ignored,
//! as runc does.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, socketpair, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, pipe2, ForkResult, Pid};
use oci_spec::runtime::{
    ContainerProcessStateBuilder, ContainerState, LinuxSeccomp, LinuxSeccompAction, StateBuilder,
    SECCOMP_FD_NAME,
};
use seccompiler::BpfProgram;

use crate::OciError;

/// How long the runtime waits for the forwarder once libcontainer is done.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// Forwarder exit codes.
const FORWARDED: i32 = 0;
const FAILED: i32 = 1;
const NOTHING_RECEIVED: i32 = 2;

/// What a spec's notify rules ask for: the filter and where to send its listener.
#[derive(Debug, Clone)]
pub struct NotifyPlan {
    program: BpfProgram,
    listener: PathBuf,
    metadata: Option<String>,
}

/// The notify plan of a seccomp section, or `None` when it has no notify rules; refuses what
/// cannot work (see the module doc).
pub fn plan(section: Option<&LinuxSeccomp>) -> Result<Option<NotifyPlan>, OciError> {
    let Some(section) = section else {
        return Ok(None);
    };
    let (_, program) = agentrun_runtime::seccomp::compile_with_notify(section)
        .map_err(|e| OciError::Invalid(format!("seccomp: {e}")))?;
    let Some(program) = program else {
        return Ok(None);
    };
    let notifies_sendmsg = section.syscalls().iter().flatten().any(|sc| {
        sc.action() == LinuxSeccompAction::ScmpActNotify
            && sc.names().iter().any(|n| n == "sendmsg")
    });
    if notifies_sendmsg {
        return Err(OciError::Invalid(
            "seccomp: SCMP_ACT_NOTIFY cannot be used for the sendmsg syscall (agentrun hands the notify fd over with it)".into(),
        ));
    }
    let listener = section
        .listener_path()
        .clone()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| {
            OciError::Invalid(
                "seccomp: SCMP_ACT_NOTIFY needs linux.seccomp.listenerPath (the seccomp agent's unix socket)".into(),
            )
        })?;
    if listener.to_string_lossy().starts_with('@') {
        return Err(OciError::Invalid(format!(
            "seccomp: listenerPath {}: abstract unix sockets are not supported, use a path",
            listener.display()
        )));
    }
    if !listener.is_absolute() {
        return Err(OciError::Invalid(format!(
            "seccomp: listenerPath {} is not an absolute path",
            listener.display()
        )));
    }
    match std::fs::metadata(&listener) {
        Ok(m) if m.file_type().is_socket() => {}
        Ok(_) => {
            return Err(OciError::Invalid(format!(
                "seccomp: listenerPath {} is not a unix socket",
                listener.display()
            )))
        }
        Err(e) => {
            return Err(OciError::Invalid(format!(
                "seccomp: failed to connect with seccomp agent at {}: {e}",
                listener.display()
            )))
        }
    }
    Ok(Some(NotifyPlan {
        program,
        listener,
        metadata: section.listener_metadata().clone(),
    }))
}

/// What the container's process does with the plan: install the notify filter and send its
/// listener to the [`Forwarder`]. Carried by the executor into libcontainer's clones.
#[derive(Debug, Clone)]
pub struct Handover {
    program: BpfProgram,
    /// The container's end of the socketpair to the forwarder.
    socket: RawFd,
}

/// Why the notify fd did not reach the runtime or the agent (the container process's and the
/// forwarder's side; the forwarder writes its words to the runtime through a pipe).
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error(transparent)]
    Install(agentrun_runtime::seccomp::SeccompError),
    #[error("handing the seccomp notify fd to the runtime: {0}")]
    HandOver(std::io::Error),
    #[error("SO_PASSCRED: {0}")]
    PassCred(nix::Error),
    #[error("receiving the notify fd: {0}")]
    Receive(nix::Error),
    #[error(transparent)]
    ControlMessages(nix::Error),
    #[error(transparent)]
    State(oci_spec::OciSpecError),
    #[error(transparent)]
    Json(serde_json::Error),
    #[error("failed to connect with seccomp agent at {}: {source}", agent.display())]
    Connect {
        agent: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Timeout(std::io::Error),
    #[error("sending the container state to the seccomp agent at {}: {source}", agent.display())]
    Send { agent: PathBuf, source: nix::Error },
}

impl Handover {
    /// Installs the notify filter on the calling process and sends the listener fd; closes
    /// both fds afterwards. Nothing between the install and the send allocates or makes
    /// another syscall (a notified one could not be answered before the send).
    pub fn run(&self) -> Result<(), NotifyError> {
        // SAFETY: the socket was made by the runtime before libcontainer cloned this process
        // and nothing else in this process owns or closes it.
        let socket = unsafe { OwnedFd::from_raw_fd(self.socket) };
        let listener = agentrun_runtime::seccomp::install_with_listener(&self.program)
            .map_err(NotifyError::Install)?;
        send_fd(&socket, &listener).map_err(NotifyError::HandOver)
    }
}

/// Sends `fd` over `socket` with one byte of data, `SCM_RIGHTS`, from stack buffers only.
fn send_fd(socket: &OwnedFd, fd: &OwnedFd) -> std::io::Result<()> {
    let mut byte = [b'n'];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one cmsghdr with one int, aligned for cmsghdr (CMSG_SPACE(4) is 24 on 64 bits).
    let mut control = [0u64; 4];
    // SAFETY: msghdr is a plain C struct for which all zeroes is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as _;
    // SAFETY: msg_control points to `control`, large enough for one header with one int
    // (checked by the assertion), so CMSG_FIRSTHDR is non-null and CMSG_DATA is in bounds.
    unsafe {
        assert!(msg.msg_controllen as usize <= std::mem::size_of_val(&control));
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd.as_raw_fd());
    }
    // SAFETY: msg and everything it points to (iov, byte, control) live across the call.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The container process state the agent gets, but for the pid (known when the fd arrives).
#[derive(Debug, Clone)]
pub struct StateTemplate {
    pub id: String,
    pub status: ContainerState,
    pub bundle: PathBuf,
    pub annotations: Option<std::collections::HashMap<String, String>>,
}

/// The runtime's side: a forked process that passes the listener fd on to the agent.
#[derive(Debug)]
pub struct Forwarder {
    /// `None` once waited for.
    pid: Option<Pid>,
    /// The container's end, open until libcontainer has cloned.
    container_end: Option<OwnedFd>,
    /// What the forwarder says when it fails.
    errors: OwnedFd,
    listener: PathBuf,
}

impl Forwarder {
    /// [`Forwarder::spawn`] when there is a `plan` (the state it reports made by `state`);
    /// neither a forwarder nor a handover without one.
    pub fn spawn_for(
        plan: Option<&NotifyPlan>,
        state: impl FnOnce() -> StateTemplate,
    ) -> Result<(Option<Self>, Option<Handover>), OciError> {
        match plan {
            Some(plan) => {
                let (f, h) = Self::spawn(plan, state())?;
                Ok((Some(f), Some(h)))
            }
            None => Ok((None, None)),
        }
    }

    /// Forks the forwarder; the [`Handover`] goes to the executor. Call before libcontainer
    /// clones, from a single-threaded process.
    pub fn spawn(plan: &NotifyPlan, state: StateTemplate) -> Result<(Self, Handover), OciError> {
        let threads = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:").map(|n| n.trim().to_owned()))
            });
        if threads.as_deref() != Some("1") {
            return Err(OciError::Invalid(
                "seccomp notify: the runtime must be single-threaded to fork its forwarder".into(),
            ));
        }
        let (runtime_end, container_end) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| OciError::Invalid(format!("seccomp notify: socketpair: {e}")))?;
        let (errors, errors_w) = pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| OciError::Invalid(format!("seccomp notify: pipe: {e}")))?;
        // SAFETY: the process is single-threaded (checked above), so the child may run any
        // code; it only forwards the fd and leaves with _exit.
        match unsafe { fork() } {
            Err(e) => Err(OciError::Invalid(format!("seccomp notify: fork: {e}"))),
            Ok(ForkResult::Child) => {
                drop(container_end);
                drop(errors);
                let code = match forward(runtime_end, plan, &state) {
                    Ok(()) => FORWARDED,
                    Err(None) => NOTHING_RECEIVED,
                    Err(Some(e)) => {
                        // The runtime reads the words; with the pipe gone they go nowhere.
                        let _ = nix::unistd::write(&errors_w, e.to_string().as_bytes());
                        FAILED
                    }
                };
                // SAFETY: _exit ends this forked process without running the parent's exit
                // handlers or destructors twice.
                unsafe { libc::_exit(code) }
            }
            Ok(ForkResult::Parent { child }) => {
                drop(runtime_end);
                drop(errors_w);
                let handover = Handover {
                    program: plan.program.clone(),
                    socket: container_end.as_raw_fd(),
                };
                Ok((
                    Forwarder {
                        pid: Some(child),
                        container_end: Some(container_end),
                        errors,
                        listener: plan.listener.clone(),
                    },
                    handover,
                ))
            }
        }
    }

    /// Waits for the forwarder once libcontainer has returned (`built`: it succeeded). An
    /// error says why the agent did not get the fd; when libcontainer failed, that error (if
    /// any) is the cause of its failure.
    pub fn finish(mut self, built: bool) -> Result<(), OciError> {
        drop(self.container_end.take());
        let status = if built {
            self.wait(FORWARD_TIMEOUT)
        } else {
            // The fd was sent before the failure, or never will be.
            self.wait(Duration::from_millis(200))
        };
        let mut message = Vec::new();
        let mut buf = [0u8; 1024];
        while let Ok(n @ 1..) = nix::unistd::read(self.errors.as_raw_fd(), &mut buf) {
            message.extend_from_slice(&buf[..n]);
        }
        let message = String::from_utf8_lossy(&message);
        match status {
            Some(FORWARDED) => Ok(()),
            Some(FAILED) => Err(OciError::Invalid(format!("seccomp notify: {message}"))),
            _ if !built => Ok(()),
            Some(NOTHING_RECEIVED) => Err(OciError::Invalid(
                "seccomp notify: the container process did not hand over its notify fd".into(),
            )),
            _ => Err(OciError::Invalid(format!(
                "seccomp notify: the seccomp agent at {} did not take the notify fd within {} s",
                self.listener.display(),
                FORWARD_TIMEOUT.as_secs()
            ))),
        }
    }

    /// The forwarder's exit code, killing it after `timeout` (then `None`).
    fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let pid = self.pid.take()?;
        let deadline = Instant::now() + timeout;
        loop {
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => return Some(code),
                Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(WaitStatus::StillAlive) => {
                    // The forwarder may have exited meanwhile; waitpid reaps it either way.
                    let _ = kill(pid, Signal::SIGKILL);
                    let _ = waitpid(pid, None);
                    return None;
                }
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    }
}

impl Drop for Forwarder {
    /// A forwarder never waited for (the command failed before libcontainer ran) is killed
    /// and reaped.
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            // The forwarder may have exited meanwhile; waitpid reaps it either way.
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
        }
    }
}

/// The forwarder's work: receive the listener and the sender's pid, send both with the state
/// to the agent. `Err(None)`: nothing was sent to it (the container process failed first).
fn forward(
    socket: OwnedFd,
    plan: &NotifyPlan,
    state: &StateTemplate,
) -> Result<(), Option<NotifyError>> {
    setsockopt(&socket, sockopt::PassCred, &true).map_err(|e| Some(NotifyError::PassCred(e)))?;
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(RawFd, nix::sys::socket::UnixCredentials);
    let msg = recvmsg::<UnixAddr>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| Some(NotifyError::Receive(e)))?;
    let mut listener_fd = None;
    let mut pid = None;
    for cmsg in msg
        .cmsgs()
        .map_err(|e| Some(NotifyError::ControlMessages(e)))?
    {
        match cmsg {
            ControlMessageOwned::ScmRights(fds) => {
                for fd in fds {
                    // SAFETY: the kernel installed this fd in this process for this message.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    listener_fd.get_or_insert(fd);
                }
            }
            ControlMessageOwned::ScmCredentials(creds) => pid = Some(creds.pid()),
            _ => {}
        }
    }
    let (Some(listener_fd), Some(pid)) = (listener_fd, pid) else {
        return Err(None);
    };
    let result = send_to_agent(plan, state, pid, &listener_fd);
    if result.is_err() {
        // Its notified syscalls could never be answered.
        // It may be gone already; the error above is what the caller hears.
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    result.map_err(Some)
}

/// Connects to the agent and sends the container process state and the listener fd.
fn send_to_agent(
    plan: &NotifyPlan,
    state: &StateTemplate,
    pid: i32,
    listener_fd: &OwnedFd,
) -> Result<(), NotifyError> {
    let container = StateBuilder::default()
        .version(oci_spec::runtime::VERSION)
        .id(state.id.clone())
        .status(state.status)
        .pid(pid)
        .bundle(state.bundle.clone())
        .annotations(state.annotations.clone().unwrap_or_default())
        .build()
        .map_err(NotifyError::State)?;
    let mut process = ContainerProcessStateBuilder::default()
        .version(oci_spec::runtime::VERSION)
        .fds(vec![SECCOMP_FD_NAME.to_owned()])
        .pid(pid)
        .state(container);
    if let Some(m) = &plan.metadata {
        process = process.metadata(m.clone());
    }
    let text = serde_json::to_vec(&process.build().map_err(NotifyError::State)?)
        .map_err(NotifyError::Json)?;
    let agent = UnixStream::connect(&plan.listener).map_err(|source| NotifyError::Connect {
        agent: plan.listener.clone(),
        source,
    })?;
    agent
        .set_write_timeout(Some(FORWARD_TIMEOUT))
        .map_err(NotifyError::Timeout)?;
    let fds = [listener_fd.as_raw_fd()];
    sendmsg::<UnixAddr>(
        agent.as_raw_fd(),
        &[IoSlice::new(&text)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|source| NotifyError::Send {
        agent: plan.listener.clone(),
        source,
    })?;
    Ok(())
}

/// What libcontainer `built`, once `forwarder` (if any) has finished the handover: the result
/// when both succeeded; else what was built, if anything (to undo), and the cause: a failed
/// handover (its forwarder killed the init), else libcontainer's error.
pub fn handed_over<T>(
    built: Result<T, libcontainer::error::LibcontainerError>,
    forwarder: Option<Forwarder>,
) -> Result<T, (Option<T>, OciError)> {
    let forwarded = forwarder.map_or(Ok(()), |f| f.finish(built.is_ok()));
    match (built, forwarded) {
        (Ok(t), Ok(())) => Ok(t),
        (built, Err(e)) => Err((built.ok(), e)),
        (Err(e), Ok(())) => Err((None, e.into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{LinuxSeccompBuilder, LinuxSyscallBuilder};

    fn section(names: &[&str], listener: Option<&str>) -> LinuxSeccomp {
        let mut b = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActAllow)
            .syscalls(vec![LinuxSyscallBuilder::default()
                .names(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .action(LinuxSeccompAction::ScmpActNotify)
                .build()
                .unwrap()]);
        if let Some(l) = listener {
            b = b.listener_path(l);
        }
        b.build().unwrap()
    }

    fn refusal(s: &LinuxSeccomp) -> String {
        plan(Some(s)).unwrap_err().to_string()
    }

    #[test]
    fn no_notify_rules_no_plan() {
        let s = LinuxSeccompBuilder::default()
            .default_action(LinuxSeccompAction::ScmpActAllow)
            .listener_path("/nonexistent")
            .build()
            .unwrap();
        assert!(plan(Some(&s)).unwrap().is_none());
        assert!(plan(None).unwrap().is_none());
    }

    #[test]
    fn what_cannot_work_is_refused_clearly() {
        assert!(refusal(&section(&["mkdir"], None)).contains("listenerPath"));
        assert!(refusal(&section(&["mkdir"], Some(""))).contains("listenerPath"));
        assert!(refusal(&section(&["mkdir"], Some("@agent"))).contains("abstract"));
        assert!(refusal(&section(&["mkdir"], Some("agent.sock"))).contains("absolute"));
        assert!(
            refusal(&section(&["mkdir"], Some("/nonexistent/agent.sock")))
                .contains("failed to connect with seccomp agent")
        );
        assert!(refusal(&section(&["mkdir"], Some("/etc/passwd"))).contains("not a unix socket"));
        assert!(refusal(&section(&["mkdir", "sendmsg"], Some("/x"))).contains("sendmsg"));
    }
}
