//! What the daemon is doing now, for the people who operate it (`agentrun top`, the `/ui`
//! dashboard): its live picture ([`snapshot`]: the pools and shells, every command running
//! in a sandbox with its CPU and memory, the runs that ended over the last minute) and the
//! one thing those views may do to it, [`kill`] a running command.
//!
//! The running commands are of two kinds: a run (`agentrun exec` through the daemon), on the
//! [`crate::board`] for the time it runs, and a process of a long-lived sandbox (OpenSandbox
//! command, Docker container process, MCP session run), which the sandbox itself keeps
//! ([`LiveSandbox::processes`](crate::live::LiveSandbox)). Runs that ended are counted by
//! [`crate::metrics::Recent`], fed from the one place every front end reports a run's end
//! ([`crate::metrics::Metrics::run`]). The picture's types are the control protocol's
//! ([`Snapshot`]).
//!
//! Policy denials are not kept here: every agentrun process appends them to the audit log,
//! which the views read themselves (`AuditLog::recent`, `AuditLog::query`).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub use crate::protocol::{RunningCommand, Snapshot, Window};

use crate::board::board;
use crate::live::LiveManager;
use crate::PoolError;

/// Running commands a snapshot lists at most (the oldest ones).
const MAX_COMMANDS: usize = 500;
/// The prefix of a run's id.
const RUN_PREFIX: &str = "run-";

/// The daemon's live picture now.
pub fn snapshot(live: &LiveManager) -> Snapshot {
    let now = SystemTime::now();
    let cgroup = crate::cgroup_mode();
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

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn elapsed_ms(since: SystemTime, now: SystemTime) -> u64 {
    now.duration_since(since)
        .map_or(0, |d| d.as_millis() as u64)
}
