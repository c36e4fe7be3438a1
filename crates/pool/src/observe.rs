//! What the daemon is doing now, for the people who operate it (`agentrun top`, the `/ui`
//! dashboard): its live picture ([`snapshot`]: the pools and shells, every command running
//! in a sandbox with its CPU and memory, the runs that ended over the last minute) and the
//! one thing those views may do to it, [`kill`] a running command.
//!
//! The running commands are of two kinds: a run (`agentrun exec` through the daemon),
//! registered on the [`board`] for the time it runs ([`Board::register`]), and a process of
//! a long-lived sandbox (OpenSandbox command, Docker container process, MCP session run),
//! which the sandbox itself keeps ([`LiveSandbox::processes`](crate::live::LiveSandbox)).
//! Runs that ended are counted by [`Recent`], fed from the one place every front end
//! reports a run's end ([`crate::metrics::Metrics::run`]).
//!
//! Policy denials are not kept here: every agentrun process appends them to the audit log,
//! which the views read themselves (`AuditLog::recent`, `AuditLog::query`).

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agentrun_runtime::cgroup::CgroupMode;
use serde::{Deserialize, Serialize};

use crate::live::LiveManager;
use crate::protocol::{PoolStatus, SandboxInfo};
use crate::PoolError;

/// Ended runs the window keeps at most (a daemon doing more than this a minute sees the
/// newest ones only).
const RECENT_MAX: usize = 1 << 16;
/// The window's length.
pub const WINDOW_SECONDS: u32 = 60;
/// Running commands a snapshot lists at most (the oldest ones).
const MAX_COMMANDS: usize = 500;
/// The prefix of a run's id.
const RUN_PREFIX: &str = "run-";

/// One command running in a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunningCommand {
    /// What [`kill`] takes: `run-N` (an `agentrun exec` run through the daemon) or
    /// `SANDBOX/N` (process N of a long-lived sandbox).
    pub id: String,
    /// `run` or `process`.
    pub kind: String,
    /// The sandbox id users see: the shell's for a run (its audit records' `sandbox_id`),
    /// the long-lived sandbox's for a process.
    pub sandbox: String,
    /// The shell it runs in.
    pub shell: String,
    pub image: String,
    pub profile: String,
    /// Its argv joined with spaces (cut at 256 bytes, `…` marking the cut).
    pub command: String,
    pub started_unix_ms: u64,
    pub elapsed_ms: u64,
    /// CPU time its sandbox has used since the run started (a run) or since the sandbox was
    /// made (a process: every process of its sandbox counts, they share its cgroup).
    pub cpu_ms: Option<u64>,
    /// Memory its sandbox's cgroup uses now.
    pub memory_bytes: Option<u64>,
}

/// The runs that ended over the last [`WINDOW_SECONDS`] (every front end's).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Window {
    pub seconds: u32,
    /// Runs that ended in each second, oldest first; the last is the current second.
    pub runs_per_second: Vec<u32>,
    /// The median duration of those runs, per second (`None`: no run ended in it).
    pub p50_ms_per_second: Vec<Option<f64>>,
    /// Runs that ended in the window.
    pub runs: u64,
    pub runs_per_s: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// The daemon's live picture.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Snapshot {
    pub unix_ms: u64,
    /// What `agentrun pool status` shows.
    pub status: PoolStatus,
    /// What `agentrun ps` shows.
    pub shells: Vec<SandboxInfo>,
    pub commands: Vec<RunningCommand>,
    pub window: Window,
    pub daemon_memory_bytes: Option<u64>,
}

/// The daemon's live picture now.
pub fn snapshot(live: &LiveManager) -> Snapshot {
    let now = SystemTime::now();
    let cgroup = cgroup_mode();
    let usage = |shell: &str| cgroup.and_then(|cg| cg.usage(shell).ok());
    let mut commands = Vec::new();
    let cpu_ms = |used_ns: u64, base_ns: u64| used_ns.saturating_sub(base_ns) / 1_000_000;
    for run in board().runs() {
        let u = usage(&run.shell);
        commands.push(RunningCommand {
            id: format!("{RUN_PREFIX}{}", run.id),
            kind: "run".into(),
            sandbox: run.shell.clone(),
            shell: run.shell,
            image: run.image,
            profile: run.profile,
            command: run.command,
            started_unix_ms: unix_ms(run.started),
            elapsed_ms: elapsed_ms(run.started, now),
            cpu_ms: u.map(|u| cpu_ms(u.cpu_ns, run.cpu_base_ns)),
            memory_bytes: u.map(|u| u.memory_bytes),
        });
    }
    for sandbox in live.list() {
        let processes = sandbox.processes();
        if processes.is_empty() {
            continue;
        }
        let u = usage(sandbox.shell_id());
        for p in processes {
            commands.push(RunningCommand {
                id: format!("{}/{}", sandbox.id(), p.id),
                kind: "process".into(),
                sandbox: sandbox.id().to_owned(),
                shell: sandbox.shell_id().to_owned(),
                image: sandbox.image().to_owned(),
                profile: sandbox.profile().to_owned(),
                command: p.command,
                started_unix_ms: unix_ms(p.started),
                elapsed_ms: elapsed_ms(p.started, now),
                cpu_ms: u.map(|u| cpu_ms(u.cpu_ns, sandbox.cpu_base_ns())),
                memory_bytes: u.map(|u| u.memory_bytes),
            });
        }
    }
    commands.sort_by_key(|c| c.started_unix_ms);
    commands.truncate(MAX_COMMANDS);
    Snapshot {
        unix_ms: unix_ms(now),
        status: live.pool_status(),
        shells: live.shells(),
        commands,
        window: crate::metrics::global().recent().window(Instant::now()),
        daemon_memory_bytes: crate::metrics::resident_memory_bytes(),
    }
}

/// Kills a running command ([`RunningCommand::id`]): SIGKILL to its process group. A run
/// then ends as one its client killed (exit 137); a long-lived sandbox's process ends and
/// its sandbox goes on.
pub fn kill(live: &LiveManager, id: &str) -> Result<(), PoolError> {
    let unknown = || PoolError::Invalid(format!("no running command {id:?}"));
    if let Some(n) = id.strip_prefix(RUN_PREFIX) {
        let n: u64 = n.parse().map_err(|_| unknown())?;
        return if board().kill(n) {
            Ok(())
        } else {
            Err(unknown())
        };
    }
    let (sandbox, process) = id.rsplit_once('/').ok_or_else(unknown)?;
    let process: u64 = process.parse().map_err(|_| unknown())?;
    let sandbox = live.get(sandbox).ok_or_else(unknown)?;
    if !sandbox.processes().iter().any(|p| p.id == process) {
        return Err(unknown());
    }
    sandbox.signal(process, libc::SIGKILL, true)
}

/// A command line as the views show it: argv joined with spaces, cut as spans and audit
/// records cut it ([`agentrun_telemetry::command_line`]).
pub fn command_line(argv: &[String]) -> String {
    agentrun_telemetry::command_line(&argv.join(" "))
}

fn cgroup_mode() -> Option<CgroupMode> {
    static MODE: OnceLock<Option<CgroupMode>> = OnceLock::new();
    *MODE.get_or_init(CgroupMode::detect)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn elapsed_ms(since: SystemTime, now: SystemTime) -> u64 {
    now.duration_since(since)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The runs (`agentrun exec` through the daemon) running now.
#[derive(Debug, Default)]
pub struct Board {
    next: AtomicU64,
    runs: Mutex<BTreeMap<u64, BoardEntry>>,
}

#[derive(Debug)]
struct BoardEntry {
    run: BoardRun,
    /// Written to when the run is to be killed (the run's wait polls the other end).
    kill: UnixStream,
}

/// A run on the [`Board`].
#[derive(Debug, Clone)]
pub struct BoardRun {
    pub id: u64,
    pub shell: String,
    pub image: String,
    pub profile: String,
    pub command: String,
    pub started: SystemTime,
    /// Its shell's CPU time (ns) when it started.
    pub cpu_base_ns: u64,
}

/// A run's place on the [`Board`]: taken off when dropped. Its [`BoardGuard::kill_fd`] turns
/// readable when a view asks for the run to be killed.
#[derive(Debug)]
pub struct BoardGuard {
    id: u64,
    killed: UnixStream,
}

/// The daemon's runs (one board per process).
pub fn board() -> &'static Board {
    static BOARD: OnceLock<Board> = OnceLock::new();
    BOARD.get_or_init(Board::default)
}

impl Board {
    /// Puts a run on the board until the guard is dropped.
    pub fn register(
        &'static self,
        shell: &str,
        image: &str,
        profile: &str,
        argv: &[String],
    ) -> Result<BoardGuard, PoolError> {
        let (kill, killed) = UnixStream::pair().map_err(|e| PoolError::Io("socketpair", e))?;
        killed
            .set_nonblocking(true)
            .map_err(|e| PoolError::Io("socketpair", e))?;
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let run = BoardRun {
            id,
            shell: shell.to_owned(),
            image: image.to_owned(),
            profile: profile.to_owned(),
            command: command_line(argv),
            started: SystemTime::now(),
            cpu_base_ns: cgroup_mode().and_then(|cg| cg.cpu_ns(shell)).unwrap_or(0),
        };
        crate::lock(&self.runs).insert(id, BoardEntry { run, kill });
        Ok(BoardGuard { id, killed })
    }

    /// The runs on the board, oldest first.
    pub fn runs(&self) -> Vec<BoardRun> {
        crate::lock(&self.runs)
            .values()
            .map(|e| e.run.clone())
            .collect()
    }

    /// Asks run `id` to be killed; `false` if it is not on the board.
    pub fn kill(&self, id: u64) -> bool {
        match crate::lock(&self.runs).get(&id) {
            Some(e) => (&e.kill).write_all(b"k").is_ok(),
            None => false,
        }
    }
}

impl BoardGuard {
    /// Readable once the run is to be killed.
    pub fn kill_fd(&self) -> BorrowedFd<'_> {
        self.killed.as_fd()
    }

    /// Consumes a kill request (after [`BoardGuard::kill_fd`] polled readable): whether there
    /// was one.
    pub fn take_kill(&self) -> bool {
        let mut buf = [0u8; 16];
        matches!((&self.killed).read(&mut buf), Ok(n) if n > 0)
    }
}

impl Drop for BoardGuard {
    fn drop(&mut self) {
        crate::lock(&board().runs).remove(&self.id);
    }
}

/// The ends of recent runs (when, how long), for [`Window`].
#[derive(Debug, Default)]
pub struct Recent {
    ends: Mutex<VecDeque<(Instant, f64)>>,
}

impl Recent {
    /// A run ended now after `duration`.
    pub fn record(&self, duration: Duration) {
        let now = Instant::now();
        let mut ends = crate::lock(&self.ends);
        prune(&mut ends, now);
        if ends.len() == RECENT_MAX {
            ends.pop_front();
        }
        ends.push_back((now, duration.as_secs_f64() * 1000.0));
    }

    /// The last [`WINDOW_SECONDS`] before `now`.
    pub fn window(&self, now: Instant) -> Window {
        let mut ends = crate::lock(&self.ends);
        prune(&mut ends, now);
        let seconds = WINDOW_SECONDS as usize;
        let mut per_second: Vec<Vec<f64>> = vec![Vec::new(); seconds];
        for (at, ms) in ends.iter() {
            let ago = now.saturating_duration_since(*at).as_secs() as usize;
            if ago < seconds {
                per_second[seconds - 1 - ago].push(*ms);
            }
        }
        drop(ends);
        let mut all: Vec<f64> = per_second.iter().flatten().copied().collect();
        all.sort_by(f64::total_cmp);
        let runs = all.len() as u64;
        Window {
            seconds: WINDOW_SECONDS,
            runs_per_second: per_second.iter().map(|s| s.len() as u32).collect(),
            p50_ms_per_second: per_second
                .into_iter()
                .map(|mut s| {
                    s.sort_by(f64::total_cmp);
                    percentile(&s, 50.0)
                })
                .collect(),
            runs,
            runs_per_s: runs as f64 / f64::from(WINDOW_SECONDS),
            p50_ms: percentile(&all, 50.0),
            p99_ms: percentile(&all, 99.0),
        }
    }
}

fn prune(ends: &mut VecDeque<(Instant, f64)>, now: Instant) {
    let span = Duration::from_secs(u64::from(WINDOW_SECONDS));
    while ends
        .front()
        .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= span)
    {
        ends.pop_front();
    }
}

/// The nearest-rank percentile `p` of sorted `values`.
fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn window_counts_runs_per_second_and_forgets_old_ones() {
        let recent = Recent::default();
        for ms in [10, 20, 30] {
            recent.record(Duration::from_millis(ms));
        }
        let w = recent.window(Instant::now());
        assert_eq!(w.seconds, 60);
        assert_eq!(w.runs_per_second.len(), 60);
        assert_eq!(*w.runs_per_second.last().unwrap(), 3);
        assert_eq!(w.runs, 3);
        assert_eq!(w.p50_ms, Some(20.0));
        assert_eq!(w.p99_ms, Some(30.0));
        assert_eq!(*w.p50_ms_per_second.last().unwrap(), Some(20.0));
        assert_eq!(w.p50_ms_per_second[0], None);
        let later = recent.window(Instant::now() + Duration::from_secs(61));
        assert_eq!(later.runs, 0);
        assert_eq!(later.p50_ms, None);
        assert!(later.runs_per_second.iter().all(|n| *n == 0));
    }

    #[test]
    fn board_lists_kills_and_forgets_runs() {
        let argv = vec!["sleep".to_owned(), "30".to_owned()];
        let guard = board().register("shell-x", "img", "prof", &argv).unwrap();
        let run = board()
            .runs()
            .into_iter()
            .find(|r| r.shell == "shell-x")
            .unwrap();
        assert_eq!(run.command, "sleep 30");
        assert!(!guard.take_kill());
        assert!(board().kill(run.id));
        assert!(guard.take_kill());
        drop(guard);
        assert!(!board().kill(run.id));
        assert!(board().runs().iter().all(|r| r.shell != "shell-x"));
    }

    #[test]
    fn long_command_lines_are_cut() {
        let line = command_line(&["x".repeat(500)]);
        assert!(line.len() < 300 && line.ends_with('…'));
        assert_eq!(command_line(&["a".into(), "b".into()]), "a b");
    }
}
