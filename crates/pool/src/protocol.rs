//! The local daemon protocol: JSON messages on a `SOCK_SEQPACKET` unix socket (root-only).
//!
//! A client sends one [`ClientMessage`]. For `exec`, its stdin, stdout and stderr travel along
//! as `SCM_RIGHTS`: the sandboxed command writes straight to the client's terminal or pipes.
//! While the run lasts the client may send `signal` messages (forwarded to the command's
//! process group); closing the connection kills the run. The daemon answers with one
//! [`DaemonReply`]. A run whose network policy needs an egress proxy gets
//! [`DaemonReply::Egress`] first: the client serves the run's proxy on that socket (its
//! decisions are the run's spans and audit records) and answers
//! [`ClientMessage::EgressReady`] before the cell starts.

use std::collections::BTreeMap;
use std::time::Duration;

use agentrun_runtime::cgroup::CgroupStats;
use agentrun_runtime::{Enforcement, RunOutcome};
use serde::{Deserialize, Serialize};

use crate::recipe::ExecRequest;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ClientMessage {
    /// Run a command (3 fds attached: stdin, stdout, stderr).
    Exec {
        request: Box<ExecRequest>,
        timeout_ms: Option<u64>,
        /// The client's image store (`AGENTRUN_ROOT`): a daemon serving another one answers
        /// [`DaemonReply::OtherStore`] and the client runs cold (its images are not the
        /// daemon's). `None`: whatever the daemon serves.
        #[serde(default)]
        store: Option<std::path::PathBuf>,
    },
    /// Forward a signal to the running command.
    Signal { signal: i32 },
    /// The run's egress proxy listens on the socket of [`DaemonReply::Egress`].
    EgressReady,
    /// After a run through the daemon: the rule ids of the policy decisions that denied
    /// something in it (the client saw them: its egress proxy, the kernel's Landlock
    /// reports, its plan). Counted in the daemon's metrics; answered with
    /// [`DaemonReply::Ok`].
    Denials { rules: Vec<String> },
    /// List sandboxes.
    Ps,
    /// Pool counters.
    PoolStatus,
    /// The daemon's live picture (`agentrun top`): answered with [`DaemonReply::Top`].
    Top,
    /// Kill a running command ([`RunningCommand::id`]): answered with
    /// [`DaemonReply::Ok`] or an error.
    Kill { id: String },
    /// Take a snapshot of long-lived sandbox `sandbox` (its id, as `agentrun ps` shows it):
    /// answered with [`DaemonReply::Snapshot`] or an error.
    Snapshot {
        sandbox: String,
        #[serde(default)]
        name: Option<String>,
        /// Most bytes of changed files it may hold.
        #[serde(default)]
        max_bytes: Option<u64>,
    },
}

/// The result of an `exec`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExecReply {
    pub exit_code: i32,
    pub signal: Option<i32>,
    /// The shell's id.
    pub sandbox_id: String,
    pub pool_hit: bool,
    /// Cells the shell served before this run's.
    #[serde(default)]
    pub shell_runs: u64,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub memory_limit_bytes: u64,
    pub peak_memory_bytes: Option<u64>,
    /// Host pid of the cell's PID 1 (the process that made the run's Landlock domain).
    pub init_pid: i32,
    pub duration_ms: u64,
    pub usage: Option<agentrun_runtime::control::ResourceUsage>,
    pub enforcement: Enforcement,
    /// Set when agentrun itself failed (exit 125); one line.
    pub error: Option<String>,
    /// The cell could not be set up around the command (exit 125): why. The cell already
    /// said so on the command's stderr.
    #[serde(default)]
    pub cell_error: Option<String>,
    /// The profile has a Python zygote: whether it forked this run, and if not why.
    #[serde(default)]
    pub zygote: Option<bool>,
    #[serde(default)]
    pub zygote_fallback: Option<String>,
    /// The zygote had forked the run's process before the run came (off its path).
    #[serde(default)]
    pub zygote_ahead: bool,
}

impl ExecReply {
    /// Puts a settled run's end ([`RunOutcome::of_cell`]) in the reply.
    pub fn record(&mut self, o: &RunOutcome) {
        self.exit_code = o.exit_code;
        self.signal = o.signal;
        self.timed_out = o.timed_out;
        self.oom_killed = o.oom_killed;
        self.peak_memory_bytes = o.stats.peak_memory_bytes;
        self.duration_ms = o.run_duration.as_millis() as u64;
        self.usage = o.usage;
        self.cell_error.clone_from(&o.error);
    }

    /// The run's end as the daemon settled it, back in a [`RunOutcome`] (without output
    /// counts: the command wrote to the client's own fds).
    pub fn outcome(&self) -> RunOutcome {
        RunOutcome {
            exit_code: self.exit_code,
            signal: self.signal,
            timed_out: self.timed_out,
            oom_killed: self.oom_killed,
            stats: CgroupStats {
                peak_memory_bytes: self.peak_memory_bytes,
                oom_kills: u64::from(self.oom_killed),
            },
            init_pid: self.init_pid,
            run_duration: Duration::from_millis(self.duration_ms),
            usage: self.usage,
            error: self.cell_error.clone(),
            ..Default::default()
        }
    }
}

/// One shell as `agentrun ps` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SandboxInfo {
    /// The shell's id (its cgroup's and state dir's name).
    pub id: String,
    /// `ready` (pooled, idle) or `running` (a run or a long-lived sandbox in it).
    pub state: String,
    /// Host pid of the shell's init.
    pub pid: i32,
    pub image: String,
    pub profile: String,
    pub age_ms: u64,
    /// Cells it has served.
    #[serde(default)]
    pub cells: u64,
    /// The id of the long-lived sandbox (OpenSandbox sandbox, Docker container) it serves
    /// now, if any: a sandbox's own id, not the shell's (the shell may serve others after).
    #[serde(default)]
    pub sandbox: Option<String>,
}

/// Counters of one kept pool.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PoolInfo {
    pub image: String,
    pub profile: String,
    pub ready: usize,
    pub target: usize,
    /// Runs served by a ready shell of this pool.
    pub hits: u64,
    /// Runs of this pool's image and profile that found it empty (a shell made on demand,
    /// which then joins the pool).
    pub misses: u64,
    /// Its shells discarded, for any reason ([`PoolStatus::discarded`] has the reasons,
    /// over every pool).
    #[serde(default)]
    pub discarded: u64,
    /// The Python zygote of one of its ready shells, if its profile has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zygote: Option<agentrun_runtime::zygote::ZygoteStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum DaemonReply {
    Exec(ExecReply),
    /// Serve the run's egress proxy on this socket, then send
    /// [`ClientMessage::EgressReady`].
    Egress {
        socket: std::path::PathBuf,
        /// The shell's id (the run's `sandbox.id`: its decisions are recorded under it).
        sandbox_id: String,
    },
    Ps {
        sandboxes: Vec<SandboxInfo>,
    },
    PoolStatus(PoolStatus),
    Top(Box<Snapshot>),
    /// The daemon serves another image store than the client's [`ClientMessage::Exec`]
    /// named; nothing was run.
    OtherStore {
        store: std::path::PathBuf,
    },
    Error {
        message: String,
    },
    /// Done (for [`ClientMessage::Denials`] and [`ClientMessage::Kill`]).
    Ok,
    /// The snapshot taken ([`ClientMessage::Snapshot`]).
    Snapshot(Box<agentrun_image::Snapshot>),
}

/// What `agentrun pool status` shows.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct PoolStatus {
    pub pools: Vec<PoolInfo>,
    /// Runs whose image and profile no pool keeps.
    pub unpooled: u64,
    /// Shells created, and creations that failed, since the daemon started.
    pub created: u64,
    pub create_failures: u64,
    /// Shells lent out (a run or a long-lived sandbox in them).
    pub running: usize,
    pub max_sandboxes: usize,
    /// Shells that exist now (ready, running, being made or torn down).
    #[serde(default)]
    pub shells: usize,
    /// Cells served (one per run, one per long-lived sandbox).
    #[serde(default)]
    pub cells: u64,
    /// Shells discarded, by reason: `timeout`, `oom`, `killed` (client gone or signalled
    /// away), `cell_failed` (a cell could not be made), `cell_died` (its PID 1 died without a
    /// result), `outlived` (a process of a run outlived its cell), `zygote_failed` (its
    /// Python zygote hung or failed during a run), `shell_changed`,
    /// `init_error` (the shell's init failed or is gone), `teardown_slow`, `max_runs`,
    /// `max_age`, `idle` (an extra shell unused), `room` (made room for another),
    /// `unpooled`, `shutdown`; after a long-lived sandbox also `paused`, `ports`,
    /// `netns_sockets`, `egress_bound`, `limits_unknown` (see [`crate::live`]).
    #[serde(default)]
    pub discarded: BTreeMap<String, u64>,
    #[serde(default)]
    pub shell_max_runs: u64,
    #[serde(default)]
    pub shell_max_age_s: u64,
}

/// One command running in a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunningCommand {
    /// What [`crate::observe::kill`] takes: `run-N` (an `agentrun exec` run through the daemon) or
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

/// The runs that ended over the last [`crate::metrics::WINDOW_SECONDS`] (every front end's).
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
