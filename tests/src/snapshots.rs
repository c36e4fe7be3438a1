//! Snapshots a test made in an image store, found and removed after it, passed or failed.

use std::collections::BTreeSet;
use std::path::Path;

use crate::{Daemon, TestLock};

/// The snapshot ids in the image store `root` (`None`: the host's), by `agentrun snapshot ls
/// --json`.
pub fn snapshot_ids(root: Option<&Path>) -> BTreeSet<String> {
    // Bound to a name: it must outlive the command (its drop removes the state dir, which a
    // command run after it would make again, and leave behind).
    let d = Daemon::unstarted();
    let mut a = d.agentrun(["snapshot", "ls", "--json"]);
    if let Some(r) = root {
        a = a.env("AGENTRUN_ROOT", r);
    }
    let out = a.run();
    let v: Vec<serde_json::Value> = serde_json::from_str(&out.success())
        .unwrap_or_else(|e| panic!("snapshot ls --json: {e}\n{out}"));
    v.iter()
        .filter_map(|s| s["id"].as_str().map(str::to_owned))
        .collect()
}

/// On drop, removes every snapshot made in the host's store since it was made. It cannot
/// tell whose a snapshot is, so it needs the exclusive e2e lock ([`crate::setup_exclusive`]):
/// under the shared one it removed the snapshot of a test running beside it.
pub struct SnapshotSweep {
    before: BTreeSet<String>,
}

impl SnapshotSweep {
    /// A sweep of the host's store.
    pub fn new(lock: &TestLock) -> Self {
        assert!(
            lock.is_exclusive(),
            "SnapshotSweep needs the exclusive e2e lock (setup_exclusive)"
        );
        SnapshotSweep {
            before: snapshot_ids(None),
        }
    }
}

impl Drop for SnapshotSweep {
    fn drop(&mut self) {
        let d = Daemon::unstarted();
        for id in snapshot_ids(None).difference(&self.before) {
            let _ = d.agentrun(["snapshot", "rm", id]).run();
        }
    }
}

/// The OpenSandbox scenario `name` (`file:function`, see [`crate::osb::scenario`]) against a
/// daemon started with `daemon_args`, under the exclusive e2e lock and a [`SnapshotSweep`];
/// the daemon stopped with nothing left on the host. Its stdout, or "" when the test is
/// skipped (not root, with `AGENTRUN_E2E_ALLOW_SKIP=1`).
pub fn swept_scenario(name: &str, daemon_args: &[&str]) -> String {
    let Some(lock) = crate::setup_exclusive() else {
        return String::new();
    };
    let _sweep = SnapshotSweep::new(&lock);
    let (d, domain) = crate::osb::start(&[], daemon_args);
    let out = crate::osb::scenario(&d, &domain, name, &[]);
    crate::osb::stop_clean(d);
    out
}
