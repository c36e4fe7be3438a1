//! Fork, agentrun's extension of the OpenSandbox API (`POST /v1/sandboxes/{id}/fork`) and its
//! CLI (`agentrun fork`), driven around the official SDK (`tests/opensandbox/sdk_fork.py`):
//! a code context's 100 MB object kept in a file, the sandbox forked into 10 copies that
//! each have it, each a sandbox of its own and independent of the others and of the parent;
//! what is not carried (the context's memory) checked as not carried; the bad counts, the
//! bounds (--max-sandboxes, memory), unknown and paused sandboxes; the span and audit
//! record. Each test ends with the daemon stopped and nothing left on the host.

use std::collections::BTreeSet;
use std::time::Duration;

use agentrun_e2e::osb::*;
use agentrun_e2e::*;

/// Removes the snapshots a test's forks made in the host's store (the e2e lock is held: none
/// is another test's).
struct SnapshotSweep(BTreeSet<String>);

fn snapshot_ids() -> BTreeSet<String> {
    let out = Daemon::unstarted()
        .agentrun(["snapshot", "ls", "--json"])
        .run();
    let v: Vec<serde_json::Value> = serde_json::from_str(&out.success())
        .unwrap_or_else(|e| panic!("snapshot ls --json: {e}\n{out}"));
    v.iter()
        .filter_map(|s| s["id"].as_str().map(str::to_owned))
        .collect()
}

impl Drop for SnapshotSweep {
    fn drop(&mut self) {
        for id in snapshot_ids().difference(&self.0) {
            let _ = Daemon::unstarted().agentrun(["snapshot", "rm", id]).run();
        }
    }
}

#[test]
fn a_code_contexts_sandbox_forked_into_ten_copies_each_with_its_100_mb_state() {
    let Some(_lock) = setup() else { return };
    let _sweep = SnapshotSweep(snapshot_ids());
    let audit = tempdir();
    let rx = agentrun_e2e::otlp::OtlpReceiver::grpc();
    let mut env: Vec<(&str, String)> = rx.otel_env();
    env.push(("AGENTRUN_AUDIT_DIR", audit.path().display().to_string()));
    let (d, domain) = start(&env, &["--max-sandboxes", "14"]);
    let out = scenario(&d, &domain, "fork:big_context", &[]);
    println!(
        "fork of a 100 MB context's sandbox into 10: {} s; slowest first print of a copy: {} s",
        printed(&out, "FORK_S"),
        printed(&out, "FIRST_PRINT_MAX_S")
    );
    let snapshot = printed(&out, "SNAPSHOT").to_owned();
    let span = wait_until(Duration::from_secs(30), || {
        rx.spans().into_iter().find(|s| s.name == "sandbox.fork")
    })
    .unwrap_or_else(|| panic!("no sandbox.fork span: {:?}", rx.spans()));
    assert_eq!(span.attr("sandbox.snapshot.id"), snapshot);
    assert_eq!(span.typed_attr("sandbox.fork.count", "int"), "10");
    let bytes: u64 = span
        .typed_attr("sandbox.snapshot.bytes", "int")
        .parse()
        .unwrap();
    assert!(bytes >= 100 << 20, "{bytes}");
    span.typed_attr("sandbox.fork.snapshot_ms", "int");
    span.typed_attr("sandbox.fork.copies_ms", "int");
    assert_eq!(span.attr("sandbox.fork.ids").split(',').count(), 10);
    let records = d
        .agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", audit.path())
        .run()
        .success();
    let fork = records
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["kind"] == "fork")
        .unwrap_or_else(|| panic!("no fork audit record: {records}"));
    assert_eq!(fork["decision"], "ok", "{fork}");
    assert_eq!(fork["resource"], snapshot.as_str(), "{fork}");
    stop_clean(d);
}

#[test]
fn bad_counts_the_bounds_and_unknown_or_paused_sandboxes_are_refused() {
    let Some(_lock) = setup() else { return };
    let _sweep = SnapshotSweep(snapshot_ids());
    let (d, domain) = start(&[], &["--max-sandboxes", "4"]);
    scenario(&d, &domain, "fork:bad_input", &[]);
    stop_clean(d);
}

#[test]
fn agentrun_fork_prints_the_copies_ids() {
    let Some(_lock) = setup() else { return };
    let _sweep = SnapshotSweep(snapshot_ids());
    let (d, domain) = start(&[], &["--max-sandboxes", "6"]);
    scenario(&d, &domain, "fork:cli", &[]);
    stop_clean(d);
}
