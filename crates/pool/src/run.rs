//! One run on a pooled sandbox: hand the command and the client's stdio fds to the init, then
//! wait for its result while enforcing the timeout, forwarding the client's signals, and
//! killing the sandbox if the client goes away or the init dies.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use agentrun_runtime::cgroup::{CgroupMode, CgroupStats};
use agentrun_runtime::control::{self, InitRequest, InitResult};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::factory::PooledSandbox;
use crate::protocol::ClientMessage;
use crate::PoolError;

/// How a pooled run ended.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    /// The init's report; `None` if it died without one.
    pub init: Option<InitResult>,
    pub timed_out: bool,
    pub client_gone: bool,
    pub stats: CgroupStats,
    pub duration: Duration,
}

/// Runs `req` with `stdio` in `sandbox`. `client` is polled for [`ClientMessage::Signal`]s and
/// hang-up.
pub fn run(
    sandbox: &PooledSandbox,
    req: &InitRequest,
    stdio: &[OwnedFd],
    timeout: Option<Duration>,
    client: BorrowedFd<'_>,
    cgroup: Option<CgroupMode>,
) -> Result<RunResult, PoolError> {
    let started = Instant::now();
    let raw: Vec<i32> = stdio.iter().map(|f| f.as_raw_fd()).collect();
    control::send_json(sandbox.control.as_fd(), req, &raw)?;
    let init = Pid::from_raw(sandbox.init_pid);
    let deadline = timeout.map(|t| started + t);
    let mut result = RunResult::default();
    let mut client_open = true;
    let mut init_alive = true;
    loop {
        let wait = match deadline {
            Some(d) if !result.timed_out => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    result.timed_out = true;
                    let _ = kill(init, Signal::SIGKILL);
                    PollTimeout::from(100u8)
                } else {
                    PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                        .unwrap_or(PollTimeout::MAX)
                }
            }
            _ => PollTimeout::try_from(60_000).unwrap_or(PollTimeout::MAX),
        };
        let mut fds = vec![PollFd::new(sandbox.control.as_fd(), PollFlags::POLLIN)];
        if init_alive {
            fds.push(PollFd::new(sandbox.pidfd.as_fd(), PollFlags::POLLIN));
        }
        if client_open {
            fds.push(PollFd::new(client, PollFlags::POLLIN));
        }
        match poll(&mut fds, wait) {
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(PoolError::Sys("poll", e)),
        }
        let ready = |i: usize| {
            fds.get(i)
                .and_then(|f| f.revents())
                .is_some_and(|r| !r.is_empty())
        };
        let control_ready = ready(0);
        let init_exited = init_alive && ready(1);
        let client_ready = client_open && ready(if init_alive { 2 } else { 1 });
        drop(fds);
        if control_ready {
            match control::recv_json::<InitResult>(sandbox.control.as_fd()) {
                Ok(Some((r, _))) => {
                    result.init = Some(r);
                    break;
                }
                // EOF: the init is gone without a report (killed, crashed).
                Ok(None) | Err(_) => break,
            }
        }
        if init_exited {
            // Give a report written just before exiting a last chance.
            init_alive = false;
            if !control::wait_readable(sandbox.control.as_fd(), Some(Duration::from_millis(50)))? {
                break;
            }
        }
        if client_ready {
            match control::recv_json::<ClientMessage>(client) {
                Ok(Some((ClientMessage::Signal { signal }, _))) => {
                    if let Ok(sig) = Signal::try_from(signal) {
                        let _ = kill(init, sig);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    // The client went away: nobody wants this run any more.
                    client_open = false;
                    result.client_gone = true;
                    let _ = kill(init, Signal::SIGKILL);
                }
            }
        }
    }
    result.duration = started.elapsed();
    if let Some(cg) = cgroup {
        result.stats = cg.stats(&sandbox.id);
    }
    Ok(result)
}
