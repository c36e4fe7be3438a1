//! Garbage collection: removes what runs killed with SIGKILL left behind.
//!
//! A sandbox's state dir records its owner (`pid starttime`). A sandbox whose owner is gone is
//! dead: its processes are killed (they usually died with the owner through PDEATHSIG), and
//! its cgroups, mounts, container state and state dir removed. Empty, old cgroups under
//! `agentrun/` without a state dir are removed too (one with processes may be another state
//! dir's live sandbox and is left alone). Run by `agentrun gc` and at the start of every run.

use std::fs;
use std::time::{Duration, SystemTime};

use crate::cgroup::CgroupMode;
use crate::error::RuntimeError;
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

/// Collects dead sandboxes.
pub fn collect(paths: &RuntimePaths) -> GcReport {
    let cgroup = CgroupMode::detect();
    let mut report = GcReport::default();
    let mut seen = Vec::new();
    if let Ok(rd) = fs::read_dir(paths.sandboxes()) {
        for entry in rd.flatten() {
            let Ok(id) = entry.file_name().into_string() else {
                continue;
            };
            seen.push(id.clone());
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
    if let Some(cg) = cgroup {
        for id in cg.sandbox_ids() {
            // Cgroups are host-wide while state dirs are per AGENTRUN_STATE_DIR: a cgroup
            // without a state dir here may belong to another agentrun (a daemon, a test).
            // Only an empty one that has been so for a while is an orphan. A sandbox's state
            // dir exists before its cgroup and outlives it: check it now, not against the
            // listing above, or a run created meanwhile would look orphaned.
            if seen.contains(&id) || paths.sandboxes().join(&id).exists() {
                continue;
            }
            if cg.pids(&id).is_empty() && cg.age(&id).is_some_and(|a| a > CREATION_GRACE) {
                cg.remove(&id);
                report.removed.push(id);
            }
        }
    }
    report
}

fn record(report: &mut GcReport, id: &str, r: Result<(), RuntimeError>) {
    match r {
        Ok(()) => report.removed.push(id.to_owned()),
        Err(e) => report.failed.push((id.to_owned(), e.to_string())),
    }
}
