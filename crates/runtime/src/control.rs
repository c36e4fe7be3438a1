//! The control channels between the host and a shell's init, a cell's PID 1, and fd passing.
//!
//! A shell's init holds one end of a `SOCK_SEQPACKET` socketpair (fd 3 in the container,
//! [`INIT_CONTROL_FD`]), on which the host sends [`ShellRequest`]s. A pooled shell is asked to
//! [`ShellRequest::Prepare`] a spare cell whenever it goes back to its pool, so that the next
//! run finds its cell's root built. Every run is a cell: the host sends one [`CellRequest`]
//! ([`ShellRequest::Cell`]) with the cell's fds attached (`SCM_RIGHTS`, in [`CellRequest::fd_order`]): the host end's peer of a
//! fresh channel for the cell, then (for a command) its stdin, stdout and stderr, then one
//! detached mount per [`CellMount`]. The init answers [`ShellEvent::Started`] with a pidfd of
//! the cell's PID 1 attached (or [`ShellEvent::Failed`]) and, once that PID 1 has exited and
//! been reaped (its namespaces torn down), [`ShellEvent::Ended`]. Output goes straight to the
//! fds the host passed, with no copy through agentrun. Message boundaries come from
//! SEQPACKET; payloads are JSON.
//!
//! The cell's own channel carries what the cell's PID 1 says: for a command
//! ([`CellWork::Run`]), one [`InitResult`] once the command has exited, written before the cell
//! is torn down; the PID 1 then waits (bounded) until the host closes its end and exits, which
//! kills whatever else runs in the cell. A long-lived cell ([`CellWork::Live`]) speaks the
//! persistent dialect instead: the host sends [`LiveRequest`]s (tagged with `op`) and the PID 1
//! serves any number of them: [`LiveRequest::Spawn`] starts a process (stdio fds attached) in
//! its own process group and is answered by [`LiveEvent::Started`] or [`LiveEvent::Failed`];
//! [`LiveRequest::Signal`] signals a process group, [`LiveRequest::SignalAll`] every process
//! but the cell's PID 1; every process's exit is reported as [`LiveEvent::Exited`] tagged with
//! the id the host gave it. The cell stays until the host closes the channel (or kills it).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;

/// The control fd's number in the shell (libcontainer preserves fds 3..3+n).
pub const INIT_CONTROL_FD: RawFd = 3;
/// Largest message accepted (argv + env of a run).
pub const MAX_MESSAGE: usize = 1 << 20;
/// Most fds one message may carry.
pub const MAX_FDS: usize = 32;

/// What the host asks of a shell's init.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ShellRequest {
    /// Make a cell for a run (see the module doc for the fds that come with it).
    Cell(CellRequest),
    /// Have a spare cell ready for the next run, its root built with a writable layer of
    /// `tmpfs_bytes` (no answer; a request of another size gets a cell made for it then).
    /// `zygote_ahead`: the shell's Python zygote (if it has one, ready) forks the next run's
    /// process into the spare now, off the run's path (the host asks when the shell's last
    /// run was forked: a run that is exec'd instead wastes that fork).
    /// `start_zygote`: the shell starts its Python zygote now (if its profile has one and it
    /// is not started yet). The pool asks it of the shells it makes for its target, and of a
    /// shell made on demand (a pool miss, which then stays in the pool) only once one of its
    /// runs asked for the zygote: a shell grown by a burst of other commands never pays the
    /// preload list's imports (~1 s of CPU for numpy, pandas and matplotlib).
    Prepare {
        tmpfs_bytes: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        zygote_ahead: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        start_zygote: bool,
    },
}

/// One cell for a shell's init to make (see the module doc for the fds that come with it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CellRequest {
    /// Chosen by the host; the shell's events about this cell carry it.
    pub cell: u64,
    /// Size cap of the cell's writable layer (a tmpfs), bytes.
    pub tmpfs_bytes: u64,
    /// RLIMIT_NOFILE and RLIMIT_NPROC of everything in the cell.
    pub limits: crate::confine::limits::Rlimits,
    /// Limits set as rlimits because no cgroup enforces them (a rootless sandbox).
    #[serde(default)]
    pub rlimits: Box<crate::confine::limits::RlimitFallback>,
    /// Landlock rules of the cell (`None`: the host has no Landlock).
    pub landlock: Option<PathRules>,
    /// The run's own mounts, attached in this order (an fd each, made on the host).
    pub mounts: Vec<CellMount>,
    /// Relay `127.0.0.1:<port>` inside the cell to the egress proxy's socket in the shell.
    pub egress_port: Option<u16>,
    pub work: CellWork,
    /// Read-only layers put over the shell's root in the cell's overlay (a fork copy's: the
    /// frozen writable layer of the sandbox it was forked from), top first: detached mounts
    /// made on the host, an fd each after the mounts' fds. A cell with layers is cloned for
    /// its request (a spare's overlay is built before any request).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub layers: usize,
    /// Send the cell's writable layer (its overlay's upper directory, `O_PATH`) as the
    /// first message on the cell's channel ([`CellUpper`]): what a rootless host reads a
    /// snapshot or a build step from (it may not open `/proc/<pid>/fd` of the cell's
    /// non-dumpable PID 1, whose memory was never exec'd in the sandbox's user namespace).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub send_upper: bool,
}

/// The first message of a cell asked to [`CellRequest::send_upper`]: its upper directory's
/// fd comes with it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellUpper {
    pub upper: bool,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl CellRequest {
    /// How many fds come before the mounts' (the channel; stdio for a command).
    pub fn fixed_fds(&self) -> usize {
        match self.work {
            CellWork::Run(_) => 4,
            CellWork::Live => 1,
        }
    }

    /// The fd order the init expects, as a description (for messages).
    pub fn fd_order(&self) -> &'static str {
        match self.work {
            CellWork::Run(_) => "channel, stdin, stdout, stderr, mounts..., layers...",
            CellWork::Live => "channel, mounts..., layers...",
        }
    }
}

/// Paths a cell may read (and execute) and write, enforced with Landlock.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PathRules {
    pub readable: Vec<PathBuf>,
    pub writable: Vec<PathBuf>,
}

/// A mount of the run (workspace, `--ro`/`--rw`): made and idmapped on the host, attached in
/// the cell with `move_mount` at `target` (created inside the cell's root when missing).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CellMount {
    pub target: PathBuf,
    /// The source is a directory (else a file: the target is made a file).
    pub directory: bool,
}

/// What a cell is for (externally tagged: an internally tagged enum makes serde buffer the
/// whole value first, which showed in a cell's CPU profile).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CellWork {
    /// One command; its result is the cell's only message.
    Run(CellCommand),
    /// A long-lived cell serving the persistent dialect on its channel.
    Live,
}

/// The command of a [`CellWork::Run`] cell.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CellCommand {
    pub argv: Vec<String>,
    /// The whole environment, `KEY=VALUE`.
    pub env: Vec<String>,
    pub cwd: String,
    /// Run it through the shell's Python zygote if it can take it (see [`crate::inside::zygote`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zygote: bool,
}

/// What a shell's init reports about its cells.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum ShellEvent {
    /// The cell exists: `pid` is its PID 1 in the shell's pid namespace; a pidfd of it comes
    /// with this message.
    Started { cell: u64, pid: i32 },
    /// The cell could not be made (before anything of the run ran).
    Failed { cell: u64, message: String },
    /// The cell's PID 1 has exited and was reaped: the cell is gone. `code` is its exit code
    /// (128+N for signal N). `changed`: what of the shell is not as it was when the shell
    /// started (its hostname, network interfaces, addresses, routes), if anything: the shell
    /// is in doubt.
    Ended {
        cell: u64,
        code: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        changed: Option<String>,
    },
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

/// What a cell's PID 1 reports once the command has exited (or why it could not run it).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct InitResult {
    /// Exit code, or 128+N for signal N.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub usage: ResourceUsage,
    /// The cell could not be set up around the command (exit code 125): why, in one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A run that asked for the shell's Python zygote: whether the zygote forked it
    /// (`None`: it did not ask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zygote: Option<bool>,
    /// Why the zygote did not run it (it was exec'd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zygote_fallback: Option<String>,
    /// The run took the child the zygote forked into its cell before it came (the fork was
    /// off its path; see `Prepare`'s `zygote_ahead`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zygote_ahead: bool,
    /// The zygote failed (gone, silent, its child failing): the shell is replaced.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zygote_fault: bool,
    /// The zygote could have forked the run but the shell has not started it (a shell made
    /// on demand starts it only once a run asks: the host then asks for it with the shell's
    /// next spare, see `Prepare`'s `start_zygote`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zygote_not_started: bool,
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
        let cell = CellRequest {
            cell: 1,
            tmpfs_bytes: 1 << 20,
            limits: crate::confine::limits::Rlimits {
                nofile: 1024,
                nproc: 64,
            },
            rlimits: Default::default(),
            landlock: None,
            mounts: vec![],
            egress_port: None,
            work: CellWork::Run(CellCommand {
                argv: vec!["true".into()],
                env: vec![],
                cwd: "/".into(),
                zygote: true,
            }),
            layers: 0,
            send_upper: false,
        };
        let v = serde_json::to_value(&cell).unwrap();
        assert!(v.get("op").is_none(), "{v}");
        assert_eq!(serde_json::from_value::<CellRequest>(v).unwrap(), cell);
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
                error: None,
                zygote: Some(false),
                zygote_fallback: Some("interpreter option -I".into()),
                zygote_fault: false,
                zygote_ahead: false,
                zygote_not_started: true,
            },
        };
        let back: LiveEvent = serde_json::from_str(&serde_json::to_string(&ev).unwrap()).unwrap();
        assert_eq!(back, ev);
    }

    #[test]
    fn request_and_fds_round_trip() {
        let (a, b) = seqpacket_pair().unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        let req = ShellEvent::Started { cell: 3, pid: 42 };
        send_json(a.as_fd(), &req, &[w.as_raw_fd()]).unwrap();
        drop(w);
        let (got, fds): (ShellEvent, _) = recv_json(b.as_fd()).unwrap().unwrap();
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
