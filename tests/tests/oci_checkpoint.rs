//! `agentrun checkpoint` / `agentrun restore` (runc's command line, CRIU underneath).
//!
//! - `checkpoint_and_restore_continue_a_counter`: a busybox container counting in a shell
//!   variable (written to /count every 0.1 s) is checkpointed (gone afterwards: no state, no
//!   process) and restored from the images: it runs again in a pid namespace of its own and
//!   its count goes on from where it stood (a restart would count from 1); `state`, `ps`,
//!   `kill`, `delete` work on it and leave no cgroup behind.
//! - `checkpoint_refusals_name_their_cause`: an unknown container, a container confined by an
//!   agentrun profile (CRIU does not save Landlock domains: refused, still running), a
//!   restore from a directory without a checkpoint, no `criu` on PATH, and a CRIU that cannot
//!   start on this kernel (Debian 12's 3.17 where the kernel has `[vvar_vclock]`): each a
//!   one-line cause, CRIU's own error line when CRIU failed.
//!
//! - `containerd_checkpoints_and_restores_a_task_with_agentrun`: `ctr c checkpoint --task --rw`
//!   and `ctr c restore --live --rw` through containerd's runc shim with agentrun as its
//!   runtime binary (containerd pauses the task first; go-runc passes `-no-subreaper`).
//!
//! Needs root and a CRIU that works here (`criu check`): hack/test runs hack/criu first.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::oci::{Bundle, CgroupParent};
use agentrun_e2e::{agentrun_bin, run_with_timeout, setup, tempdir, wait_until, RunOutput};
use serde_json::Value;

fn oci(root: &Path, args: &[&str]) -> RunOutput {
    oci_env(root, args, None)
}

fn oci_env(root: &Path, args: &[&str], path: Option<&str>) -> RunOutput {
    let mut c = Command::new(agentrun_bin());
    c.arg("--root").arg(root).args(args);
    if let Some(p) = path {
        c.env("PATH", p);
    }
    run_with_timeout(c, None, Duration::from_secs(60))
}

fn state(root: &Path, id: &str) -> Option<Value> {
    let out = oci(root, &["state", id]);
    (out.code() == 0).then(|| serde_json::from_str(&out.stdout()).unwrap())
}

/// The last line of stderr: the cause runc's contract puts last.
fn cause(out: &RunOutput) -> String {
    out.stderr().lines().last().unwrap_or_default().to_string()
}

fn require_working_criu() {
    let out = run_with_timeout(
        {
            let mut c = Command::new("criu");
            c.arg("check");
            c
        },
        None,
        Duration::from_secs(30),
    );
    assert_eq!(
        out.code(),
        0,
        "this test needs a CRIU that works on this kernel (run hack/criu as root)\n{out}"
    );
}

/// (token, count) as the counter last wrote them.
fn count(rootfs: &Path) -> Option<(String, u64)> {
    let text = fs::read_to_string(rootfs.join("count")).ok()?;
    let (token, n) = text.trim().split_once(' ')?;
    Some((token.to_string(), n.parse().ok()?))
}

fn alive(pid: i64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Counts in a shell variable, next to a token drawn once at start: a restarted process would
/// draw a new token and count from 1 again.
const COUNTER: &str = "t=$(cat /proc/sys/kernel/random/uuid); i=0; while true; do i=$((i+1)); echo \"$t $i\" > /count.tmp; mv /count.tmp /count; sleep 0.1; done";

#[test]
fn checkpoint_and_restore_continue_a_counter() {
    let Some(_lock) = setup() else { return };
    require_working_criu();
    let work = tempdir();
    let cgp = CgroupParent::new("agentrun-e2e-ckpt");
    let root = work.path().join("root");
    let b = Bundle::new(
        &work.path().join("b"),
        &["sh", "-c", COUNTER],
        &format!("/{}", cgp.name),
        "ctr",
    );
    let rootfs = b.dir.join("rootfs");
    let bundle = b.dir.to_str().unwrap();
    let out = oci(&root, &["run", "-d", "--bundle", bundle, "ctr"]);
    assert_eq!(out.code(), 0, "{out}");
    let pid = state(&root, "ctr").unwrap()["pid"].as_i64().unwrap();
    wait_until(Duration::from_secs(20), || {
        count(&rootfs).filter(|(_, n)| *n >= 5).map(|_| ())
    })
    .expect("the counter never reached 5");

    let images = work.path().join("images");
    let wpath = work.path().join("work");
    let out = oci(
        &root,
        &[
            "checkpoint",
            "--image-path",
            images.to_str().unwrap(),
            "--work-path",
            wpath.to_str().unwrap(),
            "ctr",
        ],
    );
    assert_eq!(out.code(), 0, "{out}");
    assert!(images.join("inventory.img").exists(), "no images written");
    // runc's behaviour without --leave-running: the container is gone.
    let gone = oci(&root, &["state", "ctr"]);
    assert_eq!(gone.code(), 1, "{gone}");
    assert!(gone.stderr().contains("container does not exist"), "{gone}");
    wait_until(Duration::from_secs(10), || (!alive(pid)).then_some(()))
        .expect("the checkpointed process still runs");
    let (token, at_checkpoint) = count(&rootfs).expect("no count");
    assert!(at_checkpoint >= 5);

    let out = oci(
        &root,
        &[
            "restore",
            "-d",
            "--image-path",
            images.to_str().unwrap(),
            "--work-path",
            wpath.to_str().unwrap(),
            "--bundle",
            bundle,
            "ctr",
        ],
    );
    assert_eq!(out.code(), 0, "{out}");
    let st = state(&root, "ctr").expect("no state after restore");
    assert_eq!(st["status"], "running", "{st}");
    let new_pid = st["pid"].as_i64().unwrap();
    assert!(alive(new_pid));
    // Its own pid namespace, where it is PID 1 again.
    let status = fs::read_to_string(format!("/proc/{new_pid}/status")).unwrap();
    let nspid = status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .unwrap()
        .to_string();
    assert!(nspid.ends_with("\t1"), "{nspid}");
    // The count goes on from where it stood (its value and the token live in the shell's
    // memory).
    let (next_token, next) = wait_until(Duration::from_secs(20), || {
        count(&rootfs).filter(|(_, n)| *n != at_checkpoint)
    })
    .expect("the restored counter never counted");
    assert_eq!(
        next_token, token,
        "the restored shell drew a new token: restarted"
    );
    assert!(
        next > at_checkpoint,
        "restored counter went from {at_checkpoint} to {next}: not a continuation"
    );
    let ps = oci(&root, &["ps", "ctr"]);
    assert_eq!(ps.code(), 0, "{ps}");
    assert!(ps.stdout().contains(&new_pid.to_string()), "{ps}");

    let out = oci(&root, &["kill", "ctr", "KILL"]);
    assert_eq!(out.code(), 0, "{out}");
    wait_until(Duration::from_secs(10), || (!alive(new_pid)).then_some(()))
        .expect("the restored process survived SIGKILL");
    let out = oci(&root, &["delete", "ctr"]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(state(&root, "ctr").is_none());
    let left = cgp.children();
    assert!(left.is_empty(), "cgroups left: {left:?}");
}

#[test]
fn checkpoint_refusals_name_their_cause() {
    let Some(_lock) = setup() else { return };
    let work = tempdir();
    let cgp = CgroupParent::new("agentrun-e2e-ckptbad");
    let root = work.path().join("root");
    let images = work.path().join("images");
    let img = images.to_str().unwrap();

    let out = oci(&root, &["checkpoint", "--image-path", img, "nosuch"]);
    assert_eq!(out.code(), 1, "{out}");
    assert!(cause(&out).contains("container does not exist"), "{out}");

    // A container under an agentrun profile: its Landlock domain would not survive.
    let strict = Bundle::new(
        &work.path().join("strict"),
        &["sleep", "1000"],
        &format!("/{}", cgp.name),
        "strict",
    );
    strict.edit(|c| c["annotations"] = serde_json::json!({"run.agentrun.profile": "strict"}));
    let out = oci(
        &root,
        &[
            "run",
            "-d",
            "--bundle",
            strict.dir.to_str().unwrap(),
            "strict",
        ],
    );
    assert_eq!(out.code(), 0, "{out}");
    let out = oci(&root, &["checkpoint", "--image-path", img, "strict"]);
    assert_eq!(out.code(), 1, "{out}");
    assert!(cause(&out).contains("Landlock"), "{out}");
    assert_eq!(state(&root, "strict").unwrap()["status"], "running");

    // Plain container for the CRIU failures.
    let plain = Bundle::new(
        &work.path().join("plain"),
        &["sleep", "1000"],
        &format!("/{}", cgp.name),
        "plain",
    );
    let out = oci(
        &root,
        &[
            "run",
            "-d",
            "--bundle",
            plain.dir.to_str().unwrap(),
            "plain",
        ],
    );
    assert_eq!(out.code(), 0, "{out}");
    let out = oci_env(
        &root,
        &["checkpoint", "--image-path", img, "plain"],
        Some("/nonexistent"),
    );
    assert_eq!(out.code(), 1, "{out}");
    assert!(cause(&out).contains("criu"), "{out}");
    assert_eq!(state(&root, "plain").unwrap()["status"], "running");

    // Debian 12's CRIU (3.17) where it cannot start here: its own reason is named.
    if Path::new("/usr/sbin/criu").exists() {
        let check = run_with_timeout(
            {
                let mut c = Command::new("/usr/sbin/criu");
                c.arg("check");
                c
            },
            None,
            Duration::from_secs(30),
        );
        if check.code() != 0 {
            let first = check
                .stderr()
                .lines()
                .chain(check.stdout().lines())
                .find_map(|l| l.find("Error (").map(|i| l[i..].to_string()))
                .expect("criu check failed without an Error line");
            let out = oci_env(
                &root,
                &["checkpoint", "--image-path", img, "plain"],
                Some("/usr/sbin:/usr/bin:/sbin:/bin"),
            );
            assert_eq!(out.code(), 1, "{out}");
            // "Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds" on this kernel.
            let reason = first.split("): ").nth(1).unwrap_or(&first).to_string();
            assert!(cause(&out).contains(&reason), "want {reason:?}\n{out}");
        }
    }

    let empty = work.path().join("empty");
    fs::create_dir_all(&empty).unwrap();
    let out = oci(
        &root,
        &[
            "restore",
            "-d",
            "--image-path",
            empty.to_str().unwrap(),
            "--bundle",
            plain.dir.to_str().unwrap(),
            "again",
        ],
    );
    assert_eq!(out.code(), 1, "{out}");
    assert!(cause(&out).contains("no checkpoint"), "{out}");
    assert!(state(&root, "again").is_none());

    for id in ["strict", "plain"] {
        let out = oci(&root, &["delete", "-f", id]);
        assert_eq!(out.code(), 0, "{out}");
    }
    let left = cgp.children();
    assert!(left.is_empty(), "cgroups left: {left:?}");
}

/// containerd's `ctr c checkpoint --task` / `ctr c restore --live` through its runc shim with
/// agentrun as the runtime binary: the task's counter goes on after the restore.
#[test]
fn containerd_checkpoints_and_restores_a_task_with_agentrun() {
    use agentrun_e2e::oci::{busybox_image_tar, Containerd, IMAGE};
    let Some(_lock) = setup() else { return };
    require_working_criu();
    let work = tempdir();
    let dir = work.path().to_owned();
    let cgp = CgroupParent::new("agentrun-e2e-ctrck");
    let runc_root = dir.join("runc");
    let bin = agentrun_bin();
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
    let out = ctrd.ctr([
        "run",
        "-d",
        "--runc-binary",
        bin.to_str().unwrap(),
        "--runc-root",
        runc_root.to_str().unwrap(),
        "--cgroup",
        &format!("/{}/ck", cgp.name),
        IMAGE,
        "ck",
        "sh",
        "-c",
        COUNTER,
    ]);
    assert!(out.status.success(), "run -d\n{out}\n{}", ctrd.log());
    let read = || -> Option<(String, u64)> {
        let out = ctrd.ctr(["task", "exec", "--exec-id", "rd", "ck", "cat", "/count"]);
        let text = out.stdout();
        let (t, n) = text.trim().split_once(' ')?;
        Some((t.to_string(), n.parse().ok()?))
    };
    wait_until(Duration::from_secs(30), || read().filter(|(_, n)| *n >= 3))
        .unwrap_or_else(|| panic!("the counter never counted\n{}", ctrd.log()));
    let out = ctrd.ctr([
        "c",
        "checkpoint",
        "--task",
        "--rw",
        "ck",
        "agentrun.test/ck:1",
    ]);
    assert!(out.status.success(), "checkpoint\n{out}\n{}", ctrd.log());
    let (token, at) = read().expect("a count after the checkpoint");
    let out = ctrd.ctr(["task", "kill", "-s", "KILL", "ck"]);
    assert!(out.status.success(), "kill\n{out}");
    wait_until(Duration::from_secs(20), || {
        ctrd.ctr(["task", "delete", "ck"])
            .status
            .success()
            .then_some(())
    })
    .unwrap_or_else(|| panic!("task delete\n{}", ctrd.log()));
    let out = ctrd.ctr(["c", "rm", "ck"]);
    assert!(out.status.success(), "c rm\n{out}");
    let out = ctrd.ctr(["c", "restore", "--live", "--rw", "ck", "agentrun.test/ck:1"]);
    assert!(out.status.success(), "restore\n{out}\n{}", ctrd.log());
    // The dump was taken (the task paused) at a count <= `at` (the task ran on after it:
    // --leave-running); the restored shell counts on from the dumped count with the token
    // it drew at its start (a restart would draw another and count from 1).
    let (t2, n2) = wait_until(Duration::from_secs(30), || read().filter(|(_, n)| *n > at))
        .unwrap_or_else(|| panic!("the restored counter never passed {at}\n{}", ctrd.log()));
    assert_eq!(t2, token, "restarted, not restored (count {n2})");
    let _ = ctrd.ctr(["task", "kill", "-s", "KILL", "ck"]);
    let _ = wait_until(Duration::from_secs(20), || {
        ctrd.ctr(["task", "delete", "ck"])
            .status
            .success()
            .then_some(())
    });
    let _ = ctrd.ctr(["c", "rm", "ck"]);
    let left = wait_until(Duration::from_secs(10), || {
        cgp.children().is_empty().then_some(())
    });
    assert!(left.is_some(), "cgroups left: {:?}", cgp.children());
}
