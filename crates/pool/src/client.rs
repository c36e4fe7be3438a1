//! The CLI's side of the daemon protocol.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;

use agentrun_runtime::control;
use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};

use crate::protocol::{ClientMessage, DaemonReply, Snapshot};
use crate::PoolError;

/// A connection to `agentrun serve`.
pub struct DaemonClient {
    sock: OwnedFd,
}

impl DaemonClient {
    /// Connects if a daemon answers on `path`.
    pub fn connect(path: &Path) -> Option<Self> {
        let sock = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .ok()?;
        let addr = UnixAddr::new(path).ok()?;
        connect(sock.as_raw_fd(), &addr).ok()?;
        Some(DaemonClient { sock })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    pub fn send(&self, msg: &ClientMessage, fds: &[RawFd]) -> Result<(), PoolError> {
        Ok(control::send_json(self.sock.as_fd(), msg, fds)?)
    }

    /// The daemon's answer; an error if it hung up.
    pub fn recv(&self) -> Result<DaemonReply, PoolError> {
        control::recv_json::<DaemonReply>(self.sock.as_fd())?
            .map(|(r, _)| r)
            .ok_or_else(|| PoolError::Factory("the daemon closed the connection".into()))
    }

    /// One request, one answer.
    pub fn call(&self, msg: &ClientMessage) -> Result<DaemonReply, PoolError> {
        self.send(msg, &[])?;
        self.recv()
    }

    /// The daemon's live picture (the connection serves this one request).
    pub fn top(self) -> Result<Snapshot, PoolError> {
        match self.call(&ClientMessage::Top)? {
            DaemonReply::Top(s) => Ok(*s),
            other => Err(unexpected(other)),
        }
    }

    /// Kills a running command ([`crate::protocol::RunningCommand::id`]; the connection
    /// serves this one request).
    pub fn kill(self, id: &str) -> Result<(), PoolError> {
        match self.call(&ClientMessage::Kill { id: id.to_owned() })? {
            DaemonReply::Ok => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

impl DaemonClient {
    /// Takes a snapshot of live sandbox `sandbox` (the connection serves this one request).
    pub fn snapshot(
        self,
        sandbox: &str,
        name: Option<String>,
        max_bytes: Option<u64>,
    ) -> Result<agentrun_image::Snapshot, PoolError> {
        let msg = ClientMessage::Snapshot {
            sandbox: sandbox.to_owned(),
            name,
            max_bytes,
        };
        match self.call(&msg)? {
            DaemonReply::Snapshot(s) => Ok(*s),
            other => Err(unexpected(other)),
        }
    }
}

/// An answer the request does not take: the daemon's error, or a daemon of another version.
fn unexpected(reply: DaemonReply) -> PoolError {
    match reply {
        DaemonReply::Error { message } => PoolError::Invalid(message),
        other => PoolError::Factory(format!("unexpected answer from the daemon: {other:?}")),
    }
}
