//! OpenSandbox snapshots through `agentrun serve --listen`, driven by the official SDK
//! (`tests/opensandbox/sdk_snapshots.py`, sync and async): a sandbox's files kept as a
//! snapshot (an image in the store), sandboxes made from it, list/get/delete, the
//! files-only pause to disk, `agentrun snapshot`, spans and audit records; and every failure
//! the issue names: a gone sandbox, a deleted snapshot, another API key's snapshot, the size
//! limit, a pause during a snapshot, a full disk, a daemon killed mid-snapshot. Each test ends
//! with the daemon stopped, nothing left on the host and no snapshot of its own left in the
//! store.

use std::path::PathBuf;
use std::time::Duration;

use agentrun_e2e::osb::*;
use agentrun_e2e::snapshots::{snapshot_ids, swept_scenario, SnapshotSweep};
use agentrun_e2e::*;

fn run_snapshots(name: &str) -> String {
    swept_scenario(&format!("snapshots:{name}"), &[])
}

#[test]
fn sdk_sync_snapshot_list_get_restore_delete() {
    run_snapshots("sync_flow");
}

#[test]
fn sdk_async_snapshot_restore_delete() {
    run_snapshots("async_flow");
}

#[test]
fn pause_to_disk_is_snapshot_delete_and_create_from_it_with_the_files() {
    let out = run_snapshots("pause_to_disk");
    if !out.is_empty() {
        println!(
            "snapshot of a paused sandbox: {} ms; create from it: {} ms",
            printed(&out, "SNAPSHOT_MS"),
            printed(&out, "RESUME_MS")
        );
    }
}

#[test]
fn pause_to_disk_gives_the_shell_back_and_resume_keeps_id_endpoints_and_files() {
    let out = run_snapshots("pause_to_disk_same_id");
    if !out.is_empty() {
        println!(
            "pause to disk: {} ms; resume from disk to the first command: {} ms",
            printed(&out, "PAUSE_TO_DISK_MS"),
            printed(&out, "RESUME_FROM_DISK_MS")
        );
    }
}

#[test]
fn cli_snapshot_create_ls_inspect_rm() {
    run_snapshots("cli");
}

#[test]
fn gone_sandboxes_unknown_and_deleted_snapshots_and_bad_bodies_are_refused() {
    run_snapshots("bad_input");
}

#[test]
fn a_pause_during_a_snapshot_waits_for_it_and_stays() {
    run_snapshots("pause_during_snapshot");
}

#[test]
fn a_snapshot_over_max_snapshot_is_a_400_with_its_size() {
    swept_scenario("snapshots:size_limit", &["--max-snapshot", "1M"]);
}

#[test]
fn another_api_keys_snapshots_are_404_and_the_owners_survive_a_restart() {
    let Some(lock) = setup_exclusive() else {
        return;
    };
    let _sweep = SnapshotSweep::new(&lock);
    let (k1, k2) = ("snapshot-owner-key-1", "snapshot-other-key-2");
    let (d, domain) = start(&[], &["--api-key", k1]);
    let key = |k: &str| vec![("OSB_API_KEY", k.to_owned())];
    let out = scenario(&d, &domain, "snapshots:make_for_another_key", &key(k1));
    let id = printed(&out, "OWNED_SNAPSHOT").to_owned();
    stop_clean(d);
    let (d, domain) = start(&[], &["--api-key", k2]);
    let mut env = key(k2);
    env.push(("OSB_SNAPSHOT_ID", id.clone()));
    scenario(&d, &domain, "snapshots:other_key_sees_nothing", &env);
    stop_clean(d);
    let (d, domain) = start(&[], &["--api-key", k1]);
    let mut env = key(k1);
    env.push(("OSB_SNAPSHOT_ID", id));
    scenario(&d, &domain, "snapshots:owner_sees_it", &env);
    stop_clean(d);
}

/// A small tmpfs (in a temp dir of its own, removed after), unmounted on drop.
struct Tmpfs(PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl Tmpfs {
    fn new(size: &str) -> Tmpfs {
        let dir = tempdir();
        let p = dir.path().join("store");
        std::fs::create_dir(&p).unwrap();
        host(
            "mount",
            [
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                p.to_str().unwrap(),
            ],
        )
        .success();
        Tmpfs(p, dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = host("umount", ["-l", self.0.to_str().unwrap()]);
    }
}

#[test]
fn a_full_disk_fails_the_snapshot_leaves_nothing_and_the_sandbox_runs_on() {
    let Some(_lock) = setup() else { return };
    let store = Tmpfs::new("30m");
    let root = store.0.display().to_string();
    let (d, domain) = start(&[("AGENTRUN_ROOT", root.clone())], &[]);
    scenario(
        &d,
        &domain,
        "snapshots:disk_full",
        &[("OSB_STORE", root.clone()), ("AGENTRUN_ROOT", root)],
    );
    stop_clean(d);
}

#[test]
fn a_daemon_killed_mid_snapshot_restarts_with_no_half_snapshot_and_nothing_left() {
    let Some(_lock) = setup() else { return };
    let store = tempdir();
    let root = store.path().display().to_string();
    let env = [("AGENTRUN_ROOT", root.clone())];
    let (mut d, domain) = start(&env, &[]);
    let out = scenario(&d, &domain, "snapshots:start_big_snapshot", &env);
    let id = printed(&out, "STARTED_SNAPSHOT").to_owned();
    // Killed while the layer is being written (its temp file is there).
    let tmp = store.path().join("tmp");
    let writing = wait_until(Duration::from_secs(60), || {
        std::fs::read_dir(&tmp)
            .ok()
            .and_then(|mut r| r.next())
            .map(|_| ())
    });
    assert!(
        writing.is_some(),
        "the snapshot never started writing\n{}",
        d.log()
    );
    d.kill9();
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(!left.is_empty(), "the kill came after the write");
    // Restarted: nothing of it listed, its temp files gone, no record of it.
    let domain2 = relaunch_after_kill9(&mut d);
    let leftover: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(
        leftover.is_empty(),
        "temp files after a restart: {leftover:?}"
    );
    let mut env2 = env.to_vec();
    env2.push(("OSB_SNAPSHOT_ID", id.clone()));
    scenario(&d, &domain2, "snapshots:nothing_listed", &env2);
    assert!(snapshot_ids(Some(store.path())).is_empty());
    let images = d
        .agentrun(["image", "ls"])
        .env("AGENTRUN_ROOT", &root)
        .run()
        .success();
    assert!(!images.contains(&id), "{images}");
    let records = std::fs::read_dir(store.path().join("records"))
        .unwrap()
        .count();
    assert_eq!(records, 0, "image records left: {images}");
    let _ = domain;
    stop_clean(d);
}

#[test]
fn snapshot_and_restore_spans_carry_sizes_and_durations_and_are_audited() {
    let Some(lock) = setup_exclusive() else {
        return;
    };
    let _sweep = SnapshotSweep::new(&lock);
    let audit = tempdir();
    let rx = agentrun_e2e::otlp::OtlpReceiver::grpc();
    let (d, domain) = start_observed(&rx, audit.path());
    let out = scenario(&d, &domain, "snapshots:observed", &[]);
    let (src, id, restored) = (
        printed(&out, "SOURCE").to_owned(),
        printed(&out, "SNAPSHOT_ID").to_owned(),
        printed(&out, "RESTORED").to_owned(),
    );
    let spans = wait_until(Duration::from_secs(30), || {
        let all = rx.spans();
        let has = |n: &str| all.iter().any(|s| s.name == n);
        (has("sandbox.snapshot") && has("sandbox.restore")).then_some(all)
    })
    .unwrap_or_else(|| panic!("no snapshot/restore spans: {:?}", rx.spans()));
    let snap = spans.iter().find(|s| s.name == "sandbox.snapshot").unwrap();
    assert_eq!(snap.attr("sandbox.id"), src);
    assert_eq!(snap.attr("sandbox.snapshot.id"), id);
    let bytes: u64 = snap
        .typed_attr("sandbox.snapshot.bytes", "int")
        .parse()
        .unwrap();
    assert!(bytes >= 70_000, "{bytes}");
    let ms: u64 = snap
        .typed_attr("sandbox.duration_ms", "int")
        .parse()
        .unwrap();
    snap.typed_attr("sandbox.frozen_ms", "int");
    assert!(
        snap.duration() >= Duration::from_millis(ms),
        "the span lasts what it says: {:?} {ms}",
        snap.duration()
    );
    let restore = spans.iter().find(|s| s.name == "sandbox.restore").unwrap();
    assert_eq!(restore.attr("sandbox.id"), restored);
    assert_eq!(restore.attr("sandbox.snapshot.id"), id);
    restore.typed_attr("sandbox.duration_ms", "int");
    let records = d
        .agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", audit.path())
        .run()
        .success();
    let recs: Vec<serde_json::Value> = records
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let find = |kind: &str, sandbox: &str| {
        recs.iter()
            .find(|r| r["kind"] == kind && r["sandbox_id"] == sandbox)
            .unwrap_or_else(|| panic!("no {kind} record of {sandbox}: {records}"))
    };
    let s = find("snapshot", &src);
    assert_eq!(s["resource"], id.as_str(), "{s}");
    assert_eq!(s["decision"], "ok", "{s}");
    assert_eq!(s["action"], "sandbox.snapshot", "{s}");
    let r = find("restore", &restored);
    assert_eq!(r["resource"], id.as_str(), "{r}");
    assert_eq!(r["decision"], "ok", "{r}");
    stop_clean(d);
}
