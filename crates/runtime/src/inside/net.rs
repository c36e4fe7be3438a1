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
        let socket = self.socket.clone();
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
