//! How a run ended ([`RunOutcome`]) and the one rule that turns its end (the command's exit
//! or signal, agentrun's timeout, an OOM kill, a cell that could not be set up) into the exit
//! code agentrun reports ([`settle`], DESIGN.md's conventions) and into what the user and the
//! span are told ([`RunEnd`]).
//!
//! Every path that runs a command settles it here: the cold path's cell
//! ([`crate::Sandbox::run_cell`]), the daemon's cells (agentrun-pool) and `image build`'s
//! one-command sandboxes ([`crate::Sandbox::run`]).

use std::time::Duration;

use nix::sys::wait::WaitStatus;

use crate::control::{InitResult, ResourceUsage};
use crate::host::cgroup_ops::CgroupStats;

use crate::exit::{EXIT_OOM_KILLED, EXIT_SETUP_FAILED, EXIT_SIGNAL_BASE, EXIT_TIMED_OUT};

/// The result of a run.
#[derive(Debug, Clone, Default)]
pub struct RunOutcome {
    /// The code `agentrun exec` exits with (see [`settle`]).
    pub exit_code: i32,
    /// Signal that ended the command, when the init reported 128+N or was killed.
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub stats: CgroupStats,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// The first bytes of stderr, for the span.
    pub stderr_preview: Vec<u8>,
    /// Host pid of the sandbox's init.
    pub init_pid: i32,
    /// Time from start to exit.
    pub run_duration: Duration,
    /// CPU time and peak RSS of everything that ran in the sandbox.
    pub usage: Option<ResourceUsage>,
    /// stdout or stderr went over the profile's output cap; the rest was dropped.
    pub output_truncated: bool,
    /// The cell could not be set up around the command (exit 125): why.
    pub error: Option<String>,
}

/// Why a run ended, as the user and the span are told: the first that applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd<'a> {
    /// agentrun killed it at its timeout (124).
    TimedOut,
    /// The OOM killer ended it (137).
    OutOfMemory,
    /// Its cell could not be set up around the command (125); the cell said why on the
    /// command's stderr.
    SetupFailed(&'a str),
    /// A signal ended the command (128+N).
    Signaled(i32),
    /// The command exited on its own (or no more is known).
    Exited,
}

impl RunEnd<'_> {
    /// The span's `error.type` of an end that is an error (`None`: the command's own end).
    pub fn error_type(&self) -> Option<&'static str> {
        match self {
            RunEnd::TimedOut => Some("timeout"),
            RunEnd::OutOfMemory => Some("oom"),
            RunEnd::SetupFailed(_) => Some("sandbox_setup"),
            RunEnd::Signaled(_) | RunEnd::Exited => None,
        }
    }
}

impl RunOutcome {
    /// A cell's run, settled: its PID 1's report (`None`: it died without one), whether
    /// agentrun timed it out, and the run's cgroup figures.
    pub fn of_cell(
        init: Option<InitResult>,
        timed_out: bool,
        stats: CgroupStats,
        run_duration: Duration,
    ) -> Self {
        let reported = init.as_ref().map(|r| (r.exit_code, r.signal));
        let mut outcome = Self::settled(reported, timed_out, stats, run_duration);
        if let Some(r) = init {
            outcome.usage = Some(r.usage);
            outcome.error = r.error;
        }
        outcome
    }

    /// A one-command sandbox's run (`image build`), settled from its init's wait status
    /// (`None`: not reaped).
    pub fn of_init(
        status: Option<WaitStatus>,
        usage: Option<ResourceUsage>,
        timed_out: bool,
        stats: CgroupStats,
        run_duration: Duration,
    ) -> Self {
        let reported = match status {
            Some(WaitStatus::Exited(_, c)) if c > EXIT_SIGNAL_BASE && c < EXIT_SIGNAL_BASE + 65 => {
                (c, Some(c - EXIT_SIGNAL_BASE))
            }
            Some(WaitStatus::Exited(_, c)) => (c, None),
            Some(WaitStatus::Signaled(_, s, _)) => (EXIT_SIGNAL_BASE + s as i32, Some(s as i32)),
            _ => (EXIT_SETUP_FAILED, None),
        };
        let mut outcome = Self::settled(Some(reported), timed_out, stats, run_duration);
        outcome.usage = usage;
        outcome
    }

    /// What every settled run has: its exit code and signal by [`settle`], its timeout, OOM
    /// kills and duration.
    fn settled(
        reported: Option<(i32, Option<i32>)>,
        timed_out: bool,
        stats: CgroupStats,
        run_duration: Duration,
    ) -> Self {
        let (exit_code, signal) = settle(reported, timed_out, stats.oom_kills);
        RunOutcome {
            exit_code,
            signal,
            timed_out,
            oom_killed: stats.oom_kills > 0,
            stats,
            run_duration,
            ..Default::default()
        }
    }

    /// Why the run ended (what to tell the user, what the span's status says).
    pub fn end(&self) -> RunEnd<'_> {
        if self.timed_out {
            RunEnd::TimedOut
        } else if self.oom_killed && self.exit_code == EXIT_OOM_KILLED {
            RunEnd::OutOfMemory
        } else if let Some(e) = &self.error {
            RunEnd::SetupFailed(e)
        } else if let Some(sig) = self.signal {
            RunEnd::Signaled(sig)
        } else {
            RunEnd::Exited
        }
    }
}

/// The exit code of a run (DESIGN.md's conventions) and the signal that ended it, from what
/// its process reported (exit code, 128+N with signal N; `None`: it died without a report),
/// whether agentrun timed it out, and the OOM kills of the run: 124 timed out; 137
/// OOM-killed; 125 no report (and no OOM kill); else the command's own code.
pub fn settle(
    reported: Option<(i32, Option<i32>)>,
    timed_out: bool,
    oom_kills: u64,
) -> (i32, Option<i32>) {
    let (code, signal) = match reported {
        Some(r) => r,
        None if oom_kills > 0 => (EXIT_OOM_KILLED, Some(libc::SIGKILL)),
        None => (EXIT_SETUP_FAILED, None),
    };
    if timed_out {
        (EXIT_TIMED_OUT, signal)
    } else if oom_kills > 0 && signal == Some(libc::SIGKILL) {
        (EXIT_OOM_KILLED, signal)
    } else {
        (code, signal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_conventions() {
        assert_eq!(settle(Some((3, None)), false, 0), (3, None));
        assert_eq!(settle(Some((3, None)), true, 0).0, 124);
        assert_eq!(settle(Some((137, Some(9))), false, 1), (137, Some(9)));
        assert_eq!(settle(Some((137, Some(9))), false, 0), (137, Some(9)));
        assert_eq!(settle(None, false, 0), (125, None));
        assert_eq!(settle(None, false, 2).0, 137);
        assert_eq!(settle(None, true, 0).0, 124);
    }

    #[test]
    fn a_cell_without_a_report_is_a_setup_failure_unless_oom_killed() {
        let stats = |oom_kills| CgroupStats {
            peak_memory_bytes: None,
            oom_kills,
        };
        let gone = RunOutcome::of_cell(None, false, stats(0), Duration::ZERO);
        assert_eq!((gone.exit_code, gone.end()), (125, RunEnd::Exited));
        let oom = RunOutcome::of_cell(None, false, stats(1), Duration::ZERO);
        assert_eq!((oom.exit_code, oom.end()), (137, RunEnd::OutOfMemory));
        let failed = InitResult {
            exit_code: 125,
            error: Some("no such file".into()),
            ..Default::default()
        };
        let o = RunOutcome::of_cell(Some(failed), false, stats(0), Duration::ZERO);
        assert_eq!(o.end(), RunEnd::SetupFailed("no such file"));
        assert_eq!(o.end().error_type(), Some("sandbox_setup"));
    }

    #[test]
    fn an_init_killed_by_a_signal_reports_128_plus_n() {
        let pid = nix::unistd::Pid::from_raw(1);
        let status = WaitStatus::Signaled(pid, nix::sys::signal::Signal::SIGTERM, false);
        let o = RunOutcome::of_init(
            Some(status),
            None,
            false,
            CgroupStats::default(),
            Duration::ZERO,
        );
        assert_eq!((o.exit_code, o.end()), (143, RunEnd::Signaled(15)));
        let t = RunOutcome::of_init(None, None, true, CgroupStats::default(), Duration::ZERO);
        assert_eq!((t.exit_code, t.end()), (124, RunEnd::TimedOut));
    }
}
