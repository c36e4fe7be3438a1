//! Networking inside the sandbox: its own network namespace with only loopback, up.
//!
//! The namespace is created by libcontainer (`linux.namespaces: network`) inside the sandbox's
//! user namespace; it has no interface but `lo`, so nothing outside is reachable. `lo` starts
//! down; the executor brings it up so programs can talk to themselves on 127.0.0.1.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

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
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: ifru_flags is the active union member after SIOCGIFFLAGS.
    unsafe { ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short };
    // SAFETY: SIOCSIFFLAGS with the ifreq filled above.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
