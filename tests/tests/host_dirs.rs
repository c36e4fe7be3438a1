//! agentrun's image store and state dir, seen by another local user of the host.
//!
//! Both hold what no other user may reach: image layers (setuid binaries included), every
//! sandbox's root filesystem and what sandboxes write. The test runs a sandbox whose image and
//! writable layer have setuid-root binaries and a file written 0644, then, as an unprivileged
//! host user (`setpriv --reuid=65534 --regid=65534 --clear-groups`), tries to list, read and
//! execute everything under both directories.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::*;

/// Runs `script` with `sh` as uid/gid 65534 without supplementary groups.
fn as_nobody(script: &str) -> RunOutput {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
        "sh",
        "-c",
        script,
    ]);
    run_with_timeout(cmd, None, Duration::from_secs(30))
}

/// Every path under `dir` (not following links), found as root.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        out.push(p.clone());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, out);
        }
    }
}

fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// `/proc/PID/root/<tail>` of every process whose root holds `tail` (starting with
/// `content`): how root reaches a running sandbox's files.
fn cell_roots_holding(tail: &str, content: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        if !e
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let p = e.path().join("root").join(tail);
        if fs::read(&p).is_ok_and(|b| b.starts_with(content.as_bytes())) {
            found.push(p);
        }
    }
    found
}

#[test]
fn store_and_state_dir_are_unreachable_for_other_users() {
    let Some(_l) = setup() else { return };
    let base = tempdir();
    // Everything above the two directories is open: only their own modes may protect them.
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let root = base.path().join("root");
    let state = base.path().join("state");
    // As older agentrun versions left them.
    for d in [&root, &state] {
        fs::create_dir(d).unwrap();
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let work = base.path().join("work");
    fs::create_dir(&work).unwrap();
    images::busybox_variant(&work, &root, "suid", |rootfs| {
        // Named after an applet: busybox runs it (a copy with another name exits 127).
        fs::create_dir(rootfs.join("suid")).unwrap();
        let tool = rootfs.join("suid/true");
        fs::copy(rootfs.join("bin/busybox"), &tool).unwrap();
        fs::set_permissions(&tool, fs::Permissions::from_mode(0o4755)).unwrap();
    });
    let script =
        "mkdir /tmp/suid2 && cp /bin/busybox /tmp/suid2/true && chmod 4755 /tmp/suid2/true && \
                  echo sandbox-secret > /tmp/secret && chmod 644 /tmp/secret && \
                  echo ready && sleep 60";
    let mut sandbox = exec_with(["--image", "suid"], ["sh", "-c", script])
        .root(&root)
        .env("AGENTRUN_STATE_DIR", &state)
        .env("AGENTRUN_NO_DAEMON", "1")
        .timeout(Duration::from_secs(90))
        .spawn();
    let ready = wait_until(Duration::from_secs(60), || {
        sandbox.stdout_so_far().contains("ready").then_some(())
    });
    if ready.is_none() {
        let out = sandbox.wait_or_kill(Duration::from_secs(5));
        panic!("the sandbox never got ready\n{out}");
    }

    // What is there, as root sees it: the setuid binaries and the secret exist.
    let mut paths = Vec::new();
    walk(&root, &mut paths);
    walk(&state, &mut paths);
    let named = |tail: &str| -> Vec<PathBuf> {
        paths
            .iter()
            .filter(|p| p.ends_with(tail))
            .cloned()
            .collect()
    };
    let suid: Vec<PathBuf> = named("suid/true")
        .into_iter()
        .chain(named("suid2/true"))
        .collect();
    assert!(
        suid.iter().any(|p| p.starts_with(&root)),
        "a setuid file expected in the image's layer: {suid:?}"
    );
    // The cold run's shell mounts its rootfs in a mount namespace of its own: nothing of it is
    // under the state dir as the host sees it. The same file is still reachable through
    // /proc/PID/root of the sandbox's processes, which the probe below tries too.
    assert!(
        !suid.iter().any(|p| p.starts_with(&state)),
        "the shell's rootfs is reachable under the state dir on the host: {suid:?}"
    );
    let in_rootfs = cell_roots_holding("suid/true", "");
    assert!(
        !in_rootfs.is_empty(),
        "the image's setuid file expected through the sandbox's /proc/PID/root"
    );
    let suid: Vec<PathBuf> = suid.into_iter().chain(in_rootfs).collect();
    // The run's own files live in its cell's writable layer, a tmpfs mounted only in the
    // cell's mount namespace: no path under the state dir leads there (before cells, the
    // upper dir was). A host user could still try the cell's root through /proc.
    assert!(
        named("tmp/secret").is_empty(),
        "the run's writable layer is reachable under the host's directories: {:?}",
        named("tmp/secret")
    );
    let secrets = cell_roots_holding("tmp/secret", "sandbox-secret");
    let suid: Vec<PathBuf> = suid
        .into_iter()
        .chain(cell_roots_holding("tmp/suid2/true", ""))
        .collect();
    assert!(
        !secrets.is_empty(),
        "the sandbox's file expected through its process's /proc/PID/root"
    );
    for p in suid.iter().chain(&secrets) {
        assert!(
            fs::read(p).is_ok(),
            "root cannot read {} (the probe would prove nothing)",
            p.display()
        );
    }
    let dirs: Vec<&PathBuf> = paths
        .iter()
        .filter(|p| fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .collect();

    // Now as another user.
    let mut probe = String::new();
    for d in [&root, &state].into_iter().chain(dirs.iter().copied()) {
        probe.push_str(&format!(
            "ls {p} >/dev/null 2>&1 && echo \"LISTED {p}\"\n",
            p = quote(d)
        ));
    }
    for f in &suid {
        probe.push_str(&format!(
            "{p} >/dev/null 2>&1; rc=$?; [ $rc -ne 126 ] && [ $rc -ne 127 ] && echo \"RAN {p} ($rc)\"\n",
            p = quote(f)
        ));
    }
    for f in suid.iter().chain(&secrets) {
        probe.push_str(&format!(
            "cat {p} >/dev/null 2>&1 && echo \"READ {p}\"\n",
            p = quote(f)
        ));
    }
    probe.push_str("echo probed\n");
    let out = as_nobody(&probe);
    let stdout = out.success();
    assert!(stdout.contains("probed"), "{out}");
    let reached: Vec<&str> = stdout.lines().filter(|l| *l != "probed").collect();
    assert!(
        reached.is_empty(),
        "another user reached agentrun's directories:\n{}\n{out}",
        reached.join("\n")
    );

    // How: the directories were repaired.
    let meta = |p: &Path| fs::metadata(p).unwrap();
    assert_eq!(
        (
            meta(&root).mode() & 0o7777,
            meta(&root).uid(),
            meta(&root).gid()
        ),
        (0o700, 0, 0),
        "AGENTRUN_ROOT must be 0700 root:root"
    );
    assert_eq!(
        (
            meta(&state).mode() & 0o7777,
            meta(&state).uid(),
            meta(&state).gid()
        ),
        (0o710, 0, SANDBOX_UID_BASE),
        "AGENTRUN_STATE_DIR must be 0710 root:<sandbox gid>"
    );

    sandbox.signal(libc::SIGTERM);
    let out = sandbox.wait_or_kill(Duration::from_secs(30));
    assert_ne!(out.status.code(), Some(125), "{out}");
}
