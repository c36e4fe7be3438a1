//! agentrun as an OCI runtime (the runc command line), end to end.
//!
//! - `runc_and_agentrun_agree`: the same bundle and the same command sequence through runc
//!   (Debian package) and through agentrun, side by side: exit codes, error messages the shim
//!   matches on, JSON of `state`, `list`, `ps`, `events --stats`, `features`, `spec`, the
//!   `--log-format json` log line, `exec` (`--process`, `--detach`, `--pid-file`), `run`,
//!   `pause`/`resume`, `update`, `kill`, `delete`.
//! - `containerd_runs_containers_with_agentrun`: a private containerd (Debian package) imports
//!   a busybox OCI image built here (no registry) and runs it with
//!   `ctr run --runc-binary <agentrun>` through containerd's runc shim: output and exit code,
//!   a terminal (`-t`, the console socket), `ctr task exec` (also `-t`), `ctr task kill`
//!   (SIGTERM and SIGKILL), pause/resume, the spec's seccomp
//!   (`ctr run --seccomp`) and the profile annotation; nothing left behind.
//! - `profile_annotation_confines_the_container` and `bad_profile_annotation_fails_create`.
//! - `lifetime_span_is_exported_at_delete`: one span per container, create..delete.
//! - `seccomp_notify_hands_the_listener_to_the_agent`: `SCMP_ACT_NOTIFY` rules with a
//!   `listenerPath`: a seccomp agent gets the state and the notify fd at `create` (and at
//!   `exec`) and answers the container's syscalls; what cannot work is refused at `create`.
//! - `refusals_carry_their_cause`: the line the shim reports names the errno, the unknown
//!   capability, the symlinked /proc or /sys.
//! - `exec_cpu_affinity_is_honoured`: `process.execCPUAffinity` from config.json and from
//!   `exec --process`, seen from inside through /proc/self/status.
//!
//! These tests need root, runc, containerd and umoci (hack/test installs them).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agentrun_e2e::oci::{
    busybox_image_tar, Answer, Bundle, CgroupParent, Containerd, SeccompAgent, IMAGE, NAMESPACE,
};
use agentrun_e2e::otlp::OtlpReceiver;
use agentrun_e2e::{
    agentrun_bin, all_processes, mounts_under, setup, tempdir, wait_until, Running,
};
use serde_json::{json, Value};

/// What a runtime command did. Its stdout/stderr go to files, not pipes: a container created
/// by it inherits them and keeps them open.
#[derive(Debug, Clone)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "expected success: {self:?}");
        &self.stdout
    }
    fn json(&self) -> Value {
        serde_json::from_str(self.ok()).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// Runs `cmd` with a 60 s deadline, stdout and stderr to temp files.
fn run(mut cmd: Command) -> Out {
    let dir = tempdir();
    let (o, e) = (dir.path().join("out"), dir.path().join("err"));
    cmd.stdin(Stdio::null())
        .stdout(File::create(&o).unwrap())
        .stderr(File::create(&e).unwrap());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} timed out");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Out {
        code: status.code().unwrap_or(-1),
        stdout: fs::read_to_string(&o).unwrap(),
        stderr: fs::read_to_string(&e).unwrap(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Rt {
    Runc,
    Agentrun,
}

impl Rt {
    fn command(self, root: &Path) -> Command {
        let mut c = match self {
            Rt::Runc => Command::new("runc"),
            Rt::Agentrun => Command::new(agentrun_bin()),
        };
        c.arg("--root").arg(root);
        c
    }
    fn run(self, root: &Path, args: &[&str]) -> Out {
        let mut c = self.command(root);
        c.args(args);
        run(c)
    }
}

/// Waits until `state ID` says `status`.
fn wait_status(rt: Rt, root: &Path, id: &str, status: &str) -> Value {
    wait_until(Duration::from_secs(10), || {
        let s = rt.run(root, &["state", id]);
        (s.code == 0 && s.json()["status"] == status).then(|| s.json())
    })
    .unwrap_or_else(|| panic!("{rt:?}: {id} never became {status}"))
}

fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect();
    k.sort();
    k
}

/// The pids cgroup file `file` of the container at cgroups path `cg` (v1 or v2).
fn pids_cgroup_file(cg: &str, file: &str) -> PathBuf {
    let v1 = Path::new("/sys/fs/cgroup/pids").join(cg.trim_start_matches('/'));
    if v1.is_dir() {
        v1.join(file)
    } else {
        Path::new("/sys/fs/cgroup")
            .join(cg.trim_start_matches('/'))
            .join(file)
    }
}

/// Everything one runtime printed for the shared command sequence.
#[derive(Debug)]
struct Observed {
    missing: Vec<(String, i32, String)>,
    log_line: Value,
    list_empty_json: String,
    list_empty_table: String,
    created: Value,
    list_json: Value,
    list_table: String,
    running: Value,
    ps_json: Value,
    events: Value,
    exec_code: i32,
    exec_detached_pid_in_container: bool,
    paused: String,
    resumed: String,
    pids_max: String,
    delete_running_code: i32,
    stopped: Value,
    kill_stopped: Out,
    deleted_state_code: i32,
    run_out: Out,
    features: Value,
    spec_first: i32,
    spec_again: Out,
    spec: Value,
}

fn observe(rt: Rt, work: &Path, cg_parent: &str) -> Observed {
    fs::create_dir_all(work).unwrap();
    let root = work.join("root");
    let id = "c1";
    let cg = format!("{cg_parent}/{id}");
    let missing = [
        vec!["state", "nope"],
        vec!["kill", "nope", "KILL"],
        vec!["delete", "nope"],
        vec!["delete", "--force", "nope"],
        vec!["start", "nope"],
        vec!["ps", "nope"],
        vec!["pause", "nope"],
        vec!["events", "--stats", "nope"],
    ]
    .iter()
    .map(|a| {
        let o = rt.run(&root, a);
        (a.join(" "), o.code, o.stderr)
    })
    .collect();
    let log = work.join("log.json");
    let mut c = rt.command(&root);
    c.arg("--log")
        .arg(&log)
        .args(["--log-format", "json", "state", "nope"]);
    assert_eq!(run(c).code, 1);
    let log_text = fs::read_to_string(&log).unwrap();
    let log_line = serde_json::from_str(log_text.lines().last().unwrap()).unwrap();
    let list_empty_json = rt.run(&root, &["list", "--format", "json"]).ok().to_owned();
    let list_empty_table = rt.run(&root, &["list"]).ok().to_owned();

    let bundle = Bundle::new(&work.join("bundle"), &["sleep", "1000"], cg_parent, id);
    let b = bundle.dir.to_str().unwrap();
    rt.run(&root, &["create", "--bundle", b, id]).ok();
    let created = rt.run(&root, &["state", id]).json();
    let list_json = rt.run(&root, &["list", "--format", "json"]).json();
    let list_table = rt.run(&root, &["list"]).ok().to_owned();
    rt.run(&root, &["start", id]).ok();
    let running = wait_status(rt, &root, id, "running");
    let ps_json = rt.run(&root, &["ps", "--format", "json", id]).json();
    let events = rt.run(&root, &["events", "--stats", id]).json();
    let exec_code = rt.run(&root, &["exec", id, "sh", "-c", "exit 5"]).code;

    // exec --process --detach --pid-file, as containerd's shim calls it.
    let config: Value =
        serde_json::from_slice(&fs::read(bundle.dir.join("config.json")).unwrap()).unwrap();
    let mut process = config["process"].clone();
    process["args"] = serde_json::json!(["sleep", "999"]);
    let process_file = work.join("process.json");
    fs::write(&process_file, process.to_string()).unwrap();
    let pid_file = work.join("exec.pid");
    rt.run(
        &root,
        &[
            "exec",
            "--process",
            process_file.to_str().unwrap(),
            "--detach",
            "--pid-file",
            pid_file.to_str().unwrap(),
            id,
        ],
    )
    .ok();
    let exec_pid: i64 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let exec_detached_pid_in_container = rt
        .run(&root, &["ps", "--format", "json", id])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p.as_i64() == Some(exec_pid));

    rt.run(&root, &["pause", id]).ok();
    let paused = rt.run(&root, &["state", id]).json()["status"]
        .as_str()
        .unwrap()
        .to_owned();
    rt.run(&root, &["resume", id]).ok();
    let resumed = rt.run(&root, &["state", id]).json()["status"]
        .as_str()
        .unwrap()
        .to_owned();
    rt.run(&root, &["update", "--pids-limit", "50", id]).ok();
    let pids_max = fs::read_to_string(pids_cgroup_file(&cg, "pids.max"))
        .unwrap_or_default()
        .trim()
        .to_owned();
    let delete_running_code = rt.run(&root, &["delete", id]).code;
    rt.run(&root, &["kill", id, "KILL"]).ok();
    let stopped = wait_status(rt, &root, id, "stopped");
    let kill_stopped = rt.run(&root, &["kill", id, "KILL"]);
    rt.run(&root, &["delete", id]).ok();
    let deleted_state_code = rt.run(&root, &["state", id]).code;

    // run: create + start + wait + delete.
    let run_bundle = Bundle::new(
        &work.join("run-bundle"),
        &["sh", "-c", "echo hi from run; exit 4"],
        cg_parent,
        "r1",
    );
    let run_out = rt.run(
        &root,
        &["run", "--bundle", run_bundle.dir.to_str().unwrap(), "r1"],
    );
    assert_eq!(
        rt.run(&root, &["state", "r1"]).code,
        1,
        "{rt:?} run deleted r1"
    );

    let features = rt.run(&root, &["features"]).json();
    let spec_dir = work.join("spec");
    fs::create_dir_all(&spec_dir).unwrap();
    let spec_first = rt
        .run(&root, &["spec", "--bundle", spec_dir.to_str().unwrap()])
        .code;
    let spec_again = rt.run(&root, &["spec", "--bundle", spec_dir.to_str().unwrap()]);
    let spec = serde_json::from_slice(&fs::read(spec_dir.join("config.json")).unwrap()).unwrap();
    // Nothing of the containers is left in --root.
    let left: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{rt:?} left {left:?} in --root");
    Observed {
        missing,
        log_line,
        list_empty_json,
        list_empty_table,
        created,
        list_json,
        list_table,
        running,
        ps_json,
        events,
        exec_code,
        exec_detached_pid_in_container,
        paused,
        resumed,
        pids_max,
        delete_running_code,
        stopped,
        kill_stopped,
        deleted_state_code,
        run_out,
        features,
        spec_first,
        spec_again,
        spec,
    }
}

#[test]
fn runc_and_agentrun_agree() {
    let Some(_lock) = setup() else { return };
    let work = tempdir();
    let cgp = CgroupParent::new("agentrun-e2e-oci");
    let cg_parent = cgp.name.clone();
    let rc = observe(
        Rt::Runc,
        &work.path().join("runc"),
        &format!("/{cg_parent}"),
    );
    let ar = observe(
        Rt::Agentrun,
        &work.path().join("agentrun"),
        &format!("/{cg_parent}"),
    );
    let leftover = cgp.children();
    assert!(leftover.is_empty(), "cgroups left: {leftover:?}");

    // Missing containers: same exit codes, and the message the shim matches on.
    for ((cmd, rc_code, rc_err), (_, ar_code, ar_err)) in rc.missing.iter().zip(&ar.missing) {
        assert_eq!(
            rc_code, ar_code,
            "exit code of `{cmd}`: runc {rc_err:?}, agentrun {ar_err:?}"
        );
        if rc_err.contains("container does not exist") {
            assert!(
                ar_err.contains("container does not exist"),
                "`{cmd}`: {ar_err:?}"
            );
        }
    }
    assert_eq!(rc.log_line["level"], "error");
    assert_eq!(ar.log_line["level"], rc.log_line["level"]);
    assert_eq!(ar.log_line["msg"], rc.log_line["msg"]);
    assert_eq!(keys(&ar.log_line), keys(&rc.log_line));
    assert_eq!(ar.list_empty_json, rc.list_empty_json);
    assert_eq!(ar.list_empty_table, rc.list_empty_table);

    // state
    for (r, a, status) in [
        (&rc.created, &ar.created, "created"),
        (&rc.running, &ar.running, "running"),
        (&rc.stopped, &ar.stopped, "stopped"),
    ] {
        assert_eq!(
            keys(a),
            keys(r),
            "state keys when {status}: runc {r}, agentrun {a}"
        );
        assert_eq!(a["status"], status);
        assert_eq!(a["id"], "c1");
        assert!(
            a["bundle"].as_str().unwrap().ends_with("agentrun/bundle"),
            "{a}"
        );
        assert!(
            a["rootfs"]
                .as_str()
                .unwrap()
                .ends_with("agentrun/bundle/rootfs"),
            "{a}"
        );
        assert_eq!(a["owner"], r["owner"]);
        assert!(a["created"].as_str().unwrap().ends_with('Z'), "{a}");
        assert_eq!(a["pid"].is_number(), r["pid"].is_number());
    }
    assert!(ar.created["pid"].as_i64().unwrap() > 0);
    assert_eq!(ar.running["pid"], ar.created["pid"]);
    assert_eq!(rc.stopped["pid"], 0);
    assert_eq!(ar.stopped["pid"], 0);

    // list
    let (rl, al) = (
        &rc.list_json.as_array().unwrap()[0],
        &ar.list_json.as_array().unwrap()[0],
    );
    assert_eq!(ar.list_json.as_array().unwrap().len(), 1);
    assert_eq!(keys(al), keys(rl));
    assert_eq!(al["status"], "created");
    // Same columns, aligned (widths depend on the bundle paths, which differ).
    let header = |t: &str| {
        t.lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(header(&ar.list_table), header(&rc.list_table));
    let table: Vec<&str> = ar.list_table.lines().collect();
    for col in ["STATUS", "BUNDLE", "CREATED", "OWNER"] {
        let at = table[0].find(col).unwrap();
        assert_ne!(
            &table[1][at..at + 1],
            " ",
            "{col} aligned:\n{}",
            ar.list_table
        );
        assert_eq!(
            &table[1][at - 3..at],
            "   ",
            "{col} aligned:\n{}",
            ar.list_table
        );
    }
    let row: Vec<String> = ar
        .list_table
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(row[0], "c1");
    assert_eq!(row[1], ar.created["pid"].to_string());
    assert_eq!(row[2], "created");

    // ps, events
    assert_eq!(ar.ps_json, serde_json::json!([ar.running["pid"]]));
    assert_eq!(rc.ps_json, serde_json::json!([rc.running["pid"]]));
    assert_eq!(ar.events["type"], "stats");
    assert_eq!(ar.events["id"], "c1");
    assert_eq!(keys(&ar.events), keys(&rc.events));
    for section in ["cpu", "memory", "pids"] {
        assert!(
            ar.events["data"][section].is_object(),
            "{section}: {}",
            ar.events
        );
        assert!(
            rc.events["data"][section].is_object(),
            "{section}: {}",
            rc.events
        );
    }
    assert_eq!(ar.events["data"]["pids"]["current"], 1);
    assert!(
        ar.events["data"]["memory"]["usage"]["usage"]
            .as_u64()
            .unwrap()
            > 0
    );

    // exec, pause/resume, update, delete/kill
    assert_eq!((rc.exec_code, ar.exec_code), (5, 5));
    assert!(rc.exec_detached_pid_in_container && ar.exec_detached_pid_in_container);
    assert_eq!(
        (ar.paused.as_str(), ar.resumed.as_str()),
        ("paused", "running")
    );
    assert_eq!((&ar.paused, &ar.resumed), (&rc.paused, &rc.resumed));
    assert_eq!(rc.pids_max, "50");
    assert_eq!(ar.pids_max, "50");
    assert_eq!(ar.delete_running_code, rc.delete_running_code);
    assert_eq!(ar.delete_running_code, 1);
    assert_eq!(
        ar.kill_stopped.code, rc.kill_stopped.code,
        "{:?} vs {:?}",
        rc.kill_stopped, ar.kill_stopped
    );
    assert!(
        ar.kill_stopped.stderr.contains("container not running"),
        "{:?}",
        ar.kill_stopped
    );
    assert_eq!((rc.deleted_state_code, ar.deleted_state_code), (1, 1));

    // run
    assert_eq!(
        (rc.run_out.code, ar.run_out.code),
        (4, 4),
        "{:?} {:?}",
        rc.run_out,
        ar.run_out
    );
    assert_eq!(ar.run_out.stdout, "hi from run\n");
    assert_eq!(ar.run_out.stdout, rc.run_out.stdout);

    // features, spec
    assert_eq!(keys(&ar.features), keys(&rc.features));
    for k in ["namespaces", "capabilities", "cgroup", "seccomp"] {
        assert!(
            ar.features["linux"][k].is_object() || ar.features["linux"][k].is_array(),
            "{k}"
        );
    }
    assert_eq!(
        keys(&ar.features["linux"]["seccomp"]),
        keys(&rc.features["linux"]["seccomp"])
    );
    assert_eq!(ar.features["linux"]["seccomp"]["enabled"], true);
    assert_eq!(ar.features["ociVersionMin"], rc.features["ociVersionMin"]);
    assert_eq!(ar.features["hooks"], rc.features["hooks"]);
    assert_eq!((rc.spec_first, ar.spec_first), (0, 0));
    assert_eq!(ar.spec_again.code, rc.spec_again.code);
    assert!(
        ar.spec_again.stderr.contains("File config.json exists"),
        "{:?}",
        ar.spec_again
    );
    assert_eq!(keys(&ar.spec), keys(&rc.spec));
    assert_eq!(ar.spec["process"]["args"], rc.spec["process"]["args"]);
    assert_eq!(ar.spec["root"], rc.spec["root"]);
    assert_eq!(ar.spec["hostname"], "agentrun");
    assert_eq!(keys(&ar.spec["process"]), keys(&rc.spec["process"]));
    assert_eq!(keys(&ar.spec["linux"]), keys(&rc.spec["linux"]));
}

/// Processes whose command line mentions `dir` (containerd shims started for it).
fn processes_mentioning(dir: &Path) -> Vec<String> {
    let d = dir.to_string_lossy().into_owned();
    all_processes()
        .into_iter()
        .filter(|p| p.cmdline.iter().any(|a| a.contains(&d)))
        .map(|p| format!("{p}"))
        .collect()
}

#[test]
fn containerd_runs_containers_with_agentrun() {
    let Some(_lock) = setup() else { return };
    let work = tempdir();
    let dir = work.path().to_owned();
    let cgp = CgroupParent::new("agentrun-e2e-ctr");
    let cg_parent = cgp.name.clone();
    let runc_root = dir.join("runc");
    let bin = agentrun_bin();
    {
        let ctrd = Containerd::start(&dir);
        let tar = busybox_image_tar();
        let out = ctrd.ctr([
            "image".as_ref(),
            "import".as_ref(),
            "--base-name".as_ref(),
            "agentrun.test/busybox".as_ref(),
            tar.as_os_str(),
        ]);
        assert!(out.status.success(), "import\n{out}\n{}", ctrd.log());
        // `ctr run`'s arguments after `run`.
        let run_args = |id: &str, extra: &[&str], cmd: &[&str]| -> Vec<String> {
            let mut a: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            a.extend([
                "--runc-binary".into(),
                bin.to_string_lossy().into_owned(),
                "--runc-root".into(),
                runc_root.to_string_lossy().into_owned(),
                "--cgroup".into(),
                format!("/{cg_parent}/{id}"),
                IMAGE.into(),
                id.into(),
            ]);
            a.extend(cmd.iter().map(|s| s.to_string()));
            a
        };
        let with_run = |a: Vec<String>| -> Vec<String> {
            std::iter::once("run".to_string()).chain(a).collect()
        };

        // ctr run --rm: output and exit code.
        let out = ctrd.run(run_args(
            "c1",
            &["--rm"],
            &["sh", "-c", "echo hello from agentrun; exit 3"],
        ));
        assert_eq!(out.status.code(), Some(3), "{out}\n{}", ctrd.log());
        assert_eq!(out.stdout(), "hello from agentrun\n");

        // The spec's seccomp is enforced (ctr's --seccomp: containerd's default profile denies
        // unshare without CAP_SYS_ADMIN); without it, the same command works.
        let probe = [
            "sh",
            "-c",
            "unshare -U true && echo unshared || echo denied",
        ];
        let out = ctrd.run(run_args("c-seccomp", &["--rm", "--seccomp"], &probe));
        assert_eq!(out.stdout(), "denied\n", "{out}");
        let out = ctrd.run(run_args("c-noseccomp", &["--rm"], &probe));
        assert_eq!(out.stdout(), "unshared\n", "{out}");

        // The profile annotation: Landlock keeps / read-only except the profile's paths.
        let write = [
            "sh",
            "-c",
            "echo x > /etc/f && echo wrote-etc; echo y > /tmp/f && echo wrote-tmp",
        ];
        let out = ctrd.run(run_args(
            "c-profile",
            &["--rm", "--annotation", "run.agentrun.profile=strict"],
            &write,
        ));
        assert_eq!(out.stdout(), "wrote-tmp\n", "{out}");
        let out = ctrd.run(run_args("c-noprofile", &["--rm"], &write));
        assert_eq!(out.stdout(), "wrote-etc\nwrote-tmp\n", "{out}");

        // A terminal (`ctr run -t`: create --console-socket), under `script` for a pty.
        let in_pty = |args: Vec<String>| {
            let ctr = format!(
                "ctr -a {} -n {NAMESPACE} {}",
                ctrd.socket.display(),
                args.iter()
                    .map(|a| format!("'{a}'"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            let mut c = Command::new("script");
            c.args(["-qec", &ctr, "/dev/null"]);
            agentrun_e2e::run_with_timeout(c, None, Duration::from_secs(60))
        };
        // The answer is the exit code: `ctr run -t` loses the tail of the output like `ctr run`
        // (agentrun_e2e::ctr) and cannot log to a binary instead.
        let out = in_pty(with_run(run_args(
            "c-tty",
            &["--rm", "-t"],
            &[
                "sh",
                "-c",
                "[ -t 0 ] && [ -t 1 ] && case $(tty) in /dev/pts/*) exit 5;; esac; exit 9",
            ],
        )));
        assert_eq!(out.status.code(), Some(5), "stdin and stdout a pty\n{out}");

        // A detached task: exec, ps, pause/resume, metrics, kill -9.
        let out = ctrd.ctr(with_run(run_args("c2", &["-d"], &["sleep", "1000"])));
        assert!(out.status.success(), "{out}\n{}", ctrd.log());
        let task_pid = wait_until(Duration::from_secs(10), || {
            let out = ctrd.ctr(["task", "ls"]);
            out.stdout()
                .lines()
                .find(|l| l.starts_with("c2 ") && l.contains("RUNNING"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .expect("c2 running");
        // It is agentrun's container: agentrun's own `state` sees it in the shim's root.
        let state = run({
            let mut c = Command::new(&bin);
            c.arg("--root")
                .arg(runc_root.join(NAMESPACE))
                .args(["state", "c2"]);
            c
        })
        .json();
        assert_eq!(state["status"], "running");
        assert_eq!(state["pid"].to_string(), task_pid);
        let out = ctrd.ctr([
            "task",
            "exec",
            "--exec-id",
            "e1",
            "c2",
            "sh",
            "-c",
            "echo exec says hi; exit 7",
        ]);
        assert_eq!(out.status.code(), Some(7), "{out}\n{}", ctrd.log());
        assert_eq!(out.stdout(), "exec says hi\n");
        // exec -t: exec --console-socket. The answer is the exit code, as for `ctr run -t`:
        // ctr's copy of a terminal's output loses its tail too (a full run under stress-ng
        // lost this exec's whole `tty` line).
        let out = in_pty(
            [
                "task",
                "exec",
                "-t",
                "--exec-id",
                "e2",
                "c2",
                "sh",
                "-c",
                "[ -t 0 ] && [ -t 1 ] && case $(tty) in /dev/pts/*) exit 6;; esac; exit 9",
            ]
            .map(String::from)
            .to_vec(),
        );
        assert_eq!(out.status.code(), Some(6), "stdin and stdout a pty\n{out}");
        let out = ctrd.ctr(["task", "ps", "c2"]);
        assert!(out.stdout().contains(&task_pid), "{out}");
        assert!(ctrd.ctr(["task", "pause", "c2"]).status.success());
        assert!(ctrd.tasks().contains(&("c2".into(), "PAUSED".into())));
        assert!(ctrd.ctr(["task", "resume", "c2"]).status.success());
        assert!(ctrd.tasks().contains(&("c2".into(), "RUNNING".into())));
        let out = ctrd.ctr(["task", "metrics", "c2"]);
        assert!(out.status.success(), "{out}");
        let out = ctrd.ctr(["task", "kill", "-s", "SIGKILL", "c2"]);
        assert!(out.status.success(), "{out}");
        wait_until(Duration::from_secs(10), || {
            ctrd.tasks()
                .contains(&("c2".into(), "STOPPED".into()))
                .then_some(())
        })
        .expect("c2 stopped after SIGKILL");
        assert!(ctrd.ctr(["task", "delete", "c2"]).status.success());
        assert!(ctrd.ctr(["container", "delete", "c2"]).status.success());

        // ctr task kill (SIGTERM) reaches the container's process; ctr run returns its code.
        let script = "trap 'echo got TERM; exit 42' TERM; echo ready; while :; do sleep 0.1; done";
        let log = agentrun_e2e::ctr::ContainerLog::new();
        let mut c3 = Running::spawn(
            ctrd.ctr_command(log.args(with_run(run_args("c3", &["--rm"], &["sh", "-c", script])))),
            None,
        );
        wait_until(Duration::from_secs(10), || {
            log.stdout().contains("ready").then_some(())
        })
        .unwrap_or_else(|| panic!("c3 never ready: {}", c3.stderr_so_far()));
        let out = ctrd.ctr(["task", "kill", "c3"]);
        assert!(out.status.success(), "{out}");
        let out = log.output(c3.wait_or_kill(Duration::from_secs(20)));
        assert_eq!(out.status.code(), Some(42), "{out}");
        assert_eq!(out.stdout(), "ready\ngot TERM\n");

        assert_eq!(ctrd.tasks(), vec![], "tasks left");
        let left: Vec<_> = fs::read_dir(runc_root.join(NAMESPACE))
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "agentrun state left: {left:?}");
    } // containerd stopped here
    let ok = wait_until(Duration::from_secs(10), || {
        processes_mentioning(&dir).is_empty().then_some(())
    });
    assert!(
        ok.is_some(),
        "processes left: {:?}",
        processes_mentioning(&dir)
    );
    assert_eq!(mounts_under(&dir), Vec::<PathBuf>::new(), "mounts left");
    let leftover = cgp.children();
    assert!(leftover.is_empty(), "cgroups left: {leftover:?}");
}

/// A container's output under containerd arrives whole under load, with agentrun and with
/// runc as the runtime: 100,000 lines on stdout, a line on stderr, exit 3, several times, with
/// the CPUs busy and whoever reads `ctr run`'s own stdout reading it slowly (a busy log
/// shipper). Read from ctr's stdout, the tail goes missing (every time with the slow reader,
/// now and then with the CPUs busy alone): Debian's ctr 1.6.20 closes its FIFOs before
/// draining them. The suite reads a container's output through a logging binary instead
/// (agentrun_e2e::ctr), which this proves whole.
#[test]
fn containerd_keeps_a_containers_whole_output_under_load() {
    let Some(_lock) = agentrun_e2e::setup_exclusive() else {
        return;
    };
    let work = tempdir();
    let dir = work.path().to_owned();
    let cgp = CgroupParent::new("agentrun-e2e-ctrload");
    let bin = agentrun_bin();
    let runc_root = dir.join("runc");
    {
        let ctrd = Containerd::start(&dir);
        let tar = busybox_image_tar();
        let out = ctrd.ctr([
            "image".as_ref(),
            "import".as_ref(),
            "--base-name".as_ref(),
            "agentrun.test/busybox".as_ref(),
            tar.as_os_str(),
        ]);
        assert!(out.status.success(), "import\n{out}\n{}", ctrd.log());
        let _load = agentrun_e2e::CpuLoad::start(2, Duration::from_secs(120));
        const LINES: usize = 100_000;
        let script = format!("seq 1 {LINES}; echo done >&2; exit 3");
        for round in 0..2 {
            for runtime in ["agentrun", "runc"] {
                let id = format!("load-{runtime}-{round}");
                let mut args: Vec<String> = vec!["run".into(), "--rm".into()];
                if runtime == "agentrun" {
                    args.extend([
                        "--runc-binary".into(),
                        bin.to_string_lossy().into_owned(),
                        "--runc-root".into(),
                        runc_root.to_string_lossy().into_owned(),
                        "--cgroup".into(),
                        format!("/{}/{id}", cgp.name),
                    ]);
                }
                args.extend([
                    IMAGE.into(),
                    id.clone(),
                    "sh".into(),
                    "-c".into(),
                    script.clone(),
                ]);
                let log = agentrun_e2e::ctr::ContainerLog::new();
                let mut cmd = ctrd.ctr_command(log.args(&args));
                let (code, ctr_stdout, ctr_stderr) = run_read_slowly(&mut cmd);
                assert_eq!(code, Some(3), "{id}: {ctr_stderr}\n{}", ctrd.log());
                assert_eq!(
                    ctr_stdout, "",
                    "{id}: the container's output went to the log"
                );
                let stdout = log.stdout();
                let lines: Vec<&str> = stdout.lines().collect();
                assert_eq!(
                    (lines.len(), lines.last().copied()),
                    (LINES, Some("100000")),
                    "{id}: the whole output (stderr: {}{ctr_stderr})",
                    log.stderr()
                );
                assert_eq!(log.stderr(), "done\n", "{id}: {ctr_stderr}");
            }
        }
        assert_eq!(ctrd.tasks(), vec![], "tasks left");
    }
    let leftover = cgp.children();
    assert!(leftover.is_empty(), "cgroups left: {leftover:?}");
}

/// Runs `cmd` (60 s at most), reading its stdout 4 KiB every 2 ms: its exit code, stdout and
/// stderr.
fn run_read_slowly(cmd: &mut Command) -> (Option<i32>, String, String) {
    use std::io::Read;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ctr");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let slow = std::thread::spawn(move || {
        let (mut all, mut buf) = (Vec::new(), [0u8; 4096]);
        loop {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = wait_until(Duration::from_secs(60), || child.try_wait().ok().flatten());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let code = status.and_then(|s| s.code());
    (code, slow.join().unwrap(), errs.join().unwrap())
}

#[test]
fn profile_annotation_confines_the_container() {
    let Some(_lock) = setup() else { return };
    let work = tempdir();
    let cgp = CgroupParent::new("agentrun-e2e-prof");
    let cg_parent = cgp.name.clone();
    let root = work.path().join("root");
    let script = "echo x > /etc/f && echo wrote-etc; echo y > /tmp/f && echo wrote-tmp; \
                  unshare -U true 2>/dev/null && echo unshared || echo no-unshare";
    let plain = Bundle::new(
        &work.path().join("plain"),
        &["sh", "-c", script],
        &format!("/{cg_parent}"),
        "plain",
    );
    let out = Rt::Agentrun.run(
        &root,
        &["run", "--bundle", plain.dir.to_str().unwrap(), "plain"],
    );
    assert_eq!(out.stdout, "wrote-etc\nwrote-tmp\nunshared\n", "{out:?}");

    let strict = Bundle::new(
        &work.path().join("strict"),
        &["sh", "-c", script],
        &format!("/{cg_parent}"),
        "strict",
    );
    strict.edit(|c| c["annotations"] = serde_json::json!({"run.agentrun.profile": "strict"}));
    let out = Rt::Agentrun.run(
        &root,
        &["run", "--bundle", strict.dir.to_str().unwrap(), "strict"],
    );
    // Landlock: / read-only but /tmp; the profile's default seccomp: no namespaces.
    assert_eq!(out.stdout, "wrote-tmp\nno-unshare\n", "{out:?}");
    assert_eq!(out.code, 0);
    let leftover = cgp.children();
    assert!(leftover.is_empty(), "cgroups left: {leftover:?}");
}

#[test]
fn bad_profile_annotation_fails_create() {
    let Some(_lock) = setup() else { return };
    let work = tempdir();
    let cgp = CgroupParent::new("agentrun-e2e-badprof");
    let cg_parent = cgp.name.clone();
    let root = work.path().join("root");
    for bad in ["nope", "/etc/passwd"] {
        let b = Bundle::new(
            &work.path().join("b"),
            &["true"],
            &format!("/{cg_parent}"),
            "b",
        );
        b.edit(|c| c["annotations"] = serde_json::json!({"run.agentrun.profile": bad}));
        let out = Rt::Agentrun.run(&root, &["create", "--bundle", b.dir.to_str().unwrap(), "b"]);
        assert_eq!(out.code, 1, "{out:?}");
        assert!(out.stderr.contains("run.agentrun.profile"), "{out:?}");
        assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
        assert_eq!(Rt::Agentrun.run(&root, &["state", "b"]).code, 1);
        fs::remove_dir_all(&b.dir).unwrap();
    }
    assert!(cgp.children().is_empty());
}

#[test]
fn lifetime_span_is_exported_at_delete() {
    let Some(_lock) = setup() else { return };
    let rx = OtlpReceiver::grpc();
    let work = tempdir();
    let cgp = CgroupParent::new("agentrun-e2e-span");
    let cg_parent = cgp.name.clone();
    let root = work.path().join("root");
    let b = Bundle::new(
        &work.path().join("b"),
        &["sleep", "100"],
        &format!("/{cg_parent}"),
        "spanned",
    );
    b.edit(|c| {
        c["annotations"] = serde_json::json!({
            "io.kubernetes.cri.image-name": "docker.io/library/busybox:latest",
            "run.agentrun.profile": "default",
        })
    });
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let cmd = |args: &[&str]| {
        let mut c = Rt::Agentrun.command(&root);
        c.args(args);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("OTEL_") {
                c.env_remove(k);
            }
        }
        for (k, v) in rx.otel_env() {
            c.env(k, v);
        }
        c.env("TRACEPARENT", parent);
        run(c)
    };
    cmd(&["create", "--bundle", b.dir.to_str().unwrap(), "spanned"]).ok();
    cmd(&["start", "spanned"]).ok();
    std::thread::sleep(Duration::from_millis(300));
    assert!(rx.spans().is_empty(), "nothing is exported before delete");
    cmd(&["kill", "spanned", "KILL"]).ok();
    wait_status(Rt::Agentrun, &root, "spanned", "stopped");
    cmd(&["delete", "spanned"]).ok();
    let spans = rx.wait_for_spans(1, Duration::from_secs(10));
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let s = &spans[0];
    assert_eq!(s.name, "container.lifetime");
    assert_eq!(s.attr("container.id"), "spanned");
    assert_eq!(
        s.attr("container.image.name"),
        "docker.io/library/busybox:latest"
    );
    assert_eq!(s.attr("container.runtime"), "agentrun");
    assert_eq!(s.attr("sandbox.profile"), "default");
    assert_eq!(s.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(s.parent_span_id, "00f067aa0ba902b7");
    assert!(
        s.duration() >= Duration::from_millis(300),
        "{:?}",
        s.duration()
    );
    let leftover = cgp.children();
    assert!(leftover.is_empty(), "cgroups left: {leftover:?}");
}

#[test]
fn failed_create_reports_why_and_leaves_nothing() {
    let Some(_lock) = setup() else { return };
    let work = tempdir();
    let cgp = CgroupParent::new("agentrun-e2e-failcreate");
    for rt in [Rt::Runc, Rt::Agentrun] {
        let dir = work.path().join(format!("{rt:?}"));
        let root = dir.join("root");
        let b = Bundle::new(&dir.join("b"), &["true"], &cgp.path(), "b");
        // A createRuntime hook that cannot run: libcontainer fails inside its clone.
        b.edit(|c| {
            c["hooks"] = serde_json::json!({"createRuntime": [{"path": "/nonexistent-hook"}]})
        });
        let log = dir.join("log.json");
        let mut c = rt.command(&root);
        c.arg("--log")
            .arg(&log)
            .args(["--log-format", "json", "create", "--bundle"])
            .arg(&b.dir)
            .arg("b");
        let out = run(c);
        assert_eq!(out.code, 1, "{rt:?}: {out:?}");
        let text = fs::read_to_string(&log).unwrap();
        let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["level"], "error", "{rt:?}: {text}");
        // The line the shim reports names the cause.
        assert!(
            last["msg"].as_str().unwrap().contains("hook"),
            "{rt:?}: {text}"
        );
        assert_eq!(rt.run(&root, &["state", "b"]).code, 1);
        let left: Vec<_> = fs::read_dir(&root)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{rt:?} left {left:?}");
    }
    assert!(
        cgp.children().is_empty(),
        "cgroups left: {:?}",
        cgp.children()
    );
}

/// Sets a seccomp section notifying `names` to the agent at `listener`.
fn notify_rules(c: &mut Value, names: &[&str], listener: &Path) {
    c["linux"]["seccomp"] = json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "listenerPath": listener,
        "listenerMetadata": "agent-meta",
        "syscalls": [{"names": names, "action": "SCMP_ACT_NOTIFY"}],
    });
}

/// Nothing of container `id` is left: no state, no directory under `root`, no cgroup.
fn assert_gone(root: &Path, id: &str, cgp: &CgroupParent) {
    assert_eq!(Rt::Agentrun.run(root, &["state", id]).code, 1);
    assert!(!root.join(id).exists(), "{id}: state dir left");
    assert!(
        cgp.children().is_empty(),
        "cgroups left: {:?}",
        cgp.children()
    );
}

#[test]
fn seccomp_notify_hands_the_listener_to_the_agent() {
    let Some(_lock) = setup() else { return };
    let work = tempdir();
    let cgp = CgroupParent::new("agentrun-e2e-notify");
    let root = work.path().join("root");
    let agent = SeccompAgent::start(
        &work.path().join("agent.sock"),
        Answer::Errno(libc::ENOMEDIUM),
    );
    let mkdir = "mkdir /tmp/notified; echo mkdir=$?";

    // `run`: the agent gets the state and the fd during create, and answers mkdir.
    let b = Bundle::new(
        &work.path().join("b1"),
        &["sh", "-c", mkdir],
        &cgp.path(),
        "n1",
    );
    b.edit(|c| notify_rules(c, &["mkdir", "mkdirat"], &agent.path));
    let out = Rt::Agentrun.run(&root, &["run", "--bundle", b.dir.to_str().unwrap(), "n1"]);
    assert_eq!((out.code, out.stdout.as_str()), (0, "mkdir=1\n"), "{out:?}");
    assert!(out.stderr.contains("No medium found"), "{out:?}");
    let (state, fds) = agent.next_state(Duration::from_secs(1)).expect("no state");
    assert_eq!(fds, 1, "{state}");
    assert_eq!(state["fds"], json!(["seccompFd"]), "{state}");
    assert_eq!(state["metadata"], "agent-meta", "{state}");
    assert_eq!(state["state"]["id"], "n1", "{state}");
    assert_eq!(state["state"]["status"], "creating", "{state}");
    assert_eq!(state["state"]["bundle"], b.dir.to_str().unwrap(), "{state}");
    assert!(state["pid"].as_i64().unwrap() > 0 && state["pid"] == state["state"]["pid"]);
    assert!(agent.answered() >= 1);
    assert_gone(&root, "n1", &cgp);

    // `create` returns once the agent has the fd; `exec` hands over the new process's.
    let b = Bundle::new(
        &work.path().join("b2"),
        &["sleep", "100"],
        &cgp.path(),
        "n2",
    );
    b.edit(|c| notify_rules(c, &["mkdir", "mkdirat"], &agent.path));
    Rt::Agentrun
        .run(
            &root,
            &["create", "--bundle", b.dir.to_str().unwrap(), "n2"],
        )
        .ok();
    let (state, _) = agent
        .next_state(Duration::from_secs(2))
        .expect("create returned before the agent had the notify fd");
    let created = Rt::Agentrun.run(&root, &["state", "n2"]).json();
    assert_eq!(state["pid"], created["pid"], "{state} {created}");
    Rt::Agentrun.run(&root, &["start", "n2"]).ok();
    let out = Rt::Agentrun.run(&root, &["exec", "n2", "sh", "-c", mkdir]);
    assert_eq!((out.code, out.stdout.as_str()), (0, "mkdir=1\n"), "{out:?}");
    assert!(out.stderr.contains("No medium found"), "{out:?}");
    let (state, _) = agent
        .next_state(Duration::from_secs(1))
        .expect("no exec state");
    assert_eq!(state["state"]["status"], "running", "{state}");
    assert_ne!(state["pid"], created["pid"], "{state}");
    Rt::Agentrun.run(&root, &["delete", "--force", "n2"]).ok();
    assert_gone(&root, "n2", &cgp);

    // Notified syscalls the runtime itself needs after the handover (close, read, openat,
    // execve) wait for the agent instead of deadlocking.
    let cont = SeccompAgent::start(&work.path().join("cont.sock"), Answer::Continue);
    let b = Bundle::new(&work.path().join("b3"), &["true"], &cgp.path(), "n3");
    let names = ["execve", "openat", "open", "read", "close"];
    b.edit(|c| notify_rules(c, &names, &cont.path));
    let out = Rt::Agentrun.run(&root, &["run", "--bundle", b.dir.to_str().unwrap(), "n3"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(cont.answered() >= 1);
    assert_gone(&root, "n3", &cgp);

    // What cannot work fails `create` with one line naming why, and leaves nothing.
    let dead = work.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap()); // a socket nobody serves
    type Edit<'a> = Box<dyn Fn(&mut Value) + 'a>;
    let cases: [(&str, Edit); 4] = [
        (
            "failed to connect with seccomp agent",
            Box::new(|c| notify_rules(c, &["mkdir"], &dead)),
        ),
        (
            "listenerPath",
            Box::new(|c| {
                notify_rules(c, &["mkdir"], Path::new("/"));
                c["linux"]["seccomp"]
                    .as_object_mut()
                    .unwrap()
                    .remove("listenerPath");
            }),
        ),
        (
            "sendmsg",
            Box::new(|c| notify_rules(c, &["sendmsg"], &agent.path)),
        ),
        (
            "default",
            Box::new(|c| {
                notify_rules(c, &["mkdir"], &agent.path);
                c["linux"]["seccomp"]["defaultAction"] = "SCMP_ACT_NOTIFY".into();
            }),
        ),
    ];
    for (i, (want, edit)) in cases.iter().enumerate() {
        let id = format!("bad{i}");
        let b = Bundle::new(&work.path().join(&id), &["true"], &cgp.path(), &id);
        b.edit(|c| edit(c));
        let out = Rt::Agentrun.run(&root, &["create", "--bundle", b.dir.to_str().unwrap(), &id]);
        assert_eq!(out.code, 1, "{want}: {out:?}");
        let last = out.stderr.lines().last().unwrap_or_default();
        assert!(last.contains(want), "{want}: {out:?}");
        assert_gone(&root, &id, &cgp);
    }
}

#[test]
fn refusals_carry_their_cause() {
    let Some(_lock) = setup() else { return };
    let work = tempdir();
    let cgp = CgroupParent::new("agentrun-e2e-cause");
    let root = work.path().join("root");
    let symlinked = |fs: &'static str| {
        move |rootfs: &Path| {
            let dir = rootfs.join(fs);
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(rootfs.join(format!("{fs}-real"))).unwrap();
            std::os::unix::fs::symlink(format!("{fs}-real"), &dir).unwrap();
        }
    };
    type Edit = Box<dyn Fn(&mut Value)>;
    type Prepare = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Edit, Prepare)> = vec![
        // Inheritable capabilities outside an (unset, so empty) bounding set: capset EPERM.
        (
            "Operation not permitted",
            Box::new(|c| {
                let caps = json!(["CAP_SYS_ADMIN"]);
                c["process"]["capabilities"] = json!({
                    "effective": caps, "permitted": caps, "inheritable": caps, "ambient": []
                });
            }),
            Box::new(|_| {}),
        ),
        (
            "CAP_NOPE",
            Box::new(|c| c["process"]["capabilities"]["bounding"] = json!(["CAP_NOPE"])),
            Box::new(|_| {}),
        ),
        (
            "must be mounted on ordinary directory",
            Box::new(|_| {}),
            Box::new(symlinked("proc")),
        ),
        (
            "must be mounted on ordinary directory",
            Box::new(|_| {}),
            Box::new(symlinked("sys")),
        ),
    ];
    for (i, (want, edit, prepare)) in cases.iter().enumerate() {
        let id = format!("cause{i}");
        let b = Bundle::new(&work.path().join(&id), &["true"], &cgp.path(), &id);
        b.edit(|c| edit(c));
        prepare(&b.dir.join("rootfs"));
        let log = work.path().join(format!("{id}.log"));
        let mut c = Rt::Agentrun.command(&root);
        c.arg("--log")
            .arg(&log)
            .args(["--log-format", "json", "create", "--bundle"])
            .arg(&b.dir)
            .arg(&id);
        let out = run(c);
        assert_eq!(out.code, 1, "{want}: {out:?}");
        let text = fs::read_to_string(&log).unwrap();
        let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        // The line containerd's shim reports, and the bare message on stderr.
        let msg = last["msg"].as_str().unwrap();
        assert!(msg.contains(want), "{want}: {text}");
        assert!(out.stderr.contains(want), "{want}: {out:?}");
        assert_gone(&root, &id, &cgp);
    }
}

#[test]
fn exec_cpu_affinity_is_honoured() {
    let Some(_lock) = setup() else { return };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cpus >= 2,
        "this test needs 2 CPUs to tell affinities apart, the host has {cpus}"
    );
    let work = tempdir();
    let cgp = CgroupParent::new("agentrun-e2e-affinity");
    let root = work.path().join("root");
    let b = Bundle::new(
        &work.path().join("b"),
        &["sleep", "100"],
        &cgp.path(),
        "aff",
    );
    b.edit(|c| c["process"]["execCPUAffinity"] = json!({"initial": "0", "final": "1"}));
    Rt::Agentrun
        .run(
            &root,
            &[
                "run",
                "--detach",
                "--bundle",
                b.dir.to_str().unwrap(),
                "aff",
            ],
        )
        .ok();
    let grep = ["grep", "Cpus_allowed_list", "/proc/self/status"];
    // From config.json: the process runs on the final set; the initial one is logged (debug)
    // from libcontainer's intermediate process, before it joins the cgroup.
    let out = Rt::Agentrun.run(
        &root,
        &[&["--debug", "exec", "aff"][..], &grep[..]].concat(),
    );
    assert_eq!(out.ok(), "Cpus_allowed_list:\t1\n", "{out:?}");
    assert!(out.stderr.contains("affinity: 0x1"), "{out:?}");
    // From `exec --process`: its own affinity.
    let process = work.path().join("process.json");
    let spec: Value =
        serde_json::from_slice(&fs::read(b.dir.join("config.json")).unwrap()).unwrap();
    let mut p = spec["process"].clone();
    p["args"] = json!(grep);
    p["execCPUAffinity"] = json!({"initial": "1", "final": "0"});
    fs::write(&process, p.to_string()).unwrap();
    let out = Rt::Agentrun.run(
        &root,
        &["exec", "--process", process.to_str().unwrap(), "aff"],
    );
    assert_eq!(out.ok(), "Cpus_allowed_list:\t0\n", "{out:?}");
    Rt::Agentrun.run(&root, &["delete", "--force", "aff"]).ok();
    assert_gone(&root, "aff", &cgp);
}
