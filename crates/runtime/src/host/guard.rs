//! A cold run's guard (`agentrun exec` building its own shell): what a SIGKILL of the run's
//! process would otherwise leave on the host until the next run or `agentrun gc`.
//!
//! - Its mounts (the writable layer's tmpfs, the idmapped image layers, the overlay rootfs,
//!   the staged binds) are made in a mount namespace of the run's own: [`Guard::start`]
//!   unshares it and makes every mount in it a slave of the host's, so nothing propagates out.
//!   The shell's container is cloned from this process and sees them; the host's mount table
//!   never has them. No other process is in that namespace, so when the run's process dies
//!   (and its shell, which dies with it) the kernel drops it and every mount in it.
//! - A janitor, forked before that (so in the host's mount namespace), in a session of its
//!   own (a terminal's Ctrl-C, or a signal to the run's process group, stops the run, not its
//!   cleanup), holding nothing of the run's but a pipe whose write end only the run's
//!   processes hold and a pidfd of the run's process. When the pipe closes (the run ended,
//!   however), it waits for the run's process to be gone, collects the sandboxes that process
//!   owned ([`gc::collect_owned_by`]: processes, cgroups, libcontainer's container dir, state
//!   dir) and exits. After a normal run the run destroyed its sandbox itself: nothing to do.
//!
//! Both are best effort: a host that refuses the namespace keeps the mounts in the host's
//! table as before, and what a janitor that could not be forked (or was killed too) did not
//! collect is collected by the next run or `agentrun gc`, as before.

use std::io::Read;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::mount::MsFlags;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{sigprocmask, SigSet, SigmaskHow};
use nix::unistd::{fork, setsid, ForkResult, Pid};

use crate::error::RuntimeError;
use crate::host::gc;
use crate::sandbox::RuntimePaths;

/// How long the janitor waits for the run's process to be gone once the pipe closed (it is
/// exiting then: the pipe closes when its last fd does).
const RUN_EXIT_WAIT: Duration = Duration::from_secs(10);

/// What [`Guard::start`] set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guard {
    /// A janitor watches this process.
    pub janitor: bool,
    /// This process's mounts are in a mount namespace of its own.
    pub private_mounts: bool,
}

impl Guard {
    /// Forks the janitor, then moves this process into a mount namespace of its own. Call it
    /// while the process is single-threaded (the janitor is a fork that goes on running Rust
    /// code), before the sandbox is created, once per process.
    pub fn start(paths: &RuntimePaths) -> Guard {
        let janitor = spawn_janitor(paths).is_ok();
        let private_mounts = private_mount_namespace().is_ok();
        Guard {
            janitor,
            private_mounts,
        }
    }
}

/// `unshare(CLONE_NEWNS)`, then every mount a slave of the host's (`mount --make-rslave /`):
/// the host's later mounts still show here, nothing made here shows on the host.
fn private_mount_namespace() -> Result<(), RuntimeError> {
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| RuntimeError::sys("unshare(CLONE_NEWNS)", e))?;
    crate::mounts::remount("/", MsFlags::MS_REC | MsFlags::MS_SLAVE)
        .map_err(|e| RuntimeError::sys("make the run's mounts slaves of the host's", e))
}

fn spawn_janitor(paths: &RuntimePaths) -> Result<(), RuntimeError> {
    let run = std::process::id();
    let pidfd = crate::sandbox::pidfd_open(Pid::from_raw(run as i32)).ok();
    let (rx, tx) = crate::sandbox::cloexec_pipe()?;
    // SAFETY: fork; the caller is single-threaded (Guard::start's contract), so the child is a
    // whole copy of this process and may run any code.
    match unsafe { fork() }.map_err(|e| RuntimeError::sys("fork the run's janitor", e))? {
        ForkResult::Child => {
            drop(tx);
            // Whatever happens in it, the janitor never returns into the run's code (it would
            // go on running the run's command as a second copy).
            // Dropped: a panic here has nobody to report to (stderr is /dev/null by then).
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                janitor(paths, run, rx, pidfd)
            }));
            // SAFETY: _exit ends this forked copy without running the run's atexit handlers
            // or flushing its stdio buffers (the run's, not this process's).
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { .. } => {
            // The write end stays open until this process and the children it made are gone
            // (close-on-exec: nothing it execs gets it): that is what the janitor waits for.
            // Dropped: the fd number; leaking the fd is the point.
            let _ = tx.into_raw_fd();
            Ok(())
        }
    }
}

/// The janitor's life: wait for the run to end, collect what it owned.
fn janitor(paths: &RuntimePaths, run: u32, rx: OwnedFd, pidfd: Option<OwnedFd>) {
    // Dropped: EPERM only, already a process group leader (never, just forked).
    let _ = setsid();
    // Dropped: EINVAL only, never with these arguments; the run's blocked signals would only
    // delay a kill of the janitor.
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    // SAFETY: prctl(PR_SET_NAME) with a NUL-terminated name of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"agentrun-guard".as_ptr()) };
    let keep: Vec<RawFd> = [Some(rx.as_raw_fd()), pidfd.as_ref().map(|f| f.as_raw_fd())]
        .into_iter()
        .flatten()
        .collect();
    only_fds(&keep);
    // Until every write end is closed: the run and whatever it forked are gone.
    let mut sink = Vec::new();
    // Dropped: any end of the read (EOF or an error) means the same: go and check.
    let _ = std::fs::File::from(rx).read_to_end(&mut sink);
    wait_gone(run, pidfd.as_ref());
    // Dropped: what could not be removed now, the next run or `agentrun gc` retries.
    let _ = gc::collect_owned_by(paths, run);
}

/// stdin, stdout and stderr on /dev/null (whoever reads the run's output waits for EOF, which
/// must not wait for the janitor), every other fd but `keep` closed (the run's files and
/// locks are not the janitor's to hold).
fn only_fds(keep: &[RawFd]) {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            // SAFETY: dup2 of an fd we own onto a standard stream number.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
    let mut keep = keep.to_vec();
    keep.sort_unstable();
    let mut from: RawFd = 3;
    for k in keep.into_iter().chain([RawFd::MAX]) {
        if k > from {
            close_range(
                from,
                if k == RawFd::MAX {
                    u32::MAX
                } else {
                    (k - 1) as u32
                },
            );
        }
        from = from.max(k.saturating_add(1));
    }
}

/// Closes fds `first..=last` (close_range(2); one by one where the kernel lacks it).
fn close_range(first: RawFd, last: u32) {
    // SAFETY: close_range(first, last, 0) only closes fds; the caller keeps none in the range.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first as u32, last, 0u32) };
    if r == 0 {
        return;
    }
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd >= first && (*fd as u32) <= last)
        .collect();
    for fd in fds {
        // SAFETY: close of an fd in the range the caller gave up (the dir's own fd, closed
        // here too, is no longer used).
        unsafe { libc::close(fd) };
    }
}

/// Waits (at most [`RUN_EXIT_WAIT`]) until process `run` has exited: its pidfd readable, or,
/// without one, its /proc entry a zombie or gone.
fn wait_gone(run: u32, pidfd: Option<&OwnedFd>) {
    if let Some(fd) = pidfd {
        let mut fds = [PollFd::new(std::os::fd::AsFd::as_fd(fd), PollFlags::POLLIN)];
        let deadline = Instant::now() + RUN_EXIT_WAIT;
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(n) if n > 0 => return,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => break,
            }
        }
        return;
    }
    let deadline = Instant::now() + RUN_EXIT_WAIT;
    while Instant::now() < deadline {
        let state = std::fs::read_to_string(format!("/proc/{run}/stat"))
            .ok()
            .and_then(|s| s.rfind(')').and_then(|i| s[i + 2..].chars().next()));
        if matches!(state, None | Some('Z') | Some('X')) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fds_keeps_what_it_is_told_and_closes_the_rest() {
        // In a child: it closes fds of the test harness.
        // SAFETY: the child only runs the code below and _exits.
        match unsafe { fork() }.unwrap() {
            ForkResult::Child => {
                let a = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
                let b = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
                let c = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
                only_fds(&[c, a]);
                // SAFETY: fcntl(F_GETFD) on plain fd numbers only reads.
                let open = |fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0;
                let ok = open(a) && !open(b) && open(c) && open(0) && open(1) && open(2);
                // SAFETY: ends the forked child.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
            ForkResult::Parent { child } => {
                let st = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(st, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
    }
}
