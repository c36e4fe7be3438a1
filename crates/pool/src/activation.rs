//! Socket activation: the control socket a service manager bound and passed in (systemd's
//! `sd_listen_fds` protocol: `LISTEN_PID` is our pid, `LISTEN_FDS` counts the fds, the first
//! is fd 3). This module owns reading that protocol and checking what was passed.

use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::socket::{getsockname, getsockopt, sockopt, SockType, UnixAddr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;

use crate::PoolError;

/// The first passed fd (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: RawFd = 3;

/// Takes the listening control socket passed by a service manager, if one was: `None` when
/// `LISTEN_FDS`/`LISTEN_PID` are unset or meant for another process. Errors when the passed
/// fd is not a listening `SOCK_SEQPACKET` unix socket (e.g. a `.socket` unit with
/// `ListenStream=`) or more than one fd was passed. Clears the variables so that nothing we
/// start sees them. Must be called while single-threaded (it edits the environment).
pub fn take_listener() -> Result<Option<OwnedFd>, PoolError> {
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_FDNAMES");
    let (Some(pid), Some(fds)) = (pid, fds) else {
        return Ok(None);
    };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    let n: u32 = fds
        .trim()
        .parse()
        .map_err(|_| PoolError::Invalid(format!("LISTEN_FDS={fds}: not a number")))?;
    match n {
        0 => return Ok(None),
        1 => {}
        _ => {
            return Err(PoolError::Invalid(format!(
                "LISTEN_FDS={n}: agentrun serve takes one socket (the control socket)"
            )))
        }
    }
    // Without this check a wrong fd 3 would be owned and closed by us.
    fcntl(LISTEN_FDS_START, FcntlArg::F_GETFD)
        .map_err(|e| PoolError::Invalid(format!("LISTEN_FDS=1 but fd 3 is not open ({e})")))?;
    // SAFETY: fd 3 is open (checked above) and was handed to this process by the protocol;
    // nothing else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(LISTEN_FDS_START) };
    let ty = getsockopt(&fd.as_fd(), sockopt::SockType);
    let listening = getsockopt(&fd.as_fd(), sockopt::AcceptConn);
    if !matches!(ty, Ok(SockType::SeqPacket)) || !matches!(listening, Ok(true)) {
        return Err(PoolError::Invalid(
            "the socket passed in fd 3 (LISTEN_FDS) is not a listening SOCK_SEQPACKET socket: \
             use ListenSequentialPacket= in the .socket unit"
                .into(),
        ));
    }
    fcntl(LISTEN_FDS_START, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
        .map_err(|e| PoolError::Sys("fcntl FD_CLOEXEC on fd 3", e))?;
    root_only(&fd)?;
    Ok(Some(fd))
}

/// The control socket is root-only whoever bound it: a `.socket` unit's default `SocketMode=`
/// is 0666, `systemd-socket-activate` leaves the umask's mode. Chmods its path to 0600 (an
/// abstract or unnamed socket has no path and nothing to chmod).
fn root_only(fd: &OwnedFd) -> Result<(), PoolError> {
    let addr: UnixAddr =
        getsockname(fd.as_raw_fd()).map_err(|e| PoolError::Sys("getsockname on fd 3", e))?;
    if let Some(path) = addr.path() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| PoolError::Io("chmod the socket-activated socket", e))?;
    }
    Ok(())
}
