//! The errors people hit first (issue 19): each is one line saying what to do, with a
//! non-zero exit, and leaves nothing behind. Every host condition is made for the one
//! process under test, never host-wide: not root with setpriv; no user namespaces and a
//! missing cgroup controller in a private mount namespace (`unshare -m`: a bind mount over
//! the sysctl, the pids hierarchy unmounted); no Landlock with a seccomp filter that makes
//! `landlock_create_ruleset` fail with ENOSYS, as on a kernel without it; a missing
//! `debootstrap` or `agentrun` with PATH.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::*;

/// `agentrun ARGS` as `cmd` (setpriv, unshare, ...) runs it, with private root/state dirs.
fn wrapped(prefix: &[&str], args: &[&str], root: &Path, state: &Path) -> Command {
    let mut cmd = Command::new(prefix[0]);
    cmd.args(&prefix[1..])
        .arg(agentrun_bin())
        .args(args)
        .env("AGENTRUN_ROOT", root)
        .env("AGENTRUN_STATE_DIR", state)
        .env_remove("TRACEPARENT");
    cmd
}

fn run(cmd: Command) -> RunOutput {
    run_with_timeout(cmd, None, Duration::from_secs(60))
}

/// No sandbox left in the state dir `state` after a run (its `sandboxes/` and `containers/`
/// empty or absent), nor any of its mounts.
fn assert_empty(state: &Path, out: &RunOutput) {
    for sub in ["sandboxes", "containers"] {
        let left: Vec<PathBuf> = fs::read_dir(state.join(sub))
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(
            left.is_empty(),
            "left in {}: {left:?}\n{out}",
            state.display()
        );
    }
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let state_s = state.to_string_lossy();
    assert!(
        !mounts.contains(&*state_s),
        "mounts left in {state_s}\n{out}"
    );
}

/// An ordinary user may run agentrun (rootless mode, docs/rootless.md), but not with the
/// store and state dirs of another user: one line naming the path, nothing made (`volume`
/// and `snapshot` too: they are rootless now).
#[test]
fn not_root_gets_one_line_errors_and_nothing_made() {
    let Some(_l) = setup() else { return };
    let dir = tempdir(); // root's, 0700: uid 1000 can make nothing in it
    let (root, state) = (dir.path().join("root"), dir.path().join("state"));
    let setpriv = [
        "setpriv",
        "--reuid",
        "1000",
        "--regid",
        "1000",
        "--clear-groups",
    ];
    let denied = format!(
        "agentrun: create {}: Permission denied (os error 13)",
        root.display()
    );
    for (args, want) in [
        (&["exec", "--", "true"][..], denied.as_str()),
        (&["serve"][..], denied.as_str()),
        (&["image", "ls"][..], denied.as_str()),
        (&["gc"][..], denied.as_str()),
        (&["mcp"][..], denied.as_str()),
        (&["volume", "ls"][..], denied.as_str()),
        (&["snapshot", "ls"][..], denied.as_str()),
    ] {
        let out = run(wrapped(&setpriv, args, &root, &state));
        out.assert_agentrun_error();
        assert_eq!(out.stderr().trim(), want, "{out}");
        assert!(!root.exists() && !state.exists(), "{out}");
    }
}

#[test]
fn no_user_namespaces_says_which_sysctl() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let state = dir.path().join("state");
    let zero = dir.path().join("max_user_namespaces");
    fs::write(&zero, "0\n").unwrap();
    // A private mount namespace where the sysctl reads 0; the host's stays as it is.
    let script = format!(
        "mount --bind {} /proc/sys/user/max_user_namespaces && exec \"$@\"",
        zero.display()
    );
    let prefix = ["unshare", "-m", "sh", "-c", &script, "sh"];
    let out = run(wrapped(
        &prefix,
        &["exec", "--no-daemon", "--image", "busybox", "--", "true"],
        &busybox_root(),
        &state,
    ));
    out.assert_agentrun_error();
    let err = out.stderr();
    assert!(
        err.starts_with(
            "agentrun: user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0): \
             enable them with `sysctl -w user.max_user_namespaces="
        ),
        "{out}"
    );
    assert_empty(&state, &out);
    // The daemons say it at start, not at their first sandbox.
    let out = run(wrapped(&prefix, &["serve"], &busybox_root(), &state));
    out.assert_agentrun_error();
    assert!(
        out.stderr().contains("sysctl -w user.max_user_namespaces="),
        "{out}"
    );
    assert!(!state.join("agentrun.sock").exists(), "{out}");
}

#[test]
fn a_missing_cgroup_controller_is_named_with_its_fix() {
    let Some(_l) = setup() else { return };
    let mode = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let pids_v1 = mode
        .lines()
        .any(|l| l.split(' ').nth(4) == Some("/sys/fs/cgroup/pids"));
    let dir = tempdir();
    let state = dir.path().join("state");
    // v1/hybrid: the pids hierarchy unmounted; v2: a cgroup.controllers without pids.
    let script = if pids_v1 {
        "umount -l /sys/fs/cgroup/pids && exec \"$@\"".to_string()
    } else {
        let fake = dir.path().join("cgroup.controllers");
        fs::write(&fake, "cpuset cpu io memory\n").unwrap();
        format!(
            "mount --bind {} /sys/fs/cgroup/cgroup.controllers && exec \"$@\"",
            fake.display()
        )
    };
    let prefix = ["unshare", "-m", "sh", "-c", &script, "sh"];
    let out = run(wrapped(
        &prefix,
        &["exec", "--no-daemon", "--image", "busybox", "--", "true"],
        &busybox_root(),
        &state,
    ));
    out.assert_agentrun_error();
    let err = out.stderr();
    assert!(
        err.starts_with("agentrun: the cgroup controller 'pids' is missing"),
        "{out}"
    );
    assert!(err.contains("process-count limits"), "{out}");
    if pids_v1 {
        assert!(
            err.contains("mount -t cgroup -o pids pids /sys/fs/cgroup/pids"),
            "{out}"
        );
    } else {
        assert!(err.contains("echo +pids >"), "{out}");
    }
    assert_empty(&state, &out);
    // `agentrun info` names it too.
    let out = run(wrapped(&prefix, &["info"], &busybox_root(), &state));
    assert!(
        out.success().contains("cgroup controllers missing: pids"),
        "{out}"
    );
    let out = run(wrapped(
        &prefix,
        &["info", "--json"],
        &busybox_root(),
        &state,
    ));
    let v: serde_json::Value = serde_json::from_str(&out.success()).expect("info --json");
    assert_eq!(
        v["cgroup_controllers_missing"],
        serde_json::json!(["pids"]),
        "{out}"
    );
}

/// x86_64 syscall number of landlock_create_ruleset.
#[cfg(target_arch = "x86_64")]
const SYS_LANDLOCK_CREATE_RULESET: u32 = 444;

/// Before exec: a seccomp filter under which `landlock_create_ruleset` fails with ENOSYS, as
/// on a kernel without Landlock (every other syscall allowed).
#[cfg(target_arch = "x86_64")]
fn without_landlock(cmd: &mut Command) {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    let stmt = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u16, k: u32, jt: u8, jf: u8| libc::sock_filter { code, jt, jf, k };
    let ld = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    let jeq = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    let ret = (libc::BPF_RET | libc::BPF_K) as u16;
    let filter = [
        stmt(ld, 4), // seccomp_data.arch
        jump(jeq, AUDIT_ARCH_X86_64, 1, 0),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
        stmt(ld, 0), // seccomp_data.nr
        jump(jeq, SYS_LANDLOCK_CREATE_RULESET, 0, 1),
        stmt(ret, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        stmt(ret, libc::SECCOMP_RET_ALLOW),
    ];
    // SAFETY: between fork and exec the closure only makes two syscalls on memory it owns
    // (the filter is moved in and outlives them).
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn landlock_absent_says_what_is_not_enforced() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let state = dir.path().join("state");
    let mut info = wrapped(&["env"], &["info"], &busybox_root(), &state);
    without_landlock(&mut info);
    let out = run(info);
    let stdout = out.success();
    assert!(stdout.contains("landlock:          none (ABI 0)"), "{out}");
    assert!(
        stdout.contains("the profile's file access rules (read-only and writable paths)")
            && stdout.contains("are NOT enforced"),
        "{out}"
    );
    // A run still runs (the rest of the sandbox confines it), with the warning on stderr.
    let mut exec = wrapped(
        &["env"],
        &[
            "exec",
            "--no-daemon",
            "--image",
            "busybox",
            "--",
            "echo",
            "ran",
        ],
        &busybox_root(),
        &state,
    );
    without_landlock(&mut exec);
    let out = run(exec);
    assert_eq!(out.success(), "ran\n", "{out}");
    let warnings: Vec<String> = out.stderr().lines().map(str::to_owned).collect();
    assert_eq!(warnings.len(), 1, "{out}");
    assert!(
        warnings[0].starts_with("agentrun: warning: Landlock is not available on this kernel")
            && warnings[0].contains("are NOT enforced"),
        "{out}"
    );
    assert_empty(&state, &out);
}

/// A copy of the recipes at `repo/images`, in a tree without a target/ dir, so which agentrun
/// a recipe finds depends on PATH and AGENTRUN_BIN only.
fn recipes_copy(repo: &Path) -> PathBuf {
    fs::create_dir_all(repo).unwrap();
    let images = repo.join("images");
    let status = Command::new("cp")
        .arg("-r")
        .arg(workspace_root().join("images"))
        .arg(&images)
        .status()
        .unwrap();
    assert!(status.success());
    images
}

fn recipe(images: &Path, name: &str, path: &str, args: &[&Path]) -> Command {
    let mut cmd = Command::new(images.join(name).join("build.sh"));
    cmd.args(args).env("PATH", path).env_remove("AGENTRUN_BIN");
    cmd
}

#[test]
fn a_recipe_without_agentrun_says_how_to_get_it() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    // recipe.sh's <repo> is tree/.
    let tree = dir.path().join("repo");
    let images = recipes_copy(&tree);
    let rootfs = dir.path().join("rootfs");
    let mut cmd = recipe(
        &images,
        "busybox",
        "/usr/bin:/bin",
        &[Path::new("--import"), &rootfs],
    );
    cmd.env("AGENTRUN_ROOT", dir.path().join("root"));
    let out = run(cmd);
    assert_eq!(out.code(), 1, "{out}");
    assert_eq!(
        out.stderr().trim(),
        format!(
            "build.sh: agentrun not found (not in {0}/target/release, {0}/target/debug or on \
             PATH): build it (cargo build --release -p agentrun), install it (cargo install \
             --path crates/agentrun) or set AGENTRUN_BIN",
            tree.display()
        ),
        "{out}"
    );
    // Found before building anything.
    assert!(!rootfs.exists(), "{out}");

    // With agentrun on PATH, the same recipe imports with it.
    let bin = dir.path().join("bin");
    fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(agentrun_bin(), bin.join("agentrun")).unwrap();
    let root = dir.path().join("root");
    let mut cmd = recipe(
        &images,
        "busybox",
        &format!("{}:/usr/bin:/bin", bin.display()),
        &[Path::new("--import"), &rootfs],
    );
    cmd.env("AGENTRUN_ROOT", &root);
    let out = run(cmd);
    assert_eq!(out.code(), 0, "{out}");
    assert!(
        out.stderr().contains("imported as image 'busybox'"),
        "{out}"
    );
    let out = agentrun(["image", "ls"]).root(&root).run();
    assert!(
        out.success().lines().any(|l| l.starts_with("busybox ")),
        "{out}"
    );
}

#[test]
fn a_recipe_without_debootstrap_says_how_to_install_it() {
    let Some(_l) = setup() else { return };
    // Debian installs debootstrap in /usr/sbin: a PATH without it is a host without it.
    for d in ["/usr/bin", "/bin"] {
        if Path::new(d).join("debootstrap").exists() {
            panic!("debootstrap in {d}: this test needs it out of PATH=/usr/bin:/bin");
        }
    }
    let dir = tempdir();
    let rootfs = dir.path().join("rootfs");
    let mut cmd = Command::new(workspace_root().join("images/python/build.sh"));
    cmd.arg(&rootfs).env("PATH", "/usr/bin:/bin");
    let out = run(cmd);
    assert_eq!(out.code(), 1, "{out}");
    assert_eq!(
        out.stderr().trim(),
        "build.sh: debootstrap not found: install it (apt-get install debootstrap)",
        "{out}"
    );
    assert!(!rootfs.exists(), "{out}");
}
