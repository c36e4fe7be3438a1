//! The inside wing: code that runs inside a sandbox, in processes agentrun forks or
//! libcontainer starts: the container init ([`executor`]), a shell's init ([`shell`]), the
//! cell it makes per run ([`cell`]), a cell's PID 1 ([`reaper`]), the Python zygote
//! ([`zygote`]), and the pieces they share (spawning, users, loopback networking).

pub mod cell;
pub(crate) mod executor;
pub(crate) mod kernel;
pub(crate) mod live;
pub(crate) mod net;
pub(crate) mod reaper;
pub(crate) mod shell;
pub(crate) mod spawn;
pub(crate) mod user;
pub mod zygote;

/// close_range(2) with no flags, through the raw syscall: glibc's wrapper is not in every libc
/// (musl has none). Async-signal-safe, so a forked child may call it. Errors (ENOSYS before
/// Linux 5.9) are ignored, as the callers did with glibc's wrapper.
///
/// # Safety
/// No fd in `first..=last` may be in use afterwards (IO safety: an `OwnedFd` there would dangle).
pub(crate) unsafe fn close_range(first: u32, last: u32) {
    // SAFETY: close_range only closes fds; the caller vouches that none in the range is used.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) };
}
