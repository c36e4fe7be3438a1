//! Garbage collection: removes what runs killed with SIGKILL left behind.
//!
//! A sandbox's state dir records its owner (`pid starttime`). A sandbox whose owner is gone is
//! dead: its processes are killed (they usually died with the owner through PDEATHSIG), and
//! its cgroups, mounts, container state and state dir removed. Empty, old cgroups under
//! `agentrun/` without a state dir are removed too (one with processes may be another state
//! dir's live sandbox and is left alone). Run by `agentrun gc`, at the daemon's start and
//! at the start of every run (there the cgroup scan at most every 30 s), and, for the one
//! cold run it guards, by that run's janitor as soon as the run dies ([`crate::host::guard`]).

use std::fs;
use std::time::{Duration, SystemTime};

use crate::error::RuntimeError;
use crate::host::cgroup::CgroupMode;
use crate::sandbox::{destroy_leftovers, owner_stamp, RuntimePaths};

/// A state dir without an owner file younger than this may still be being created.
const CREATION_GRACE: Duration = Duration::from_secs(30);

/// What a collection removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    pub removed: Vec<String>,
    pub failed: Vec<(String, String)>,
}

fn owner_alive(stamp: &str) -> bool {
    let Some(pid) = stamp.split(' ').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    // A zombie owner is dead too: it was killed and only waits for its parent to reap it.
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').and_then(|i| s[i + 2..].chars().next()))
        == Some('Z');
    !zombie && owner_stamp(pid).as_deref() == Some(stamp.trim())
}

/// Collects dead sandboxes and orphaned cgroups (`agentrun gc`, the daemon's start).
pub fn collect(paths: &RuntimePaths) -> GcReport {
    let mut report = collect_dead_state_dirs(paths);
    collect_orphan_cgroups(paths, &mut report);
    report
}

/// What each run does before it starts: collects dead sandboxes of this state dir, and
/// orphaned cgroups at most once per [`CREATION_GRACE`] (they only count as orphans after
/// that long anyway, and listing every controller's cgroups costs more than the rest of the
/// collection).
pub fn collect_before_run(paths: &RuntimePaths) -> GcReport {
    let mut report = collect_dead_state_dirs(paths);
    let stamp = paths.state_dir.join("gc-cgroups.stamp");
    let due = fs::metadata(&stamp)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_none_or(|age| age >= CREATION_GRACE);
    if due {
        // Dropped: without the stamp the next run scans again; it is only a rate limit.
        let _ = fs::write(&stamp, b"");
        collect_orphan_cgroups(paths, &mut report);
    }
    report
}

/// Sandboxes of this state dir whose owner is gone: everything of theirs removed.
fn collect_dead_state_dirs(paths: &RuntimePaths) -> GcReport {
    let cgroup = CgroupMode::for_sandboxes(&crate::host::privilege::Privilege::detect());
    let mut report = GcReport::default();
    if let Ok(rd) = fs::read_dir(paths.sandboxes()) {
        for entry in rd.flatten() {
            let Ok(id) = entry.file_name().into_string() else {
                continue;
            };
            let dead = match fs::read_to_string(entry.path().join("owner")) {
                Ok(stamp) if !stamp.trim().is_empty() => !owner_alive(&stamp),
                // No stamp yet: being created, unless it has been like that for a while.
                _ => entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| SystemTime::now().duration_since(t).ok())
                    .is_some_and(|age| age > CREATION_GRACE),
            };
            if dead {
                record(&mut report, &id, destroy_leftovers(paths, &id, cgroup));
            }
        }
    }
    report
}

/// Sandboxes of this state dir owned by process `pid`, now dead: everything of theirs removed
/// (what [`crate::host::guard`]'s janitor collects once the run it guards has died).
pub fn collect_owned_by(paths: &RuntimePaths, pid: u32) -> GcReport {
    let cgroup = CgroupMode::for_sandboxes(&crate::host::privilege::Privilege::detect());
    let mut report = GcReport::default();
    let Ok(rd) = fs::read_dir(paths.sandboxes()) else {
        return report;
    };
    for entry in rd.flatten() {
        let Ok(id) = entry.file_name().into_string() else {
            continue;
        };
        let Ok(stamp) = fs::read_to_string(entry.path().join("owner")) else {
            continue;
        };
        let owner = stamp.split(' ').next().and_then(|p| p.parse::<u32>().ok());
        if owner == Some(pid) && !owner_alive(&stamp) {
            record(&mut report, &id, destroy_leftovers(paths, &id, cgroup));
        }
    }
    report
}

/// Empty cgroups under `agentrun/` that no sandbox of this state dir owns and that have
/// been so for [`CREATION_GRACE`].
fn collect_orphan_cgroups(paths: &RuntimePaths, report: &mut GcReport) {
    let Some(cg) = CgroupMode::for_sandboxes(&crate::host::privilege::Privilege::detect()) else {
        return;
    };
    for id in cg.sandbox_ids() {
        // Cgroups are host-wide while state dirs are per AGENTRUN_STATE_DIR: a cgroup
        // without a state dir here may belong to another agentrun (a daemon, a test).
        // Only an empty one that has been so for a while is an orphan. A sandbox's state
        // dir exists before its cgroup and outlives it: check it now, not against a
        // listing made earlier, or a run created meanwhile would look orphaned.
        if paths.sandboxes().join(&id).exists() {
            continue;
        }
        if cg.pids(&id).is_empty() && cg.age(&id).is_some_and(|a| a > CREATION_GRACE) {
            cg.remove(&id);
            report.removed.push(id);
        }
    }
}

fn record(report: &mut GcReport, id: &str, r: Result<(), RuntimeError>) {
    match r {
        Ok(()) => report.removed.push(id.to_owned()),
        Err(e) => report.failed.push((id.to_owned(), e.to_string())),
    }
}
