//! `agentrun exec` basics through the real binary: output, exit codes, workspace, stdio,
//! environment, mounts, images, bundles. Root required (see `require_root`).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use agentrun_e2e::*;

#[test]
fn python_prints_42() {
    let Some(_l) = setup() else { return };
    let out = exec(["python3", "-c", "print(6*7)"]).run();
    assert_eq!(out.success(), "42\n", "{out}");
}

#[test]
fn exit_code_is_passed_through() {
    let Some(_l) = setup() else { return };
    for code in [0, 1, 7, 42, 255] {
        let out = exec(["sh", "-c", &format!("exit {code}")]).run();
        out.assert_code(code);
    }
}

#[test]
fn command_not_found_is_127() {
    let Some(_l) = setup() else { return };
    exec(["no-such-command-agentrun-e2e"])
        .run()
        .assert_code(127);
    exec(["/no/such/path/cmd"]).run().assert_code(127);
}

#[test]
fn non_executable_file_is_126() {
    let Some(_l) = setup() else { return };
    let ws = tempdir();
    let script = ws.path().join("script.sh");
    fs::write(&script, "#!/bin/sh\necho should-not-run\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o644)).unwrap();
    let out = exec_with(
        ["--workspace".as_ref(), ws.path().as_os_str()],
        ["./script.sh"],
    )
    .run();
    out.assert_code(126);
    assert!(!out.stdout().contains("should-not-run"), "{out}");
    let out = exec_with(
        ["--workspace".as_ref(), ws.path().as_os_str()],
        ["/workspace/script.sh"],
    )
    .run();
    out.assert_code(126);
}

#[test]
fn killed_by_signal_is_128_plus_n() {
    let Some(_l) = setup() else { return };
    exec(["sh", "-c", "kill -9 $$"]).run().assert_code(137);
    exec(["sh", "-c", "kill -15 $$"]).run().assert_code(143);
}

#[test]
fn workspace_is_cwd_and_writable_root_owned() {
    let Some(_l) = setup() else { return };
    let ws = tempdir();
    fs::write(ws.path().join("existing.txt"), "x").unwrap();
    let out = exec_with(
        ["--workspace".as_ref(), ws.path().as_os_str()],
        ["sh", "-c", "ls; pwd; echo hi > out.txt"],
    )
    .run();
    let stdout = out.success();
    assert!(
        stdout.contains("existing.txt"),
        "ls in the workspace\n{out}"
    );
    assert!(
        stdout.lines().any(|l| l == "/workspace"),
        "cwd must be /workspace\n{out}"
    );
    let f = ws.path().join("out.txt");
    assert_eq!(
        fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}\n{out}", f.display())),
        "hi\n"
    );
    let meta = fs::metadata(&f).unwrap();
    assert_eq!(
        meta.uid(),
        0,
        "out.txt must be owned by the workspace's owner (root) on the host"
    );
}

#[test]
fn workspace_files_owned_by_workspace_owner() {
    let Some(_l) = setup() else { return };
    let parent = tempdir();
    let ws = parent.path().join("ws");
    fs::create_dir(&ws).unwrap();
    std::os::unix::fs::chown(&ws, Some(1234), Some(1234)).unwrap();
    fs::set_permissions(&ws, fs::Permissions::from_mode(0o755)).unwrap();
    let out = exec_with(
        ["--workspace".as_ref(), ws.as_os_str()],
        [
            "sh",
            "-c",
            "echo hi > out.txt && mkdir sub && echo there > sub/f && id -u",
        ],
    )
    .run();
    out.success();
    for (p, content) in [("out.txt", "hi\n"), ("sub/f", "there\n")] {
        let f = ws.join(p);
        assert_eq!(
            fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}\n{out}", f.display())),
            content
        );
        let meta = fs::metadata(&f).unwrap();
        assert_eq!(
            meta.uid(),
            1234,
            "{p} must be owned on the host by the workspace owner (uid 1234), not uid {}\n{out}",
            meta.uid()
        );
    }
    assert_eq!(fs::metadata(ws.join("sub")).unwrap().uid(), 1234);
}

#[test]
fn stdin_passes_through() {
    let Some(_l) = setup() else { return };
    let out = exec(["wc", "-c"]).stdin("data\n").run();
    assert_eq!(out.success().trim(), "5", "{out}");
    // Bigger than a pipe buffer.
    let big = vec![b'x'; 1 << 20];
    let out = exec(["wc", "-c"]).stdin(big).run();
    assert_eq!(out.success().trim(), (1 << 20).to_string(), "{out}");
}

#[test]
fn no_stdin_does_not_hang() {
    let Some(_l) = setup() else { return };
    let out = exec(["cat"]).timeout(Duration::from_secs(30)).run();
    assert_eq!(out.success(), "", "{out}");
}

#[test]
fn stdout_and_stderr_are_separate() {
    let Some(_l) = setup() else { return };
    let out = exec(["sh", "-c", "echo out; echo err >&2"]).run();
    assert_eq!(out.success(), "out\n", "{out}");
    assert!(
        out.stderr().lines().any(|l| l == "err"),
        "stderr must carry the command's stderr\n{out}"
    );
    assert!(!out.stderr().contains("out\n"), "{out}");
}

#[test]
fn large_stdout_is_complete() {
    let Some(_l) = setup() else { return };
    let n = 5_000_000;
    let out = exec([
        "python3",
        "-c",
        &format!("import sys; sys.stdout.write('x'*{n}); sys.stderr.write('y'*{n})"),
    ])
    .run();
    out.assert_code(0);
    assert_eq!(out.stdout.len(), n, "stdout bytes");
    assert!(out.stdout.iter().all(|b| *b == b'x'));
    let ys = out.stderr.iter().filter(|b| **b == b'y').count();
    assert_eq!(ys, n, "stderr bytes");
}

#[test]
fn stdout_streams_live() {
    let Some(_l) = setup() else { return };
    let out = exec(["sh", "-c", "echo first; sleep 2; echo second"]).run();
    assert_eq!(out.success(), "first\nsecond\n");
    let first_at = out
        .stdout_times
        .first()
        .map(|(t, _)| *t)
        .expect("some stdout");
    let lag = out.elapsed.saturating_sub(first_at);
    assert!(
        lag >= Duration::from_millis(1500),
        "'first' must arrive while the command still runs (it arrived {:.2}s before exit)\n{out}",
        lag.as_secs_f64()
    );
}

const ALLOWED_ENV: &[&str] = &["PATH", "HOME", "LANG", "TERM", "TRACEPARENT"];

fn env_map(out: &RunOutput) -> Vec<(String, String)> {
    out.stdout()
        .split('\0')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or((l, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}

#[test]
fn host_environment_does_not_leak() {
    let Some(_l) = setup() else { return };
    let out = exec(["env", "-0"])
        .env("OPENAI_API_KEY", "sk-test")
        .env("AGENTRUN_E2E_SECRET", "hunter2")
        .run();
    out.assert_code(0);
    let env = env_map(&out);
    assert!(
        !out.stdout().contains("sk-test") && !out.stdout().contains("hunter2"),
        "host secrets visible inside\n{out}"
    );
    let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    for k in ["PATH", "HOME"] {
        assert!(keys.contains(&k), "{k} missing inside: {keys:?}");
    }
    let extra: Vec<&&str> = keys.iter().filter(|k| !ALLOWED_ENV.contains(k)).collect();
    assert!(
        extra.is_empty(),
        "unexpected variables inside (allowed: {ALLOWED_ENV:?}): {extra:?}\n{out}"
    );
}

#[test]
fn env_flags_and_env_file() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let file = dir.path().join("vars.env");
    fs::write(&file, "# a comment\nFROM_FILE=one\n\nSPACED=two words\n").unwrap();
    let out = agentrun(
        [
            "exec",
            "-e",
            "FOO=bar",
            "-e",
            "WITH_EQ=a=b",
            "--env-file",
            file.to_str().unwrap(),
            "--",
            "env",
            "-0",
        ]
        .map(String::from),
    )
    .run();
    out.assert_code(0);
    let env = env_map(&out);
    for (k, v) in [
        ("FOO", "bar"),
        ("WITH_EQ", "a=b"),
        ("FROM_FILE", "one"),
        ("SPACED", "two words"),
    ] {
        assert!(
            env.iter().any(|(ek, ev)| ek == k && ev == v),
            "{k}={v} missing inside\n{out}"
        );
    }
}

#[test]
fn traceparent_is_passed_on() {
    let Some(_l) = setup() else { return };
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let out = exec(["env", "-0"])
        .env("TRACEPARENT", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .run();
    out.assert_code(0);
    let env = env_map(&out);
    let tp = env
        .iter()
        .find(|(k, _)| k == "TRACEPARENT")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("TRACEPARENT missing inside\n{out}"));
    assert!(
        tp.starts_with(&format!("00-{trace_id}-")),
        "TRACEPARENT inside must keep the trace id: {tp}"
    );
}

#[test]
fn cwd_option() {
    let Some(_l) = setup() else { return };
    let out = exec_with(["--cwd", "/tmp"], ["pwd"]).run();
    assert_eq!(out.success(), "/tmp\n", "{out}");
}

#[test]
fn ro_and_rw_mounts() {
    let Some(_l) = setup() else { return };
    let ro = tempdir();
    let rw = tempdir();
    fs::write(ro.path().join("f"), "data\n").unwrap();
    let out = exec_with(
        [
            "--ro".to_string(),
            format!("{}:/data", ro.path().display()),
            "--rw".to_string(),
            format!("{}:/out", rw.path().display()),
        ],
        [
            "sh",
            "-c",
            "cat /data/f; echo w > /out/w; if (echo x > /data/g) 2>/dev/null; then echo RO-WRITABLE; fi; true",
        ],
    )
    .run();
    let stdout = out.success();
    assert!(stdout.contains("data"), "--ro dir readable\n{out}");
    assert!(!stdout.contains("RO-WRITABLE"), "--ro dir writable\n{out}");
    assert!(!ro.path().join("g").exists(), "write went through --ro");
    assert_eq!(
        fs::read_to_string(rw.path().join("w")).unwrap_or_default(),
        "w\n",
        "--rw write must reach the host\n{out}"
    );
}

#[test]
fn busybox_image_os_release() {
    let Some(_l) = setup() else { return };
    let root = busybox_root();
    let out = exec_with(
        ["--image", "busybox"],
        ["/bin/sh", "-c", "cat /etc/os-release || true"],
    )
    .root(&root)
    .run();
    let stdout = out.success();
    assert!(
        stdout.contains("agentrun busybox test image"),
        "busybox image's /etc/os-release expected\n{out}"
    );
    // The host's /usr is not part of this image.
    let out = exec_with(
        ["--image", "busybox"],
        [
            "/bin/sh",
            "-c",
            "if [ -e /usr/bin/python3 ]; then echo HOST-USR; else echo clean; fi",
        ],
    )
    .root(&root)
    .run();
    assert_eq!(out.success(), "clean\n", "{out}");
}

#[test]
fn busybox_image_with_workspace() {
    let Some(_l) = setup() else { return };
    let root = busybox_root();
    let ws = tempdir();
    let out = exec_with(
        [
            "--image".as_ref(),
            "busybox".as_ref(),
            "--workspace".as_ref(),
            ws.path().as_os_str(),
        ],
        ["sh", "-c", "echo hi > out.txt; pwd; id -u"],
    )
    .root(&root)
    .run();
    assert_eq!(out.success(), "/workspace\n0\n", "{out}");
    assert_eq!(
        fs::read_to_string(ws.path().join("out.txt")).unwrap_or_default(),
        "hi\n"
    );
}

#[test]
fn keep_bundle_prints_path() {
    let Some(_l) = setup() else { return };
    let out = exec_with(["--keep-bundle"], ["true"]).run();
    out.assert_code(0);
    let stderr = out.stderr();
    let path = stderr
        .lines()
        .find_map(|l| l.strip_prefix("agentrun: bundle kept at "))
        .unwrap_or_else(|| panic!("no 'agentrun: bundle kept at PATH' line\n{out}"))
        .trim()
        .to_string();
    let config = std::path::Path::new(&path).join("config.json");
    let text =
        fs::read_to_string(&config).unwrap_or_else(|e| panic!("{}: {e}\n{out}", config.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("config.json is JSON");
    assert!(
        v.get("ociVersion").is_some(),
        "config.json has ociVersion: {text}"
    );
    // Clean up after ourselves (a kept rootfs may still be a mount point).
    let rootfs = std::path::Path::new(&path).join("rootfs");
    if let Ok(c) = std::ffi::CString::new(rootfs.to_string_lossy().as_bytes()) {
        // SAFETY: valid C string.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    let _ = fs::remove_dir_all(&path);
}

#[test]
fn runs_do_not_share_state() {
    let Some(_l) = setup() else { return };
    let marker = format!("/tmp/agentrun-e2e-{}", std::process::id());
    exec(["sh", "-c", &format!("echo x > {marker}")])
        .run()
        .assert_code(0);
    let out = exec([
        "sh",
        "-c",
        &format!("if [ -e {marker} ]; then echo SEEN; else echo clean; fi"),
    ])
    .run();
    assert_eq!(
        out.success(),
        "clean\n",
        "one run's /tmp visible in the next\n{out}"
    );
}

#[test]
fn argv_is_passed_verbatim() {
    let Some(_l) = setup() else { return };
    let args = ["a b", "$HOME", "*", "", "'\"", "--", "-e", "ünïcode"];
    let mut cmd = vec!["printf", "[%s]\\n"];
    cmd.extend(args);
    let out = exec(cmd).run();
    let want: String = args.iter().map(|a| format!("[{a}]\n")).collect();
    assert_eq!(out.success(), want, "{out}");
}

#[test]
fn workspace_path_with_spaces() {
    let Some(_l) = setup() else { return };
    let parent = tempdir();
    let ws = parent.path().join("my work space");
    fs::create_dir(&ws).unwrap();
    let out = exec_with(
        ["--workspace".as_ref(), ws.as_os_str()],
        ["sh", "-c", "echo ok > f"],
    )
    .run();
    out.assert_code(0);
    assert_eq!(fs::read_to_string(ws.join("f")).unwrap_or_default(), "ok\n");
}

#[test]
fn standard_devices_work() {
    let Some(_l) = setup() else { return };
    let out = exec([
        "sh",
        "-c",
        "echo x > /dev/null && head -c 4 /dev/zero | wc -c && head -c 4 /dev/urandom | wc -c && head -c 4 /dev/random | wc -c",
    ])
    .run();
    let stdout = out.success();
    assert_eq!(
        stdout.split_whitespace().collect::<Vec<_>>(),
        ["4", "4", "4"],
        "{out}"
    );
}

#[test]
fn directory_as_command_is_126() {
    let Some(_l) = setup() else { return };
    exec(["/tmp"]).run().assert_code(126);
}
