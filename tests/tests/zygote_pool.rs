//! The Python zygote in the daemon's pool (issue 14), end to end: what it enforces, how it
//! fails, what the operator sees. (`zygote.rs` holds the differential corpus: the same output
//! as a fresh interpreter.)
//!
//! Contract under test:
//! - a run forked by the zygote is confined exactly like an exec'd one of the same profile:
//!   capabilities, no_new_privs, seccomp filters, Landlock (writes outside the profile's
//!   writable paths denied), rlimits, its own pid namespace (it sees only its cell), the same
//!   environment and working directory; its span says `sandbox.zygote=true`;
//! - a zygote that is killed fails no run, and its shell's init starts it again; one that
//!   hangs fails no run either (the run is exec'd after a bounded wait, with the reason on
//!   the span) and its shell is replaced;
//! - `agentrun pool status` shows each pool's zygote: ready, what it imported, what it skipped
//!   (a module that cannot be imported is reported, never fatal), its PSS;
//! - runs the zygote cannot take (interpreter options, start-up variables, another program,
//!   the cold path) are exec'd and say why on the span;
//! - nothing is left on the host after the daemon stops.
//!
//! Needs root; holds the exclusive e2e lock (a daemon).

use std::time::Duration;

use agentrun_e2e::otlp::{OtlpReceiver, ReceivedSpan};
use agentrun_e2e::*;

/// How long a pool with a zygote may take to fill and its zygote to import (debug build).
const READY: Duration = Duration::from_secs(90);

/// A profile file: the default profile with a zygote preloading `preload`.
fn zygote_profile(dir: &std::path::Path, preload: &[&str]) -> String {
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../bundles/default.toml"
    ))
    .expect("bundles/default.toml");
    let list: Vec<String> = preload.iter().map(|m| format!("{m:?}")).collect();
    let text = format!(
        "{}\n[python]\nzygote = true\npreload = [{}]\n",
        base.replace("name = \"default\"", "name = \"zygote-test\""),
        list.join(", ")
    );
    let path = dir.join("zygote-test.toml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

struct Setup {
    d: Daemon,
    rx: OtlpReceiver,
    profile: String,
    _dir: tempfile::TempDir,
}

/// A daemon keeping a pool of `size` shells of the host image with the zygote profile.
fn start(preload: &[&str], size: usize) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let profile = zygote_profile(dir.path(), preload);
    let rx = OtlpReceiver::grpc();
    let mut d = Daemon::unstarted();
    for (k, v) in rx.otel_env() {
        d.set_env(k, v);
    }
    d.launch([
        "--pool-size".to_string(),
        "1".into(),
        "--pool".into(),
        format!("host:{profile}={size}"),
    ]);
    Setup {
        d,
        rx,
        profile,
        _dir: dir,
    }
}

impl Setup {
    /// Runs `python3 -c CODE` with the zygote profile; returns the output and its span (found
    /// by a token unique to this run in its command line).
    fn python(&self, code: &str) -> (RunOutput, ReceivedSpan) {
        self.run_with(&[], &["python3", "-c", code])
    }

    /// Takes the one pooled shell with a command that runs for `secs` seconds (the caller
    /// kills it), and waits until the daemon counts it running: the next run misses.
    fn hold_the_pooled_shell(&self, secs: u32) -> Running {
        let busy = self
            .d
            .exec_with(
                ["--profile".to_string(), self.profile.clone()],
                ["sh", "-c", &format!("echo busy; sleep {secs}")],
            )
            .spawn();
        wait_until(Duration::from_secs(20), || {
            (self.d.pool_status_json()["running"].as_u64() == Some(1)).then_some(())
        })
        .expect("the pooled shell is running");
        busy
    }

    fn run_with(&self, opts: &[&str], cmd: &[&str]) -> (RunOutput, ReceivedSpan) {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = format!("run-{}-{n}", std::process::id());
        let mut cmd: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        // A comment opening the code (the span keeps the command line's start), or a harmless
        // last argument, marks the run's span.
        match cmd.iter().position(|a| a == "-c") {
            Some(i) if cmd[0].contains("python") => {
                cmd[i + 1] = format!("#{token}\n{}", cmd[i + 1])
            }
            _ => cmd.push(token.clone()),
        }
        let mut all = vec!["--profile".to_string(), self.profile.clone()];
        all.extend(opts.iter().map(|s| s.to_string()));
        let out = self
            .d
            .exec_with(all, cmd)
            .timeout(Duration::from_secs(60))
            .run();
        let span = wait_until(Duration::from_secs(15), || {
            self.rx.spans().into_iter().find(|s| {
                s.name == "sandbox.exec" && s.attr("process.command_line").contains(&token)
            })
        })
        .unwrap_or_else(|| panic!("no sandbox.exec span for {token}\n{out}\n{}", self.d.log()));
        (out, span)
    }

    /// Runs `print(1)` until one run is forked by a zygote (the pool's shells are made and
    /// their zygotes import in the background).
    fn wait_zygote(&self) {
        let used = wait_until(READY, || {
            let (out, span) = self.python("print(1)");
            assert_eq!(out.stdout(), "1\n", "{out}\n{}", self.d.log());
            (span.attr("sandbox.zygote") == "true").then_some(())
        });
        assert!(
            used.is_some(),
            "no run went through a zygote within {READY:?}\n{}",
            self.d.log()
        );
    }

    /// The pool's zygote status (`pool status --json`).
    fn zygote_status(&self) -> serde_json::Value {
        let st = self.d.pool_status_json();
        st["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["profile"] == self.profile.as_str())
            .map(|p| p["zygote"].clone())
            .unwrap_or(serde_json::Value::Null)
    }
}

/// What a process can do and see, printed for comparison between the zygote and exec.
const PROBE: &str = r#"
import os, resource, sys
print("fds", sorted(os.listdir("/proc/self/fd")))
st = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Seccomp_filters"):
    print(k, st[k].strip())
for p in ("/etc/agentrun-probe", "/usr/agentrun-probe", "/tmp/agentrun-probe", "/root/agentrun-probe"):
    try:
        open(p, "w").close(); print("write", p, "ok")
    except OSError as e:
        print("write", p, e.errno)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("unshare", libc.unshare(0x00020000), ctypes.get_errno())
print("setns", libc.setns(os.open("/proc/self/ns/mnt", os.O_RDONLY), 0), ctypes.get_errno())
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
# How many, not which: a run after a forked one finds pid 2 taken by the child the zygote
# forked ahead (which an exec'd run waits out).
print("pids", len(pids), pids[0] == 1, os.getpid() in pids)
print("ids", os.getuid(), os.getgid(), os.getgroups(), os.getpgrp() == os.getpid(), os.getsid(0) == os.getsid(1))
print("cwd", os.getcwd())
for r in ("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_CORE"):
    print(r, resource.getrlimit(getattr(resource, r)))
print("env", sorted(k for k in os.environ if k != "TRACEPARENT"))
print("mnt", len(open("/proc/self/mountinfo").read().splitlines()))
"#;

#[test]
fn a_forked_run_is_confined_exactly_like_an_exec_d_one() {
    let Some(_l) = setup_exclusive() else { return };
    let s = start(&["json"], 1);
    s.wait_zygote();
    let (zyg, span) = s.python(PROBE);
    assert_eq!(span.attr("sandbox.zygote"), "true", "{span:#?}");
    // `-X utf8` is an interpreter option: the same code, exec'd in the same pool.
    let (exec, span) = s.run_with(&[], &["python3", "-X", "utf8=0", "-c", PROBE]);
    assert_eq!(span.attr("sandbox.zygote"), "false", "{span:#?}");
    assert!(
        span.attr("sandbox.zygote_fallback")
            .contains("interpreter option -X"),
        "{span:#?}"
    );
    assert_eq!(zyg.code(), 0, "{zyg}");
    assert_eq!(exec.code(), 0, "{exec}");
    assert_eq!(zyg.stdout(), exec.stdout(), "zygote:\n{zyg}\nexec:\n{exec}");
    let lines = zyg.stdout();
    // Not only equal: what the profile says.
    assert!(
        lines.contains("CapEff 0000000000000000") || !lines.contains("CapEff 0000003"),
        "{lines}"
    );
    assert!(lines.contains("NoNewPrivs 1"), "{lines}");
    assert!(lines.contains("Seccomp 2"), "{lines}");
    assert!(
        lines.contains("write /etc/agentrun-probe 13"),
        "Landlock denies /etc: {lines}"
    );
    assert!(lines.contains("write /tmp/agentrun-probe ok"), "{lines}");
    assert!(
        lines.contains("unshare -1 1\n"),
        "seccomp/caps deny unshare: {lines}"
    );
    assert!(
        lines.contains("setns -1 1\n"),
        "setns denied in the run: {lines}"
    );
    assert!(
        lines.contains("pids 2 True True"),
        "only its cell's processes: {lines}"
    );
    assert!(
        lines.contains("fds ['0', '1', '2', '3']"),
        "only 0, 1, 2 (and the listing's): {lines}"
    );
}

/// The zygote's children (its pid's `children` list, every thread's).
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    out
}

#[test]
fn a_run_after_a_forked_one_takes_the_child_forked_ahead() {
    let Some(_l) = setup_exclusive() else { return };
    let s = start(&["json"], 1);
    s.wait_zygote();
    let zygote = s.zygote_status()["pid"].as_i64().expect("a zygote pid") as i32;
    // The last run was forked: the shell's next spare cell has the zygote fork its run's
    // process as soon as its root is built.
    let ahead = wait_until(Duration::from_secs(20), || {
        (children_of(zygote).len() == 1).then_some(())
    });
    assert!(
        ahead.is_some(),
        "no child forked ahead: {:?}\n{}",
        children_of(zygote),
        s.d.log()
    );
    let (out, span) =
        s.python("import os, sys; print(os.getpid(), 'json' in sys.modules, sys.argv)");
    assert_eq!(out.stdout(), "2 True ['-c']\n", "{out}");
    assert_eq!(span.attr("sandbox.zygote"), "true", "{span:#?}");
    assert_eq!(span.attr("sandbox.zygote_ahead"), "true", "{span:#?}");
    // The next run is exec'd (an interpreter option): the child forked ahead for it ends
    // unused before the command starts, which sees only its cell's PID 1 and itself.
    wait_until(Duration::from_secs(20), || {
        (children_of(zygote).len() == 1).then_some(())
    })
    .expect("a child forked ahead again");
    let (out, span) = s.run_with(
        &[],
        &[
            "python3",
            "-X",
            "utf8=0",
            "-c",
            "import os; print(len([p for p in os.listdir('/proc') if p.isdigit()]))",
        ],
    );
    assert_eq!(span.attr("sandbox.zygote"), "false", "{span:#?}");
    assert_eq!(out.stdout(), "2\n", "only PID 1 and the command: {out}");
    // Nothing of it is left: the zygote has no child once no spare has one.
    let (out, span) = s.run_with(&[], &["/bin/true"]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(span.attr("sandbox.zygote"), "false", "{span:#?}");
    assert_eq!(
        children_of(zygote),
        Vec::<i32>::new(),
        "the exec'd runs' spares fork nothing ahead"
    );
}

#[test]
fn a_pool_miss_shell_starts_no_zygote() {
    let Some(_l) = setup_exclusive() else { return };
    let s = start(&["json"], 1);
    s.wait_zygote();
    // The one pooled shell is busy: the next run misses and gets a shell made for it alone,
    // which must not pay the preload list's imports for a run that is exec'd anyway.
    let mut busy = s.hold_the_pooled_shell(30);
    let (out, span) = s.python("print('missed')");
    assert_eq!(out.stdout(), "missed\n", "{out}");
    assert_eq!(span.attr("sandbox.pool_hit"), "false", "{span:#?}");
    assert_eq!(span.attr("sandbox.zygote"), "false", "{span:#?}");
    assert!(
        span.attr("sandbox.zygote_fallback").contains("not running"),
        "a one-run shell starts no zygote: {span:#?}"
    );
    busy.kill9();
}

/// A shell a burst of other commands grew the pool by (a miss's shell, which then stays in
/// the pool) imports nothing until a Python run asks for its zygote: under a burst of
/// `/bin/true` on `code-interpreter`, every grown shell importing numpy, pandas and
/// matplotlib (~1 s of CPU each) halved the runs/s (issue 30).
#[test]
fn a_shell_grown_by_other_commands_starts_its_zygote_only_when_a_python_run_asks() {
    let Some(_l) = setup_exclusive() else { return };
    let s = start(&["json"], 1);
    s.wait_zygote();
    // The one pooled shell is busy: the next run misses, and its shell joins the pool.
    let mut busy = s.hold_the_pooled_shell(60);
    let (out, missed) = s.run_with(&[], &["/bin/true"]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(missed.attr("sandbox.pool_hit"), "false", "{missed:#?}");
    assert!(
        missed
            .attr("sandbox.zygote_fallback")
            .contains("not python3"),
        "what the run is decides first: {missed:#?}"
    );
    let grown = missed.attr("sandbox.id").to_string();
    // Another command on it (the busy shell is still out): no import was started for it.
    let (out, span) = s.run_with(&[], &["/bin/true"]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(span.attr("sandbox.id"), grown, "{span:#?}");
    assert_eq!(span.attr("sandbox.pool_hit"), "true", "{span:#?}");
    // The first Python run on it finds no zygote started (nor one importing): exec'd.
    let (out, span) = s.python("print('grown')");
    assert_eq!(out.stdout(), "grown\n", "{out}");
    assert_eq!(span.attr("sandbox.id"), grown, "{span:#?}");
    assert_eq!(span.attr("sandbox.zygote"), "false", "{span:#?}");
    assert!(
        span.attr("sandbox.zygote_fallback").contains("not running"),
        "a shell grown by /bin/true runs must not have started its zygote: {span:#?}\n{}",
        s.d.log()
    );
    // It asked: the shell starts its zygote, which takes its next Python runs (the most
    // recently used ready shell serves each run).
    let used = wait_until(READY, || {
        let (out, span) = s.python("print(2)");
        assert_eq!(out.stdout(), "2\n", "{out}");
        assert_eq!(span.attr("sandbox.id"), grown, "{span:#?}");
        (span.attr("sandbox.zygote") == "true").then_some(())
    });
    assert!(
        used.is_some(),
        "the grown shell's zygote never took a run\n{}",
        s.d.log()
    );
    busy.kill9();
}

#[test]
fn a_killed_zygote_fails_no_run_and_is_started_again() {
    let Some(_l) = setup_exclusive() else { return };
    // An empty preload list is a zygote too.
    let s = start(&[], 1);
    s.wait_zygote();
    let before = s.zygote_status();
    let pid = before["pid"].as_i64().expect("a zygote pid") as i32;
    assert!(before["ready"].as_bool().unwrap(), "{before}");
    // SAFETY: kill(2) of a process of the test's own daemon.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let (out, _) = s.python("print('after the kill')");
    assert_eq!(out.stdout(), "after the kill\n", "{out}\n{}", s.d.log());
    s.wait_zygote();
    let after = s.zygote_status();
    let new = after["pid"].as_i64().expect("a zygote pid again") as i32;
    assert_ne!(new, pid, "{after}");
    assert!(after["ready"].as_bool().unwrap(), "{after}");
}

#[test]
fn a_hung_zygote_fails_no_run_and_its_shell_is_replaced() {
    let Some(_l) = setup_exclusive() else { return };
    let s = start(&["json"], 1);
    s.wait_zygote();
    let pid = s.zygote_status()["pid"].as_i64().expect("a zygote pid") as i32;
    // SAFETY: kill(2) of a process of the test's own daemon.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let (out, span) = s.python("print('despite the hang')");
    assert_eq!(out.stdout(), "despite the hang\n", "{out}\n{}", s.d.log());
    assert_eq!(span.attr("sandbox.zygote"), "false", "{span:#?}");
    assert!(
        span.attr("sandbox.zygote_fallback")
            .contains("did not answer"),
        "{span:#?}"
    );
    // The shell is discarded for it; a new shell's zygote takes the next runs.
    s.wait_zygote();
    let st = s.d.pool_status_json();
    assert!(
        st["discarded"]["zygote_failed"].as_u64().unwrap_or(0) >= 1,
        "the shell with the hung zygote must be discarded: {st}"
    );
    // SAFETY: as above (it may be gone with its shell already).
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

#[test]
fn pool_status_shows_the_zygote_its_imports_and_its_memory() {
    let Some(_l) = setup_exclusive() else { return };
    let s = start(&["json", "no_such_module_here", "email.mime.text"], 1);
    s.wait_zygote();
    let z = s.zygote_status();
    assert_eq!(z["ready"], true, "{z}");
    assert_eq!(
        z["preloaded"],
        serde_json::json!(["json", "email.mime.text"]),
        "{z}"
    );
    let why = z["skipped"]["no_such_module_here"]
        .as_str()
        .unwrap_or_default();
    assert!(why.contains("ModuleNotFoundError"), "{z}");
    let pss = z["pss_bytes"].as_u64().unwrap();
    assert!(pss > 1 << 20 && pss < 512 << 20, "PSS {pss}: {z}");
    let text = s.d.agentrun(["pool", "status"]).run().success();
    assert!(
        text.contains(
            "python zygote: ready; preloaded: json, email.mime.text; skipped: no_such_module_here"
        ),
        "{text}"
    );
    // A skipped module is only that: the preloaded ones are there in runs.
    let (out, span) = s.python("import sys; print('json' in sys.modules)");
    assert_eq!(span.attr("sandbox.zygote"), "true");
    assert_eq!(out.stdout(), "True\n", "{out}");
}

#[test]
fn runs_the_zygote_cannot_take_are_exec_d_and_say_why() {
    let Some(_l) = setup_exclusive() else { return };
    let s = start(&["json"], 1);
    s.wait_zygote();
    for (opts, cmd, why) in [
        (
            &[][..],
            &["python3", "-I", "-c", "print(7)"][..],
            "interpreter option -I",
        ),
        (
            &["-e", "PYTHONPATH=/nowhere"][..],
            &["python3", "-c", "print(7)"][..],
            "PYTHONPATH",
        ),
        (
            &["-e", "PYTHONHASHSEED=0"][..],
            &["python3", "-c", "print(7)"][..],
            "PYTHONHASHSEED",
        ),
        (
            &[][..],
            &["/usr/bin/python3", "-c", "print(7)"][..],
            "not python3",
        ),
        (&[][..], &["sh", "-c", "echo 7; : "][..], "not python3"),
    ] {
        let (out, span) = s.run_with(opts, cmd);
        assert_eq!(out.stdout(), "7\n", "{cmd:?}: {out}");
        assert_eq!(span.attr("sandbox.zygote"), "false", "{cmd:?}: {span:#?}");
        assert!(
            span.attr("sandbox.zygote_fallback").contains(why),
            "{cmd:?}: reason must name {why:?}: {span:#?}"
        );
    }
    // A script that does not exist: python3's own message, from an exec.
    let (out, span) = s.run_with(&[], &["python3", "/no/such/script.py"]);
    assert_eq!(out.code(), 2, "{out}");
    assert!(
        out.stderr()
            .contains("can't open file '/no/such/script.py'"),
        "{out}"
    );
    assert_eq!(span.attr("sandbox.zygote"), "false", "{span:#?}");
    // The cold path has no pooled shell, so no zygote.
    let out = exec_with(
        ["--no-daemon", "--profile", s.profile.as_str()],
        ["python3", "-c", "print(8)"],
    )
    .run();
    assert_eq!(out.success(), "8\n");
}

#[test]
fn the_clients_ctrl_c_reaches_a_forked_run_as_keyboard_interrupt() {
    let Some(_l) = setup_exclusive() else { return };
    let s = start(&["json"], 1);
    s.wait_zygote();
    let code = "import time\nprint('up', flush=True)\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    print('interrupted', flush=True)\n    raise\n";
    let mut run =
        s.d.exec_with(["--profile", s.profile.as_str()], ["python3", "-c", code])
            .spawn();
    let up = wait_until(Duration::from_secs(30), || {
        run.stdout_so_far().contains("up").then_some(())
    });
    assert!(
        up.is_some(),
        "the run never started: {}",
        run.stderr_so_far()
    );
    run.signal(libc::SIGINT);
    let out = run.wait_or_kill(Duration::from_secs(20));
    assert_eq!(out.stdout(), "up\ninterrupted\n", "{out}");
    assert!(out.stderr().contains("KeyboardInterrupt"), "{out}");
    assert_eq!(out.code(), 130, "{out}");
}

/// `serve --docker-profile` naming a profile with a Python zygote: `docker exec CONTAINER
/// python3 -c CODE` (the shape of CrewAI's CodeInterpreterTool) is forked by the zygote of the
/// container's shell; one with an interpreter option is exec'd.
#[test]
fn docker_exec_of_python3_is_forked_from_the_containers_zygote() {
    let Some(_l) = setup_exclusive() else { return };
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../bundles/container.toml"
    ))
    .unwrap();
    let profile = dir.path().join("container-zygote.toml");
    std::fs::write(
        &profile,
        format!("{base}\n[python]\nzygote = true\npreload = [\"json\"]\n"),
    )
    .unwrap();
    let root = dir.path().join("root");
    agentrun_e2e::images::host_python_image(&dir.path().join("rootfs"), &root, "pyhost:latest");
    let mut d = Daemon::unstarted().with_env("AGENTRUN_ROOT", &root);
    let socket = d.state().join("docker.sock");
    d.launch([
        "--pool-size".as_ref(),
        "1".as_ref(),
        "--docker-socket".as_ref(),
        socket.as_os_str(),
        "--docker-profile".as_ref(),
        profile.as_os_str(),
    ]);
    let docker = |args: &[&str]| {
        let mut cmd = std::process::Command::new("docker");
        cmd.args(args)
            .env("DOCKER_HOST", format!("unix://{}", socket.display()))
            .env("DOCKER_CONFIG", dir.path().join("docker-config"));
        run_with_timeout(cmd, None, Duration::from_secs(120))
    };
    let id = docker(&[
        "run",
        "-d",
        "pyhost:latest",
        "python3",
        "-c",
        "import time; time.sleep(600)",
    ])
    .success()
    .trim()
    .to_string();
    let forked = wait_until(READY, || {
        let out = docker(&[
            "exec",
            &id,
            "python3",
            "-c",
            "import os; print(os.getppid())",
        ]);
        let ppid = out.success();
        (ppid == "0\n").then_some(())
    });
    assert!(
        forked.is_some(),
        "docker exec python3 was never forked by a zygote\n{}",
        d.log()
    );
    let out = docker(&[
        "exec",
        &id,
        "python3",
        "-c",
        "import sys; print(sys.argv[1:]); sys.exit(3)",
        "a",
    ]);
    assert_eq!(
        (out.code(), out.stdout()),
        (3, "['a']\n".to_string()),
        "{out}"
    );
    // An interpreter option: exec'd (its parent is the container's PID 1).
    let out = docker(&[
        "exec",
        &id,
        "python3",
        "-I",
        "-c",
        "import os; print(os.getppid())",
    ]);
    assert_eq!(out.success(), "1\n", "python3 -I is exec'd");
    docker(&["rm", "-f", &id]).success();
}
