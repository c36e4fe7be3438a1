//! The CLI around `exec`: `info`, `image add/ls/rm`, and how bad input is reported.

use std::ffi::CString;
use std::fs;
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::*;

/// Checks the binary and takes the shared lock; no root needed (argument errors).
fn setup_noroot() -> TestLock {
    require_bin();
    shared_lock()
}

#[test]
fn info_human_readable() {
    let Some(_l) = setup() else { return };
    let out = agentrun(["info"]).run();
    let stdout = out.success();
    assert!(
        stdout.to_lowercase().contains("landlock"),
        "info mentions Landlock\n{out}"
    );
    assert!(stdout.to_lowercase().contains("cgroup"), "{out}");
    assert!(stdout.to_lowercase().contains("seccomp"), "{out}");
}

#[test]
fn info_json_matches_host() {
    let Some(_l) = setup() else { return };
    let out = agentrun(["info", "--json"]).run();
    let stdout = out.success();
    let v: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("info --json: {e}\n{out}"));
    for key in [
        "landlock_abi",
        "user_namespaces",
        "cgroup",
        "seccomp",
        "idmapped_mounts",
    ] {
        assert!(v.get(key).is_some(), "info --json lacks {key:?}\n{out}");
    }
    let abi = v["landlock_abi"]
        .as_i64()
        .unwrap_or_else(|| panic!("landlock_abi is a number\n{out}"));
    assert!(abi >= 1, "landlock_abi >= 1 on this kernel\n{out}");
    assert_eq!(
        abi,
        host_landlock_abi(),
        "landlock_abi must be what the kernel reports"
    );
    assert_eq!(
        v["cgroup"].as_str(),
        Some(host_cgroup_mode()),
        "cgroup mode must match /sys/fs/cgroup\n{out}"
    );
}

#[test]
fn image_add_ls_run_rm() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let root = dir.path().join("root");
    let rootfs = dir.path().join("rootfs");
    let mut build = Command::new(workspace_root().join("images/busybox/build.sh"));
    build.arg(&rootfs);
    run_with_timeout(build, None, Duration::from_secs(120)).success();

    let add = |name: &str| {
        agentrun([
            "image".as_ref(),
            "add".as_ref(),
            name.as_ref(),
            rootfs.as_os_str(),
        ])
        .root(&root)
        .run()
    };
    add("mybox").assert_code(0);
    // The store holds a copy: removing the source does not break the image.
    fs::remove_dir_all(&rootfs).unwrap();
    let out = agentrun(["image", "ls"]).root(&root).run();
    assert!(
        out.success()
            .lines()
            .any(|l| l.split_whitespace().next() == Some("mybox")),
        "image ls lists mybox\n{out}"
    );
    let out = exec_with(["--image", "mybox"], ["cat", "/etc/os-release"])
        .root(&root)
        .run();
    assert!(out.success().contains("agentrun busybox"), "{out}");
    agentrun(["image", "rm", "mybox"])
        .root(&root)
        .run()
        .assert_code(0);
    let out = agentrun(["image", "ls"]).root(&root).run();
    assert!(
        !out.success()
            .lines()
            .any(|l| l.split_whitespace().next() == Some("mybox")),
        "image rm removed mybox\n{out}"
    );
    exec_with(["--image", "mybox"], ["true"])
        .root(&root)
        .run()
        .assert_agentrun_error();
    // Adding a directory that does not exist is an error.
    add("ghost").assert_agentrun_error();
}

#[test]
fn unknown_flag_is_125() {
    let _l = setup_noroot();
    let out = agentrun(["exec", "--no-such-flag", "--", "true"]).run();
    out.assert_code(125);
    assert!(
        out.stderr().starts_with("agentrun: "),
        "stderr must start with 'agentrun: '\n{out}"
    );
}

#[test]
fn bad_option_values_are_125() {
    let _l = setup_noroot();
    for (opt, val) in [
        ("--timeout", "soon"),
        ("--memory", "lots"),
        ("--pids", "-3"),
        ("--cpus", "fast"),
        ("-e", "NOEQUALS"),
    ] {
        let out = agentrun(["exec", opt, val, "--", "true"]).run();
        out.assert_code(125);
        assert!(
            out.stderr().starts_with("agentrun: "),
            "{opt} {val}: stderr must start with 'agentrun: '\n{out}"
        );
    }
}

#[test]
fn missing_image_is_125() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    exec_with(["--image", "nope"], ["true"])
        .root(dir.path())
        .run()
        .assert_agentrun_error();
}

#[test]
fn nonexistent_workspace_is_125() {
    let Some(_l) = setup() else { return };
    exec_with(["--workspace", "/nonexistent/agentrun-e2e/ws"], ["true"])
        .run()
        .assert_agentrun_error();
}

#[test]
fn workspace_that_is_a_file_is_125() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let f = dir.path().join("file");
    fs::write(&f, "x").unwrap();
    exec_with(["--workspace".as_ref(), f.as_os_str()], ["true"])
        .run()
        .assert_agentrun_error();
}

/// A read-only bind mount of a temp dir; unmounted on drop.
struct RoMount(std::path::PathBuf);

impl RoMount {
    fn new(src: &std::path::Path, dst: &std::path::Path) -> RoMount {
        let s = CString::new(src.to_str().unwrap()).unwrap();
        let d = CString::new(dst.to_str().unwrap()).unwrap();
        // SAFETY: valid C strings, no data argument.
        unsafe {
            let r = libc::mount(
                s.as_ptr(),
                d.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            );
            assert_eq!(r, 0, "bind mount: {}", std::io::Error::last_os_error());
            let m = RoMount(dst.to_path_buf());
            let r = libc::mount(
                std::ptr::null(),
                d.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                std::ptr::null(),
            );
            assert_eq!(r, 0, "remount ro: {}", std::io::Error::last_os_error());
            m
        }
    }
}

impl Drop for RoMount {
    fn drop(&mut self) {
        let d = CString::new(self.0.to_str().unwrap()).unwrap();
        // SAFETY: valid C string.
        unsafe { libc::umount2(d.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn unwritable_workspace_is_125() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let src = dir.path().join("src");
    let ws = dir.path().join("ws");
    fs::create_dir(&src).unwrap();
    fs::create_dir(&ws).unwrap();
    let _m = RoMount::new(&src, &ws);
    exec_with(["--workspace".as_ref(), ws.as_os_str()], ["true"])
        .run()
        .assert_agentrun_error();
}

#[test]
fn exec_without_command_is_usage_error() {
    let _l = setup_noroot();
    for args in [&["exec"][..], &["exec", "--"][..]] {
        let out = agentrun(args).run();
        assert_ne!(out.status.code(), Some(0), "{out}");
        let err = out.stderr().to_lowercase();
        assert!(
            ["usage", "required", "missing", "<cmd>"]
                .iter()
                .any(|w| err.contains(w)),
            "a usage error naming the missing command expected\n{out}"
        );
        assert!(!out.pipes_left_open, "{out}");
    }
}

#[test]
fn state_dir_under_private_parent_is_125_and_says_why() {
    let Some(_l) = setup() else { return };
    // Like `mktemp -d`: mode 0700, so the sandbox's unprivileged uid cannot search it.
    let dir = tempdir();
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
    }
    let out = exec(["true"])
        .env("AGENTRUN_STATE_DIR", dir.path().join("state"))
        .run();
    out.assert_agentrun_error();
    assert!(out.stderr().contains("not searchable"), "{out}");
}

/// The host's cgroup2 mount: (mount point, per-mount options, super options).
fn cgroup2_mount() -> Option<(String, String, String)> {
    let info = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    info.lines().find_map(|line| {
        let (mount, fs_part) = line.split_once(" - ")?;
        let m: Vec<&str> = mount.split(' ').collect();
        let f: Vec<&str> = fs_part.split(' ').collect();
        (f.first() == Some(&"cgroup2"))
            .then(|| (m[4].to_string(), m[5].to_string(), f[2].to_string()))
    })
}

fn info_favordynmods() -> bool {
    let out = agentrun(["info", "--json"]).run();
    let v: serde_json::Value =
        serde_json::from_str(&out.success()).unwrap_or_else(|e| panic!("info --json: {e}\n{out}"));
    v["cgroup_favordynmods"]
        .as_bool()
        .unwrap_or_else(|| panic!("info --json lacks cgroup_favordynmods\n{out}"))
}

/// Puts the cgroup2 mount's options back however the test ends.
struct RestoreMount(Vec<String>);

impl Drop for RestoreMount {
    fn drop(&mut self) {
        let ok = Command::new("mount")
            .args(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "could not restore the cgroup2 mount: mount {:?}",
            self.0
        );
    }
}

/// `info` says whether the host's cgroups are mounted with favordynmods (which spares every
/// new sandbox an RCU grace period): it follows a remount of the cgroup2 mount both ways.
#[test]
fn info_reports_cgroup_favordynmods() {
    let Some(_l) = setup() else { return };
    let (point, vfs, sup) = cgroup2_mount()
        .expect("this test needs a cgroup2 mount (hybrid or unified host); none is mounted");
    let on = sup.split(',').any(|o| o == "favordynmods");
    assert_eq!(info_favordynmods(), on, "before: super options {sup}");
    if on {
        eprintln!("cgroup2 at {point} already has favordynmods: the off state is not checked");
        return;
    }
    let restore = RestoreMount(vec![
        "--options-mode=ignore".into(),
        "-o".into(),
        format!("remount,{vfs},{sup}"),
        point.clone(),
    ]);
    let st = Command::new("mount")
        .args(["-o", "remount,favordynmods", &point])
        .status()
        .expect("mount");
    assert!(st.success(), "mount -o remount,favordynmods {point}");
    assert!(info_favordynmods(), "after turning favordynmods on");
    assert_eq!(info_favordynmods_line(), "favordynmods:      yes");
    drop(restore);
    assert!(!info_favordynmods(), "after restoring {point}'s options");
    let line = info_favordynmods_line();
    assert!(line.starts_with("favordynmods:      no ("), "{line}");
}

/// The `favordynmods:` line of the human-readable `info`.
fn info_favordynmods_line() -> String {
    let human = agentrun(["info"]).run().success();
    human
        .lines()
        .find(|l| l.starts_with("favordynmods:"))
        .unwrap_or_else(|| panic!("no favordynmods line\n{human}"))
        .to_string()
}

/// A report piped into a reader that is gone (`agentrun info | head -c0`) ends quietly, by
/// SIGPIPE as `cat` would, not with a Rust panic about a broken pipe.
#[test]
fn report_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let Some(_l) = setup() else { return };
    for args in [&["info"][..], &["policy", "check", "default"][..]] {
        let (read, write) = nix::unistd::pipe().expect("pipe");
        drop(read); // every write of the child fails with EPIPE
        let out = Command::new(agentrun_bin())
            .args(args)
            .stdout(std::process::Stdio::from(write))
            .output()
            .expect("run agentrun");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "agentrun {args:?} into a closed pipe: {stderr}"
        );
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "agentrun {args:?} ends by SIGPIPE like coreutils: {:?}, stderr: {stderr}",
            out.status
        );
    }
}
