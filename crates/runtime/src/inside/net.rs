//! Networking inside the sandbox: its own network namespace with only loopback, up.
//!
//! The namespace is created by libcontainer (`linux.namespaces: network`) inside the shell's
//! user namespace; it has no interface but `lo`, so nothing outside is reachable. `lo` starts
//! down; the shell's init brings it up so programs can talk to themselves on 127.0.0.1.
//!
//! With a network allowlist, [`EgressBridge`] is the only way out: the run's cell listens on
//! `127.0.0.1:<port>` inside the namespace and relays every connection to the egress proxy's
//! unix socket, whose directory is bind-mounted read-only from the host into every shell. The
//! relay runs in the cell's PID 1, as confined as the command (Landlock, seccomp, no
//! capability it lacks), never in the shell's privileged init, and dies with the cell. The
//! proxy decides; the bridge only carries bytes. Nothing else has a route: direct connections
//! to any address fail with ENETUNREACH, DNS included, and raw sockets need CAP_NET_RAW, which
//! the command lacks.

use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

/// A loopback port inside the sandbox bridged to the egress proxy's socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressBridge {
    pub port: u16,
    /// The proxy's socket, as seen inside the sandbox.
    pub socket: PathBuf,
}

impl EgressBridge {
    /// Listens on `127.0.0.1:port` and relays connections on background threads.
    pub fn start(&self) -> io::Result<()> {
        let listener = TcpListener::bind(("127.0.0.1", self.port))?;
        relay_thread(listener, self.socket.clone())?;
        Ok(())
    }

    /// Listens on `127.0.0.1:port` now, in a single-threaded cell PID 1 whose signals are all
    /// blocked, and starts the relay's thread only when a connection comes: the listener
    /// raises [`wake_signal`] in this process (`O_ASYNC`, `F_SETOWN`, `F_SETSIG`), which its
    /// wait loop hands to [`woken`]. Most runs never connect, and a thread started and torn
    /// down in every cell was most of the CPU a network policy added to a run (issue 30). A
    /// connection made meanwhile waits in the listener's backlog.
    pub(crate) fn listen_lazily(&self) -> io::Result<()> {
        let listener = TcpListener::bind(("127.0.0.1", self.port))?;
        let fd = listener.as_raw_fd();
        // SAFETY: fcntl(2) on the listener we own: signals of its readiness go to this
        // process (the cell's PID 1), as the real-time signal `wake_signal`.
        let set = unsafe {
            libc::fcntl(fd, libc::F_SETOWN, libc::getpid()) == 0
                && libc::fcntl(fd, F_SETSIG, wake_signal()) == 0
        };
        if !set {
            return Err(io::Error::last_os_error());
        }
        set_async(fd, true)?;
        *PENDING.lock().unwrap_or_else(|p| p.into_inner()) = Some((listener, self.socket.clone()));
        Ok(())
    }
}

/// `fcntl(F_SETSIG)` (not in the libc crate for every target; the same number on the
/// architectures agentrun builds for).
const F_SETSIG: libc::c_int = 10;
/// `si_code` of a signal the kernel raises for input readiness (`POLL_IN`).
const POLL_IN: libc::c_int = 1;

/// The signal a lazily started bridge's listener raises in its cell's PID 1 when a
/// connection is pending ([`EgressBridge::listen_lazily`]).
pub(crate) fn wake_signal() -> libc::c_int {
    libc::SIGRTMIN() + 6
}

/// A bridge listening whose relay thread is not started yet.
static PENDING: std::sync::Mutex<Option<(TcpListener, PathBuf)>> = std::sync::Mutex::new(None);

/// Whether signal `signo` with `si_code` `code` is a lazily started bridge's wake-up (the
/// kernel's, not a process's: those are forwarded as any signal); the first starts its relay
/// thread, which accepts from then on.
pub(crate) fn woken(signo: libc::c_int, code: libc::c_int) -> bool {
    if signo != wake_signal() || code != POLL_IN {
        return false;
    }
    let pending = PENDING.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some((listener, socket)) = pending {
        // The thread accepts from now on: no more signals. Should it fail to start, the
        // connections are refused (closed) with the listener, as when a relay thread fails.
        let _ = set_async(listener.as_raw_fd(), false);
        let _ = relay_thread(listener, socket);
    }
    true
}

fn set_async(fd: std::os::fd::RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl(2) F_GETFL/F_SETFL on an fd the caller owns.
    let ok = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        let flags = if on {
            flags | libc::O_ASYNC
        } else {
            flags & !libc::O_ASYNC
        };
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags) == 0
    };
    if ok {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Accepts on `listener` and relays each connection to `socket` on a thread of its own.
fn relay_thread(listener: TcpListener, socket: PathBuf) -> io::Result<()> {
    std::thread::Builder::new()
        .name("egress-bridge".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let socket = socket.clone();
                // Dropped: no thread means this one connection is refused (closed); the relay goes on
                // accepting.
                let _ = std::thread::Builder::new().spawn(move || {
                    if let Ok(up) = UnixStream::connect(&socket) {
                        // Dropped: the connection ended (either side closed or failed); nothing to report to.
                        let _ = agentrun_egress::relay(conn, up);
                    }
                });
            }
        })?;
    Ok(())
}

/// Sets IFF_UP on `lo` in the current network namespace (needs CAP_NET_ADMIN there).
pub fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket(2); the fd is owned right below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags of the named interface into ifr.
    if unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCGIFFLAGS as libc::Ioctl,
            &mut ifr,
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: ifru_flags is the active union member after SIOCGIFFLAGS.
    unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: SIOCSIFFLAGS with the ifreq filled above.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as libc::Ioctl, &ifr) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
