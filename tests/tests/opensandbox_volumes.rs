//! OpenSandbox `volumes` through `agentrun serve --listen --volume-root DIR`, driven by the
//! official SDK (`tests/opensandbox/sdk_volumes.py`, sync and async): host volumes under the
//! root (read-write, read-only, subPath, files owned like the directory on the host), named
//! (`pvc`) volumes agentrun keeps (made on first use, kept across sandboxes, held while used,
//! `deleteOnSandboxTermination`, `agentrun volume ls/inspect/rm`), and every way out of a
//! root refused with a 400 (paths outside, `..`, symlinks, a symlink one sandbox planted for
//! the next). Each test ends with the daemon stopped and nothing left on the host.

use std::os::unix::fs::symlink;

use agentrun_e2e::osb::*;
use agentrun_e2e::*;

/// A volume root the daemon allows and a directory outside it, as the scenarios expect.
struct Dirs {
    _tmp: tempfile::TempDir,
    root: String,
    outside: String,
}

fn dirs() -> Dirs {
    let tmp = tempdir();
    let root = tmp.path().join("root");
    let outside = tmp.path().join("outside");
    for d in [root.join("seed"), root.join("owned"), outside.clone()] {
        std::fs::create_dir_all(&d).unwrap();
    }
    std::fs::write(root.join("seed/hello.txt"), "hello from the host").unwrap();
    std::fs::write(outside.join("secret.txt"), "host secret").unwrap();
    std::os::unix::fs::chown(root.join("owned"), Some(1234), Some(1234)).unwrap();
    symlink(&outside, root.join("escape")).unwrap();
    Dirs {
        root: root.display().to_string(),
        outside: outside.display().to_string(),
        _tmp: tmp,
    }
}

/// Removes the named volumes a test made (names ending in its suffix), passed or failed: the
/// daemon's store is the host's.
struct VolumeSweep(String);

impl Drop for VolumeSweep {
    fn drop(&mut self) {
        // Alive until its commands have run (a temporary's state dir would be removed first,
        // then made again by the command, and left behind).
        let d = Daemon::unstarted();
        let ls = d.agentrun(["volume", "ls", "--json"]).run();
        let Ok(all) = serde_json::from_str::<Vec<serde_json::Value>>(&ls.stdout()) else {
            return;
        };
        for v in all {
            if let Some(name) = v["name"].as_str().filter(|n| n.ends_with(&self.0)) {
                let _ = d.agentrun(["volume", "rm", name]).run();
            }
        }
    }
}

fn run_volumes(name: &str) {
    run_volumes_with(name, false)
}

/// Runs scenario `name` against a daemon allowing the scenario's volume root, given on the
/// command line or (`config`) in a `--config` file's `volume_roots`.
fn run_volumes_with(name: &str, config: bool) {
    let Some(_lock) = setup() else { return };
    let dirs = dirs();
    let config_file = dirs._tmp.path().join("serve.toml");
    std::fs::write(&config_file, format!("volume_roots = [{:?}]\n", dirs.root)).unwrap();
    let config_path = config_file.display().to_string();
    let extra: [&str; 2] = if config {
        ["--config", &config_path]
    } else {
        ["--volume-root", &dirs.root]
    };
    let suffix = format!("{}-{}", std::process::id(), name.replace('_', "-"));
    let _sweep = VolumeSweep(suffix.clone());
    let (d, domain) = start(&[], &extra);
    scenario(
        &d,
        &domain,
        &format!("volumes:{name}"),
        &[
            ("OSB_VOLUME_ROOT", dirs.root.clone()),
            ("OSB_OUTSIDE", dirs.outside.clone()),
            ("OSB_SUFFIX", suffix),
        ],
    );
    stop_clean(d);
    assert_eq!(
        std::fs::read_to_string(format!("{}/secret.txt", dirs.outside)).unwrap(),
        "host secret"
    );
}

#[test]
fn host_volumes_mount_read_write_read_only_and_sub_paths_owned_like_their_directory() {
    run_volumes("host_volumes");
}

#[test]
fn host_paths_outside_the_volume_roots_and_escapes_get_400() {
    // The root comes from the config file's `volume_roots` here.
    run_volumes_with("host_refused", true);
}

#[test]
fn host_volumes_with_the_async_sdk() {
    run_volumes("host_volumes_async");
}

#[test]
fn named_volumes_made_by_the_cli_keep_their_owner_with_the_sync_sdk() {
    run_volumes("named_volumes_sync");
}

#[test]
fn named_volumes_are_kept_across_sandboxes_and_held_while_used() {
    run_volumes("named_volumes");
}

#[test]
fn at_shutdown_volumes_made_to_go_with_their_sandbox_go_and_the_others_stay() {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start(&[], &[]);
    let suffix = format!("{}-shutdown", std::process::id());
    let _sweep = VolumeSweep(suffix.clone());
    scenario(
        &d,
        &domain,
        "volumes:left_running",
        &[("OSB_SUFFIX", suffix.clone())],
    );
    stop_clean(d);
    // A state dir of its own, alive until its commands have run: the stopped daemon's was
    // removed with it.
    let after = Daemon::unstarted();
    let ls = after.agentrun(["volume", "ls", "--json"]).run();
    let names: Vec<String> = serde_json::from_str::<Vec<serde_json::Value>>(&ls.stdout())
        .unwrap_or_else(|e| panic!("{e}: {ls}"))
        .iter()
        .map(|v| v["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(!names.contains(&format!("gone-{suffix}")), "{names:?}");
    let kept = format!("kept-{suffix}");
    let kept_entry = serde_json::from_str::<Vec<serde_json::Value>>(&ls.stdout()).unwrap();
    let kept_entry = kept_entry.iter().find(|v| v["name"] == kept.as_str());
    assert!(kept_entry.is_some_and(|v| v["in_use"] == false), "{ls}");
    let rm = after.agentrun(["volume", "rm", &kept]).run();
    assert_eq!(rm.status.code(), Some(0), "{rm}");
}

#[test]
fn a_volume_root_that_does_not_exist_stops_serve_with_one_line() {
    let Some(_lock) = setup() else { return };
    let d = Daemon::unstarted();
    let out = d
        .agentrun([
            "serve",
            "--listen",
            "127.0.0.1:1",
            "--volume-root",
            "/nonexistent/agentrun-volume-root",
        ])
        .timeout(std::time::Duration::from_secs(30))
        .run();
    assert_eq!(out.status.code(), Some(125), "{out}");
    let err = out.stderr();
    assert!(
        err.contains("--volume-root") && err.contains("/nonexistent/agentrun-volume-root"),
        "{out}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{out}");
}

#[test]
fn volume_cli_creates_lists_inspects_and_removes_named_volumes() {
    let Some(_lock) = setup() else { return };
    let root = tempdir();
    let d = Daemon::unstarted();
    let cli = |args: &[&str]| d.agentrun(args).env("AGENTRUN_ROOT", root.path()).run();
    let out = cli(&["volume", "create", "cli-vol", "--owner", "1234:1235"]);
    assert_eq!(out.status.code(), Some(0), "{out}");
    let data = root.path().join("volumes/cli-vol/data");
    let meta = std::fs::metadata(&data).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.uid(), meta.gid()), (1234, 1235));
    let out = cli(&["volume", "create", "cli-vol"]);
    assert_ne!(out.status.code(), Some(0), "{out}");
    assert!(out.stderr().contains("already exists"), "{out}");
    for bad in [
        &["volume", "create", "Bad_Name"][..],
        &["volume", "rm", "nope"],
        &["volume", "create", "x", "--owner", "a:b"],
    ] {
        let out = cli(bad);
        assert_eq!(out.status.code(), Some(125), "{bad:?}: {out}");
        assert_eq!(out.stderr().trim().lines().count(), 1, "{bad:?}: {out}");
    }
    let out = cli(&["volume", "ls"]);
    assert!(out.stdout().contains("cli-vol\tno\t"), "{out}");
    let out = cli(&["volume", "inspect", "cli-vol"]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout()).unwrap();
    assert_eq!(v[0]["mountpoint"], data.display().to_string(), "{out}");
    assert_eq!(v[0]["created_by"], "cli", "{out}");
    // prune without --force on a pipe refuses, with one line; with it, removes.
    let out = cli(&["volume", "prune"]);
    assert_ne!(out.status.code(), Some(0), "{out}");
    assert!(out.stderr().contains("--force"), "{out}");
    assert!(data.exists());
    let out = cli(&["volume", "prune", "--force"]);
    assert_eq!(out.stdout().trim(), "cli-vol", "{out}");
    assert!(!root.path().join("volumes/cli-vol").exists());
}

/// `agentrun exec --volume NAME:SANDBOX[:ro]` as root: a volume made on first use (the
/// CLI's), a root-owned one written as root, one of another owner written as that owner on
/// the host (root inside), `:ro` read-only, files kept from one run to the next.
#[test]
fn exec_volume_mounts_named_volumes_as_root() {
    let Some(_lock) = setup() else { return };
    use std::os::unix::fs::MetadataExt;
    let root = tempdir();
    let d = Daemon::unstarted();
    let cli = |args: &[&str]| d.agentrun(args).env("AGENTRUN_ROOT", root.path()).run();
    cli(&["volume", "create", "owned", "--owner", "1234:1235"]).success();
    let out = cli(&[
        "exec",
        "--no-daemon",
        "--volume",
        "made:/m",
        "--volume",
        "owned:/o",
        "--",
        "sh",
        "-c",
        "echo m > /m/f && echo o > /o/f && stat -c %u /m/f /o/f",
    ]);
    assert_eq!(out.success(), "0\n0\n", "{out}");
    let vols = root.path().join("volumes");
    let m = std::fs::metadata(vols.join("made/data/f")).unwrap();
    let o = std::fs::metadata(vols.join("owned/data/f")).unwrap();
    assert_eq!((m.uid(), o.uid(), o.gid()), (0, 1234, 1235));
    let out = cli(&["volume", "inspect", "made"]);
    let v: serde_json::Value = serde_json::from_str(&out.success()).unwrap();
    assert_eq!(v[0]["created_by"], "cli", "{out}");
    let out = cli(&[
        "exec",
        "--no-daemon",
        "--volume",
        "made:/m:ro",
        "--",
        "sh",
        "-c",
        "cat /m/f; echo x > /m/g 2>/dev/null && echo WROTE; echo done",
    ]);
    assert_eq!(out.success(), "m\ndone\n", "{out}");
    assert!(!vols.join("made/data/g").exists());
    let out = cli(&["exec", "--no-daemon", "--volume", "made", "--", "true"]);
    out.assert_agentrun_error();
}
