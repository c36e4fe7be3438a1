//! One run in a pooled shell: the run's limits set on the shell's cgroup, a cell made with
//! the client's stdio fds (passed, not copied), then its result awaited while enforcing the
//! timeout, forwarding the client's signals and killing the cell if the client goes away;
//! after the reply, the cell's end awaited and the shell judged ([`verdict`]).

use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use agentrun_runtime::cellrun::{await_end, CellEnd, CellRun};
use agentrun_runtime::cgroup::{CgroupMode, CgroupStats, RunMeter};
use agentrun_runtime::control::{self, InitResult};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::factory::PooledShell;
use crate::protocol::ClientMessage;
use crate::PoolError;

/// How long the teardown of a cell may take before its shell is given up on.
const END_WAIT: Duration = Duration::from_secs(5);

/// What becomes of a shell after a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Clean: back to its pool (unless it is too old or served too many runs).
    Reuse,
    /// In doubt (or not wanted): destroyed. The reason is counted in `pool status`.
    Discard(&'static str),
}

/// How a run ended.
#[derive(Debug, Clone, Default)]
pub struct RunResult {
    /// The cell's report; `None` if its PID 1 died without one.
    pub init: Option<InitResult>,
    pub timed_out: bool,
    pub client_gone: bool,
    /// An operator killed it ([`crate::observe::kill`]).
    pub killed: bool,
    /// This run's peak memory and OOM kills.
    pub stats: CgroupStats,
    pub duration: Duration,
}

/// Waits for `cell`'s result. `client` is polled for [`ClientMessage::Signal`]s and hang-up.
pub fn wait(
    cell: &CellRun,
    timeout: Option<Duration>,
    client: BorrowedFd<'_>,
    meter: Option<RunMeter>,
    board: &crate::board::BoardGuard,
) -> Result<RunResult, PoolError> {
    let started = Instant::now();
    let deadline = timeout.map(|t| started + t);
    let mut result = RunResult::default();
    let mut client_open = true;
    let channel = cell
        .channel()
        .ok_or_else(|| PoolError::Invalid("the cell has no channel".into()))?;
    loop {
        let wait = match deadline {
            Some(d) if !result.timed_out => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    result.timed_out = true;
                    cell.kill();
                    PollTimeout::from(100u8)
                } else {
                    PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                        .unwrap_or(PollTimeout::MAX)
                }
            }
            _ => PollTimeout::try_from(60_000).unwrap_or(PollTimeout::MAX),
        };
        let mut fds = vec![
            PollFd::new(channel, PollFlags::POLLIN),
            PollFd::new(board.kill_fd(), PollFlags::POLLIN),
        ];
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
        let cell_ready = ready(0);
        let kill_asked = ready(1);
        let client_ready = client_open && ready(2);
        drop(fds);
        if kill_asked && board.take_kill() && !result.killed {
            // Asked by an operator (`agentrun top`, `/ui`): the whole cell goes.
            result.killed = true;
            cell.kill();
        }
        if cell_ready {
            // The result, or EOF: its PID 1 is gone without one (killed).
            result.init = cell.result();
            break;
        }
        if client_ready {
            match control::recv_json::<ClientMessage>(client) {
                Ok(Some((ClientMessage::Signal { signal }, _))) => cell.signal(signal),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    // The client went away: nobody wants this run any more.
                    client_open = false;
                    result.client_gone = true;
                    cell.kill();
                }
            }
        }
    }
    result.duration = started.elapsed();
    if let Some(m) = meter {
        result.stats = m.finish();
    }
    Ok(result)
}

/// After the run: waits for the cell's end (its PID 1 reaped by the shell's init, the cell
/// torn down) and judges the shell: anything in doubt discards it.
pub fn verdict(
    shell: &PooledShell,
    cell: u64,
    run: &RunResult,
    cgroup: Option<CgroupMode>,
) -> Verdict {
    if run.timed_out {
        return Verdict::Discard("timeout");
    }
    if run.stats.oom_kills > 0 {
        return Verdict::Discard("oom");
    }
    if run.client_gone || run.killed {
        return Verdict::Discard("killed");
    }
    match &run.init {
        None => return Verdict::Discard("cell_died"),
        Some(r) if r.error.is_some() => return Verdict::Discard("cell_failed"),
        Some(r) if r.zygote_fault => return Verdict::Discard("zygote_failed"),
        Some(_) => {}
    }
    cell_end_verdict(shell, cell, cgroup)
}

/// Waits for cell `cell`'s end and checks the shell is as it was: nothing left in its cgroup
/// but its init, nothing of it changed.
pub fn cell_end_verdict(shell: &PooledShell, cell: u64, cgroup: Option<CgroupMode>) -> Verdict {
    match await_end(shell.control.as_fd(), cell, END_WAIT) {
        Ok(CellEnd::Ended { changed: None }) => {}
        Ok(CellEnd::Ended {
            changed: Some(what),
        }) => {
            tracing::info!(target: "agentrun::pool", "shell {} discarded: {what}", shell.id);
            return Verdict::Discard("shell_changed");
        }
        Ok(CellEnd::Late) => return Verdict::Discard("teardown_slow"),
        Err(_) => return Verdict::Discard("init_error"),
    }
    if let Some(cg) = cgroup {
        let strays: Vec<i32> = cg
            .pids(&shell.id)
            .into_iter()
            .filter(|p| {
                *p != shell.init_pid
                    && !agentrun_runtime::zygote::is_shell_helper(*p, shell.init_pid)
            })
            .collect();
        if !strays.is_empty() {
            tracing::info!(
                target: "agentrun::pool",
                "shell {} discarded: processes {strays:?} outlived their cell",
                shell.id,
            );
            return Verdict::Discard("outlived");
        }
    }
    Verdict::Reuse
}
