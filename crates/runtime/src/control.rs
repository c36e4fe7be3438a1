//! The control channel between the host and a pooled sandbox's init, and fd passing.
//!
//! A pooled sandbox's init holds one end of a `SOCK_SEQPACKET` socketpair (fd 3 in the
//! container, [`INIT_CONTROL_FD`]). A run is one [`InitRequest`] message carrying the
//! command's stdin/stdout/stderr as `SCM_RIGHTS`, so output goes straight to the client's fds
//! with no copy through agentrun. The init answers with one [`InitResult`] when the command
//! has exited, then exits itself. Message boundaries come from SEQPACKET; payloads are JSON.
//!
//! A long-lived sandbox (see `agentrun_pool::live`) speaks the persistent dialect instead: its
//! first message is a [`LiveRequest`] (tagged with `op`), and from then on the init serves
//! any number of them: [`LiveRequest::Spawn`] starts a process (stdio fds attached) in its own
//! process group and is answered by [`LiveEvent::Started`] or [`LiveEvent::Failed`];
//! [`LiveRequest::Signal`] signals a process group, [`LiveRequest::SignalAll`] every process
//! but the init; every process's exit is reported as
//! [`LiveEvent::Exited`] tagged with the id the host gave it. The init stays until the host
//! closes the channel (or kills it).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;

/// The control fd's number inside the sandbox (libcontainer preserves fds 3..3+n).
pub const INIT_CONTROL_FD: RawFd = 3;
/// Largest message accepted (argv + env of a run).
pub const MAX_MESSAGE: usize = 1 << 20;
/// Most fds one message may carry.
const MAX_FDS: usize = 8;

/// A command for a pooled sandbox's init. The fds (stdin, stdout, stderr) travel alongside.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct InitRequest {
    pub argv: Vec<String>,
    /// The whole environment, `KEY=VALUE`.
    pub env: Vec<String>,
    pub cwd: String,
}

/// A request to a long-lived sandbox's init (the persistent dialect, see the module doc).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum LiveRequest {
    /// Start a process; its stdin, stdout and stderr travel alongside (3 fds).
    Spawn(SpawnRequest),
    /// Send `signal` to process `id`'s process group (`group`) or to the process alone.
    Signal { id: u64, signal: i32, group: bool },
    /// Send `signal` to every process in the sandbox but the init (`kill(-1)` from PID 1 of
    /// its pid namespace): what a container's stop needs, its filesystem staying for a restart.
    SignalAll { signal: i32 },
}

/// One process for a long-lived sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SpawnRequest {
    /// Chosen by the host; every event about this process carries it.
    pub id: u64,
    pub argv: Vec<String>,
    /// The whole environment, `KEY=VALUE`.
    pub env: Vec<String>,
    pub cwd: String,
    /// Start it in a new session (`setsid`) rather than only a new process group: the hook a
    /// terminal (`tty`) process needs, whose stdio is a pty slave it then takes as its
    /// controlling terminal (TIOCSCTTY, still to do: the host would pass the slave fd).
    #[serde(default)]
    pub new_session: bool,
    /// Run it as this user: a Docker `User` spec (`uid[:gid]`, `name[:group]`) the init
    /// resolves against the sandbox's own /etc/passwd and /etc/group. `None`: the init's user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// What a long-lived sandbox's init reports.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum LiveEvent {
    /// The process runs, with this pid (in the sandbox's pid namespace).
    Started { id: u64, pid: i32 },
    /// It could not start: the code a shell would give (127 not found, 126 not executable,
    /// 125 bad working directory) and why.
    Failed {
        id: u64,
        exit_code: i32,
        message: String,
    },
    /// It has exited.
    Exited { id: u64, result: InitResult },
}

/// What the init reports once the command has exited.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct InitResult {
    /// Exit code, or 128+N for signal N.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub usage: ResourceUsage,
}

/// CPU time and peak RSS of a command and the children it waited for (`getrusage`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResourceUsage {
    pub user_us: u64,
    pub system_us: u64,
    pub max_rss_kb: u64,
}

impl From<&libc::rusage> for ResourceUsage {
    fn from(r: &libc::rusage) -> Self {
        let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
        ResourceUsage {
            user_us: us(r.ru_utime),
            system_us: us(r.ru_stime),
            max_rss_kb: r.ru_maxrss as u64,
        }
    }
}

/// A connected SEQPACKET pair (close-on-exec).
pub fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), RuntimeError> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| RuntimeError::sys("socketpair", e))
}

/// Sends one message with `fds` attached.
pub fn send(sock: BorrowedFd<'_>, payload: &[u8], fds: &[RawFd]) -> Result<(), RuntimeError> {
    let iov = [std::io::IoSlice::new(payload)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => return Ok(()),
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(RuntimeError::sys("sendmsg", e)),
        }
    }
}

/// Sends a value as JSON.
pub fn send_json<T: Serialize>(
    sock: BorrowedFd<'_>,
    value: &T,
    fds: &[RawFd],
) -> Result<(), RuntimeError> {
    let bytes = serde_json::to_vec(value).expect("protocol types serialize");
    send(sock, &bytes, fds)
}

/// A received message: its bytes and the fds that came with it.
pub type Message = (Vec<u8>, Vec<OwnedFd>);

/// The size of the next message (blocking until there is one; 0 at EOF), which stays queued.
fn next_size(sock: BorrowedFd<'_>) -> Result<usize, RuntimeError> {
    loop {
        // MSG_TRUNC: the real length of the datagram, not what fitted (nothing here).
        match nix::sys::socket::recv(
            sock.as_raw_fd(),
            &mut [],
            MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC,
        ) {
            Ok(n) => return Ok(n),
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(RuntimeError::sys("recv", e)),
        }
    }
}

/// Receives one message; `None` at EOF. Attached fds come back owned (close-on-exec).
pub fn recv(sock: BorrowedFd<'_>) -> Result<Option<Message>, RuntimeError> {
    // A buffer of the message's size: most are a few hundred bytes, and zeroing the largest
    // allowed (1 MiB) for each one cost more than the rest of the receive.
    let size = next_size(sock)?;
    let mut buf = vec![0u8; size.clamp(1, MAX_MESSAGE)];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    loop {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(RuntimeError::sys("recvmsg", e)),
        };
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(|e| RuntimeError::sys("recvmsg", e))? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these fds for us; nobody else owns them.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        let n = msg.bytes;
        if n == 0 && fds.is_empty() {
            return Ok(None);
        }
        if msg.flags.contains(MsgFlags::MSG_TRUNC) {
            return Err(RuntimeError::InvalidInput(
                "control message too large".into(),
            ));
        }
        buf.truncate(n);
        return Ok(Some((buf, fds)));
    }
}

/// Receives one JSON message; `None` at EOF.
pub fn recv_json<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
) -> Result<Option<(T, Vec<OwnedFd>)>, RuntimeError> {
    match recv(sock)? {
        None => Ok(None),
        Some((bytes, fds)) => {
            let v = serde_json::from_slice(&bytes)
                .map_err(|e| RuntimeError::InvalidInput(format!("bad control message: {e}")))?;
            Ok(Some((v, fds)))
        }
    }
}

/// Waits until `fd` is readable (or hung up); false on timeout.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> Result<bool, RuntimeError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let t = match timeout {
        Some(d) => PollTimeout::try_from(d.as_millis().min(i32::MAX as u128) as i32)
            .unwrap_or(PollTimeout::MAX),
        None => PollTimeout::NONE,
    };
    loop {
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, t) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(RuntimeError::sys("poll", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn the_two_dialects_are_told_apart_by_op() {
        let one_shot = serde_json::to_value(InitRequest {
            argv: vec!["true".into()],
            env: vec![],
            cwd: "/".into(),
        })
        .unwrap();
        assert!(one_shot.get("op").is_none(), "{one_shot}");
        let live = LiveRequest::Spawn(SpawnRequest {
            id: 7,
            argv: vec!["sh".into()],
            env: vec!["A=1".into()],
            cwd: "/tmp".into(),
            new_session: false,
            user: None,
        });
        let v = serde_json::to_value(&live).unwrap();
        assert_eq!(v["op"], "spawn");
        assert_eq!(serde_json::from_value::<LiveRequest>(v).unwrap(), live);
        let sig: LiveRequest =
            serde_json::from_str(r#"{"op":"signal","id":7,"signal":9,"group":true}"#).unwrap();
        assert_eq!(
            sig,
            LiveRequest::Signal {
                id: 7,
                signal: 9,
                group: true
            }
        );
        let all: LiveRequest = serde_json::from_str(r#"{"op":"signal_all","signal":9}"#).unwrap();
        assert_eq!(all, LiveRequest::SignalAll { signal: 9 });
        let ev = LiveEvent::Exited {
            id: 7,
            result: InitResult {
                exit_code: 137,
                signal: Some(9),
                usage: ResourceUsage::default(),
            },
        };
        let back: LiveEvent = serde_json::from_str(&serde_json::to_string(&ev).unwrap()).unwrap();
        assert_eq!(back, ev);
    }

    #[test]
    fn request_and_fds_round_trip() {
        let (a, b) = seqpacket_pair().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        let req = InitRequest {
            argv: vec!["echo".into(), "hi".into()],
            env: vec!["A=1".into()],
            cwd: "/workspace".into(),
        };
        send_json(a.as_fd(), &req, &[w.as_raw_fd()]).unwrap();
        drop(w);
        let (got, fds): (InitRequest, _) = recv_json(b.as_fd()).unwrap().unwrap();
        assert_eq!(got, req);
        assert_eq!(fds.len(), 1);
        nix::unistd::write(&fds[0], b"x").unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(nix::unistd::read(r.as_raw_fd(), &mut buf).unwrap(), 1);
        drop(a);
        assert!(
            recv(b.as_fd()).unwrap().is_none(),
            "EOF after the peer closed"
        );
    }

    #[test]
    fn messages_of_every_size_come_back_whole() {
        let (a, b) = seqpacket_pair().unwrap();
        // (The socket's send buffer, not MAX_MESSAGE, bounds what can be sent: ~200 KiB.)
        for n in [1, 300, 4096, 150 * 1024] {
            let payload: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            send(a.as_fd(), &payload, &[]).unwrap();
            let (got, fds) = recv(b.as_fd()).unwrap().unwrap();
            assert_eq!(got.len(), n);
            assert!(got == payload, "a message of {n} bytes came back changed");
            assert!(fds.is_empty());
        }
    }
}
