//! Rootless mode: `agentrun exec` and `agentrun serve` as an ordinary user.
//!
//! The harness runs as root; each test binary makes one fresh user (`useradd`), copies the
//! binary under test into its home, builds the busybox and host-Python images there (added
//! by the user with `agentrun image add`), and runs agentrun as that user through
//! `runuser -u USER -- env -i ...` (nothing of root's environment: the user's own default
//! store and state dir, `~/.local/share/agentrun` and `~/.local/state/agentrun/run` here).
//! The user, its processes and its home are removed when the binary exits. The tests of this
//! binary take a lock of their own (one at a time: the leftover checks count the user's
//! processes) and the shared e2e lock.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use agentrun_e2e::users::{self, Throwaway};
use agentrun_e2e::*;

/// The user every test here runs agentrun as.
struct User {
    name: String,
    uid: u32,
    home: PathBuf,
    bin: PathBuf,
}

static USER: OnceLock<User> = OnceLock::new();
static SERIAL: Mutex<()> = Mutex::new(());
impl User {
    fn pids(&self) -> Vec<i32> {
        users::pids_of(self.uid)
    }

    /// `agentrun ARGS` as the user, with a clean environment.
    fn command(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", &self.name, "--", "env", "-i"])
            .arg(format!("HOME={}", self.home.display()))
            .arg("PATH=/usr/bin:/bin")
            .arg(format!("USER={}", self.name));
        for (k, v) in env {
            cmd.arg(format!("{k}={v}"));
        }
        cmd.arg(&self.bin).args(args).current_dir(&self.home);
        cmd
    }

    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> RunOutput {
        run_with_timeout(self.command(args, env), None, DEFAULT_TIMEOUT)
    }

    /// `agentrun exec --image IMG -- CMD` on the cold path.
    fn cold(&self, image: &str, cmd: &[&str]) -> RunOutput {
        let mut args = vec!["exec", "--image", image, "--"];
        args.extend_from_slice(cmd);
        self.run(&args, &[("AGENTRUN_NO_DAEMON", "1")])
    }

    /// `agentrun exec --image IMG -- CMD` through the user's daemon (fails if none answers:
    /// a cold fallback would not be the warm path).
    fn warm(&self, image: &str, cmd: &[&str]) -> RunOutput {
        let mut args = vec!["exec", "--image", image, "--"];
        args.extend_from_slice(cmd);
        self.run(&args, &[])
    }

    fn state_dir(&self) -> PathBuf {
        self.home.join(".local/state/agentrun/run")
    }

    fn store(&self) -> PathBuf {
        self.home.join(".local/share/agentrun")
    }

    /// As root: `path` made the user's (recursively).
    fn chown(&self, path: &Path) {
        let path = path.to_str().expect("a UTF-8 path");
        host("chown", ["-R", self.name.as_str(), path]).success();
    }
}

fn make_user() -> User {
    let Throwaway { name, uid, home } = users::make_user(&format!("arl{}", std::process::id()));
    let bin_dir = home.join("bin");
    fs::create_dir_all(&bin_dir).unwrap();
    let bin = bin_dir.join("agentrun");
    fs::copy(agentrun_bin(), &bin).expect("copy the binary under test");
    let user = User {
        name,
        uid,
        home,
        bin,
    };
    user.chown(&bin_dir);
    // The images, built by root, handed to the user and added by the user.
    let busybox = user.home.join("busybox-rootfs");
    let mut build = Command::new(workspace_root().join("images/busybox/build.sh"));
    build.arg(&busybox);
    run_with_timeout(build, None, Duration::from_secs(120)).success();
    let python = user.home.join("python-rootfs");
    agentrun_e2e::images::host_python_rootfs(&python);
    for d in [&busybox, &python] {
        user.chown(d);
    }
    let b = busybox.to_str().unwrap();
    user.run(&["image", "add", "busybox", b, "--cmd", "/bin/sh"], &[])
        .success();
    let p = python.to_str().unwrap();
    user.run(&["image", "add", "python", p, "--cmd", "python3"], &[])
        .success();
    fs::remove_dir_all(&busybox).unwrap();
    fs::remove_dir_all(&python).unwrap();
    user
}

/// The user (made on first use) and this binary's lock; `None` (skipped) without root.
fn user() -> Option<(&'static User, MutexGuard<'static, ()>, TestLock)> {
    let lock = setup()?;
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    Some((USER.get_or_init(make_user), serial, lock))
}

/// The user's daemon, stopped (and waited for) when dropped.
struct Daemon {
    running: Running,
}

impl Daemon {
    fn start(u: &User, pool: &str) -> Daemon {
        let cmd = u.command(&["serve", "--pool", pool], &[]);
        let mut running = Running::spawn(cmd, None);
        let sock = u.state_dir().join("agentrun.sock");
        let ready = wait_until(Duration::from_secs(60), || {
            let out = u.run(&["ps", "--json"], &[]);
            let ready = out.status.success() && out.stdout().contains("\"ready\"");
            ready.then_some(())
        });
        if ready.is_none() {
            let out = running.wait_or_kill(Duration::from_secs(5));
            panic!("the user's daemon did not get a ready shell within 60s\n{out}");
        }
        let meta = fs::metadata(&sock).expect("the daemon's socket");
        assert_eq!(meta.uid(), u.uid, "the socket is the user's");
        assert_eq!(meta.mode() & 0o777, 0o600, "the socket is private");
        Daemon { running }
    }

    /// The ids of its ready shells.
    fn shells(u: &User) -> Vec<String> {
        let out = u.run(&["ps", "--json"], &[]);
        let v: serde_json::Value = serde_json::from_str(&out.success()).expect("ps --json");
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.running.signal(libc::SIGTERM);
        let _ = self.running.wait_or_kill(Duration::from_secs(30));
    }
}

/// The sandbox id of the user's newest run, from its audit log.
fn last_run_sandbox(u: &User) -> String {
    let out = u.run(&["audit", "--json"], &[]);
    let last = out
        .success()
        .lines()
        .rev()
        .find(|l| l.contains("\"kind\":\"run\""))
        .expect("a run record")
        .to_string();
    let v: serde_json::Value = serde_json::from_str(&last).unwrap();
    v["sandbox_id"].as_str().unwrap().to_string()
}

#[test]
fn print_1_cold_as_an_ordinary_user() {
    let Some((u, _s, _l)) = user() else { return };
    let out = u.cold("busybox", &["echo", "hello"]);
    assert_eq!(out.success(), "hello\n", "{out}");
    let out = u.cold("python", &["python3", "-c", "print(1)"]);
    assert_eq!(out.success(), "1\n", "{out}");
    // Root inside is the caller outside; ids 1.. are the user's subordinate range when it has
    // one (useradd gives one where /etc/subuid exists) and newuidmap/newgidmap are installed,
    // else nothing else is mapped.
    let out = u.cold("busybox", &["cat", "/proc/self/uid_map"]);
    let map: Vec<String> = out.success().split_whitespace().map(String::from).collect();
    let range_of = |file: &str| {
        fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() == 3 && (f[0] == u.name || f[0] == u.uid.to_string()))
                    .then(|| (f[1].to_string(), f[2].to_string()))
            })
    };
    let helpers = ["/usr/bin/newuidmap", "/usr/bin/newgidmap"]
        .iter()
        .all(|p| Path::new(p).exists());
    match (range_of("/etc/subuid"), range_of("/etc/subgid")) {
        (Some((start, count)), Some(_)) if helpers => {
            assert_eq!(
                map,
                ["0", &u.uid.to_string(), "1", "1", &start, &count],
                "{out}"
            );
            // Another id inside is usable: a file chowned to it.
            let out = u.cold(
                "busybox",
                &[
                    "sh",
                    "-c",
                    "touch /tmp/f && chown 1000:1000 /tmp/f && stat -c %u /tmp/f",
                ],
            );
            assert_eq!(out.success(), "1000\n", "{out}");
        }
        _ => assert_eq!(map, ["0", &u.uid.to_string(), "1"], "{out}"),
    }
    // The host image (the host's /usr bound in read-only) works rootless.
    let out = u.cold("host", &["python3", "-c", "print(1)"]);
    assert_eq!(out.success(), "1\n", "{out}");
    // The store and state are the user's own, private.
    for d in [u.store(), u.state_dir()] {
        let m = fs::metadata(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        assert_eq!(
            (m.uid(), m.mode() & 0o777),
            (u.uid, 0o700),
            "{}",
            d.display()
        );
    }
}

#[test]
fn print_1_warm_through_the_users_daemon() {
    let Some((u, _s, _l)) = user() else { return };
    let _d = Daemon::start(u, "python:default=1");
    let before = Daemon::shells(u);
    let out = u.warm("python", &["python3", "-c", "print(1)"]);
    assert_eq!(out.success(), "1\n", "{out}");
    let ran_in = last_run_sandbox(u);
    assert!(
        before.contains(&ran_in),
        "the run was not in a pooled shell: ran in {ran_in}, pool had {before:?}"
    );
    let out = u.warm("busybox", &["echo", "hello"]);
    assert_eq!(out.success(), "hello\n", "{out}");
    // A workspace on a pooled shell: mounted in its user namespace, written as the user.
    let ws = u.home.join("warm-ws");
    fs::create_dir_all(&ws).unwrap();
    u.chown(&ws);
    let before = Daemon::shells(u);
    let w = ws.to_str().unwrap();
    let out = u.run(
        &[
            "exec",
            "--image",
            "python",
            "--workspace",
            w,
            "--",
            "python3",
            "-c",
            "open('/workspace/w.txt', 'w').write('warm')",
        ],
        &[],
    );
    out.success();
    assert!(before.contains(&last_run_sandbox(u)), "not a pooled shell");
    let m = fs::metadata(ws.join("w.txt")).expect("the run's file");
    assert_eq!(m.uid(), u.uid);
}

#[test]
fn info_and_limits_say_how_they_are_enforced() {
    let Some((u, _s, _l)) = user() else { return };
    let out = u.run(&["info"], &[]);
    let text = out.success();
    assert!(text.contains("mode:              rootless"), "{text}");
    assert!(
        text.contains("memory: RLIMIT_AS") && text.contains("no delegated cgroup"),
        "{text}"
    );
    // The memory limit holds: a 100 MB buffer under a 64 MiB limit fails.
    let out = u.run(
        &[
            "exec",
            "--memory",
            "64m",
            "--image",
            "busybox",
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=/dev/null bs=100M count=1 && echo allocated",
        ],
        &[("AGENTRUN_NO_DAEMON", "1")],
    );
    assert!(!out.stdout().contains("allocated"), "{out}");
    assert!(out.stderr().contains("out of memory"), "{out}");
    // The wall-clock watchdog.
    let out = u.run(
        &[
            "exec",
            "--timeout",
            "1",
            "--image",
            "busybox",
            "--",
            "sleep",
            "30",
        ],
        &[("AGENTRUN_NO_DAEMON", "1")],
    );
    out.assert_code(124);
}

#[test]
fn escapes_are_refused() {
    let Some((u, _s, _l)) = user() else { return };
    // A root-only file, and a private file of the user's own outside any rule.
    let secret = PathBuf::from(format!("/etc/agentrun-rootless-{}", std::process::id()));
    fs::write(&secret, "root's secret\n").unwrap();
    fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let own = u.home.join("private.txt");
    fs::write(&own, "the user's own\n").unwrap();
    u.chown(&own);
    // A host process of the same user, to be signalled from inside.
    let mut sleeper = Running::spawn(
        {
            let mut c = Command::new("runuser");
            c.args(["-u", &u.name, "--", "sleep", "60"]);
            c
        },
        None,
    );
    let script = format!(
        "cat {s} 2>/dev/null && echo READ-ROOT; \
         cat {own} 2>/dev/null && echo READ-OWN; \
         ls /home 2>/dev/null | grep -q . && echo SEE-HOMES; \
         kill -9 {pid} 2>/dev/null && echo KILLED; \
         echo x > /usr/bin/planted 2>/dev/null && echo WROTE-USR; \
         ls /run/agentrun/agentrun.sock 2>/dev/null && echo ROOT-SOCKET; \
         nc -w 1 127.0.0.1 22 </dev/null 2>/dev/null && echo NET; \
         echo done",
        s = secret.display(),
        own = own.display(),
        pid = sleeper.pid(),
    );
    let out = u.cold("busybox", &["sh", "-c", &script]);
    let _ = fs::remove_file(&secret);
    assert_eq!(out.success(), "done\n", "{out}");
    assert!(
        !sleeper.exited(),
        "the host process was killed from the sandbox"
    );
    sleeper.stop();
    // The image the user added is unchanged by the attempted write.
    let planted = walk_for(&u.store(), "planted");
    assert!(planted.is_empty(), "{planted:?}");
    // A daemon socket of root's (0600 in a searchable directory) is not reachable: the
    // user's agentrun pointed at it never connects (it runs cold instead).
    let dir = tempdir();
    fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let sock = dir.path().join("agentrun.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let out = u.run(
        &["exec", "--image", "busybox", "--", "echo", "cold"],
        &[("AGENTRUN_SOCKET", sock.to_str().unwrap())],
    );
    assert_eq!(out.success(), "cold\n", "{out}");
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the user reached root's socket: {other:?}"),
    }
}

/// Files named `name` under `dir`.
fn walk_for(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_name() == name {
                found.push(p.clone());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    found
}

const PLANT: &str = "echo s3cret > /tmp/secret; echo s3cret > /root/secret; \
                     echo s3cret > /dev/shm/secret; (sleep 60 &); echo planted";
const LOOK: &str = "cat /tmp/secret /root/secret /dev/shm/secret 2>/dev/null; \
                    ps -o comm | grep -c sleep; echo looked";

#[test]
fn a_secret_of_one_run_is_not_visible_to_the_next() {
    let Some((u, _s, _l)) = user() else { return };
    assert_eq!(
        u.cold("busybox", &["sh", "-c", PLANT]).success(),
        "planted\n"
    );
    assert_eq!(
        u.cold("busybox", &["sh", "-c", LOOK]).success(),
        "0\nlooked\n"
    );
    // Warm: one pooled shell, so the second run is in the very shell the first used.
    let _d = Daemon::start(u, "busybox:default=1");
    assert_eq!(
        u.warm("busybox", &["sh", "-c", PLANT]).success(),
        "planted\n"
    );
    let first = last_run_sandbox(u);
    assert_eq!(
        u.warm("busybox", &["sh", "-c", LOOK]).success(),
        "0\nlooked\n"
    );
    assert_eq!(
        last_run_sandbox(u),
        first,
        "both runs in one shell (the case that matters)"
    );
}

#[test]
fn nothing_is_left_behind() {
    let Some((u, _s, _l)) = user() else { return };
    // Host mounts under the user's home (its store and state dir): there are never any.
    let home = u.home.to_str().unwrap().to_string();
    let mounts = move || -> Vec<String> {
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&home))
            .map(String::from)
            .collect()
    };
    for _ in 0..3 {
        u.cold("busybox", &["sh", "-c", "sleep 60 & echo started"])
            .success();
    }
    {
        let _d = Daemon::start(u, "busybox:default=1");
        u.warm("busybox", &["sh", "-c", "sleep 60 & echo started"])
            .success();
    }
    let left = wait_until(Duration::from_secs(10), || {
        let p = u.pids();
        p.is_empty().then_some(())
    });
    assert!(left.is_some(), "processes left: {:?}", u.pids());
    assert_eq!(
        mounts(),
        Vec::<String>::new(),
        "host mounts under the user's home"
    );
    let sandboxes: Vec<_> = fs::read_dir(u.state_dir().join("sandboxes"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(sandboxes.is_empty(), "state dirs left: {sandboxes:?}");
    // Nothing in the XDG dirs but the store and the state dir.
    let local = u.home.join(".local");
    let mut found: Vec<String> = Vec::new();
    for sub in ["share", "state"] {
        for e in fs::read_dir(local.join(sub)).unwrap().flatten() {
            found.push(format!("{sub}/{}", e.file_name().to_string_lossy()));
        }
    }
    found.sort();
    assert_eq!(found, ["share/agentrun", "state/agentrun"]);
}

#[test]
fn what_needs_root_refuses_in_one_line() {
    let Some((u, _s, _l)) = user() else { return };
    let out = u.run(&["oci", "state", "x"], &[]);
    out.assert_agentrun_error();
    assert!(out.stderr().contains("needs root"), "{out}");
}

/// `agentrun image build` as the user: RUN steps in rootless sandboxes, their changes
/// (files, modes, a removed file) as layers over the base, COPY and ENV; a failing RUN is one
/// line; nothing left.
#[test]
fn image_build_with_run_steps_as_an_ordinary_user() {
    let Some((u, _s, _l)) = user() else { return };
    let ctx = u.home.join("build-ctx");
    fs::create_dir_all(&ctx).unwrap();
    fs::write(
        ctx.join("Dockerfile"),
        "FROM busybox\n\
         RUN mkdir /built && echo made > /built/f && chmod 600 /built/f && rm /bin/yes\n\
         COPY in.txt /built/in.txt\n\
         ENV X=set\n\
         RUN cat /built/f /built/in.txt > /built/g && echo \"$X\" >> /built/g\n",
    )
    .unwrap();
    fs::write(ctx.join("in.txt"), "copied\n").unwrap();
    fs::write(
        ctx.join("Fail"),
        "FROM busybox\nRUN echo no > /x && false\n",
    )
    .unwrap();
    u.chown(&ctx);
    let c = ctx.to_str().unwrap();
    let out = u.run(&["image", "build", "-t", "built", c], &[]);
    assert!(out.success().contains("Successfully tagged"), "{out}");
    let out = u.cold(
        "built",
        &[
            "sh",
            "-c",
            "cat /built/g; stat -c '%u:%g %a' /built/f; ls /bin/yes 2>/dev/null || echo removed",
        ],
    );
    assert_eq!(
        out.success(),
        "made\ncopied\nset\n0:0 600\nremoved\n",
        "{out}"
    );
    // The base is unchanged.
    let out = u.cold("busybox", &["ls", "/bin/yes", "/built"]);
    assert!(
        out.stdout().contains("/bin/yes") && !out.status.success(),
        "{out}"
    );
    // A failing RUN: one line, nothing tagged.
    let out = u.run(
        &["image", "build", "-q", "-f", "Fail", "-t", "failed", c],
        &[],
    );
    out.assert_agentrun_error();
    assert!(
        out.stderr().contains("returned a non-zero code: 1"),
        "{out}"
    );
    let out = u.run(&["image", "ls"], &[]);
    assert!(
        out.success().contains("built") && !out.stdout().contains("failed"),
        "{out}"
    );
    u.run(&["image", "rm", "built"], &[]).success();
    fs::remove_dir_all(&ctx).unwrap();
    assert_nothing_left(u);
}

#[test]
fn the_workspace_is_the_users_and_other_files_stay_closed() {
    let Some((u, _s, _l)) = user() else { return };
    let ws = u.home.join("ws");
    fs::create_dir_all(&ws).unwrap();
    fs::write(ws.join("in.txt"), "input\n").unwrap();
    u.chown(&ws);
    let w = ws.to_str().unwrap();
    // Read and written as root inside; on the host the new file is the user's.
    let out = u.run(
        &[
            "exec",
            "--image",
            "busybox",
            "--workspace",
            w,
            "--",
            "sh",
            "-c",
            "cat /workspace/in.txt && echo out > /workspace/out.txt",
        ],
        &[("AGENTRUN_NO_DAEMON", "1")],
    );
    assert_eq!(out.success(), "input\n", "{out}");
    let m = fs::metadata(ws.join("out.txt")).expect("the run's file");
    assert_eq!(
        (
            m.uid(),
            fs::read_to_string(ws.join("out.txt")).unwrap().as_str()
        ),
        (u.uid, "out\n")
    );
    // A read-only mount stays read-only.
    let ro = format!("{w}:/data");
    let out = u.run(
        &[
            "exec",
            "--image",
            "busybox",
            "--ro",
            &ro,
            "--",
            "sh",
            "-c",
            "cat /data/in.txt; echo x > /data/new 2>/dev/null && echo WROTE; echo done",
        ],
        &[("AGENTRUN_NO_DAEMON", "1")],
    );
    assert_eq!(out.success(), "input\ndone\n", "{out}");
    assert!(!ws.join("new").exists());
    // Another owner's 0600 file in a directory the user may search: mounted, still closed.
    let other = tempdir();
    fs::set_permissions(
        other.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let secret = other.path().join("secret");
    fs::write(&secret, "root's\n").unwrap();
    fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let spec = format!("{}:/other", other.path().display());
    let out = u.run(
        &[
            "exec",
            "--image",
            "busybox",
            "--ro",
            &spec,
            "--",
            "sh",
            "-c",
            "cat /other/secret 2>/dev/null && echo READ; echo done",
        ],
        &[("AGENTRUN_NO_DAEMON", "1")],
    );
    assert_eq!(out.stdout(), "done\n", "{out}");
}

#[test]
fn landlock_only_is_confined_without_namespaces() {
    let Some((u, _s, _l)) = user() else { return };
    let ws = u.home.join("lo-ws");
    fs::create_dir_all(&ws).unwrap();
    u.chown(&ws);
    let secret = PathBuf::from(format!("/etc/agentrun-lo-{}", std::process::id()));
    fs::write(&secret, "root's\n").unwrap();
    fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let own = u.home.join("lo-private.txt");
    fs::write(&own, "own\n").unwrap();
    u.chown(&own);
    let mut sleeper = Running::spawn(
        {
            let mut c = Command::new("runuser");
            c.args(["-u", &u.name, "--", "sleep", "60"]);
            c
        },
        None,
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!(
        "echo in-ws > out.txt && echo WS; \
         cat {s} 2>/dev/null && echo READ-ROOT; \
         cat {own} 2>/dev/null && echo READ-OWN; \
         echo x > {home}/planted 2>/dev/null && echo WROTE-HOME; \
         kill -9 {pid} 2>/dev/null && echo KILLED; \
         python3 -c 'import socket; print(\"py\", flush=True); socket.create_connection((\"127.0.0.1\", {port}), 2)' \
           2>/dev/null && echo TCP; \
         echo done",
        s = secret.display(),
        own = own.display(),
        home = u.home.display(),
        pid = sleeper.pid(),
    );
    let w = ws.to_str().unwrap();
    let out = u.run(
        &[
            "exec",
            "--isolation",
            "landlock-only",
            "--workspace",
            w,
            "--",
            "sh",
            "-c",
            &script,
        ],
        &[],
    );
    let _ = fs::remove_file(&secret);
    // (python3 ran, and its connect failed.)
    assert_eq!(out.success(), "WS\npy\ndone\n", "{out}");
    assert_eq!(fs::read_to_string(ws.join("out.txt")).unwrap(), "in-ws\n");
    assert!(!u.home.join("planted").exists());
    assert!(!sleeper.exited(), "the host process was killed");
    sleeper.stop();
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the run reached a host TCP listener: {other:?}"),
    }
    // Its limits are rlimits, said so; the wall-clock watchdog holds.
    let out = u.run(
        &[
            "exec",
            "--isolation",
            "landlock-only",
            "--timeout",
            "1",
            "--",
            "sleep",
            "30",
        ],
        &[],
    );
    out.assert_code(124);
}

#[test]
fn a_killed_cold_run_leaves_nothing_after_the_next() {
    let Some((u, _s, _l)) = user() else { return };
    // setpriv execs: the pid is agentrun's own, and SIGKILL reaches it, not a wrapper.
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid",
        &u.name,
        "--regid",
        &u.name,
        "--init-groups",
        "env",
        "-i",
    ])
    .arg(format!("HOME={}", u.home.display()))
    .arg("PATH=/usr/bin:/bin")
    .arg("AGENTRUN_NO_DAEMON=1")
    .arg(&u.bin)
    .args([
        "exec",
        "--image",
        "busybox",
        "--",
        "sh",
        "-c",
        "echo up; sleep 60",
    ])
    .current_dir(&u.home);
    let mut run = Running::spawn(cmd, None);
    let up = wait_until(Duration::from_secs(30), || {
        run.stdout_so_far().contains("up").then_some(())
    });
    assert!(
        up.is_some(),
        "the run did not start: {}",
        run.stderr_so_far()
    );
    let sandboxes = u.state_dir().join("sandboxes");
    let count = || fs::read_dir(&sandboxes).map(|d| d.count()).unwrap_or(0);
    assert_eq!(count(), 1, "the run's state dir");
    run.kill9();
    // Its sandbox dies with it (the init's parent-death signal), processes and all.
    let gone = wait_until(Duration::from_secs(10), || {
        u.pids().is_empty().then_some(())
    });
    assert!(gone.is_some(), "processes left: {:?}", u.pids());
    // The next run collects the dead run's state dir.
    u.cold("busybox", &["true"]).success();
    assert_eq!(count(), 0, "state dirs left");
}

#[test]
fn the_egress_allowlist_works_rootless() {
    let Some((u, _s, _l)) = user() else { return };
    // A host HTTP server (answers every connection with "ok"); its thread ends with the binary.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            use std::io::{Read, Write};
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    let fetch = format!(
        "import urllib.request\ntry:\n    print(urllib.request.urlopen('http://127.0.0.1:{port}/', \
         timeout=10).read().decode())\nexcept Exception as e:\n    print('refused', e)"
    );
    let allow = format!("127.0.0.1:{port}");
    // Allowed: through the run's egress proxy (the cell has no other way out).
    let out = u.run(
        &[
            "exec",
            "--image",
            "python",
            "--allow-host",
            &allow,
            "--",
            "python3",
            "-c",
            &fetch,
        ],
        &[("AGENTRUN_NO_DAEMON", "1")],
    );
    assert_eq!(out.success(), "ok\n", "{out}");
    // Not allowed: refused.
    let out = u.run(
        &["exec", "--image", "python", "--", "python3", "-c", &fetch],
        &[("AGENTRUN_NO_DAEMON", "1")],
    );
    assert!(out.success().starts_with("refused"), "{out}");
}

/// The official MCP SDK client (`tests/mcp/sdk_client.py SCENARIO`) as the user, with the
/// host's `/usr/bin/python3` and the packages of `.venv/mcp` (the venv's own interpreter is
/// under root's private home): it starts `agentrun mcp ARGS` on stdio as MCP hosts do. The
/// user's `XDG_RUNTIME_DIR` is `~/run` (as a login session's would be).
fn mcp_client(u: &User, scenario: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let site = agentrun_e2e::mcp::venv_site_packages();
    let tests = workspace_root().join("tests/mcp");
    let run_dir = u.home.join("run");
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", &u.name, "--", "env", "-i"])
        .arg(format!("HOME={}", u.home.display()))
        .arg("PATH=/usr/bin:/bin")
        .arg(format!("USER={}", u.name))
        .arg(format!("XDG_RUNTIME_DIR={}", run_dir.display()))
        .arg(format!("PYTHONPATH={}:{}", site.display(), tests.display()))
        .arg("PYTHONDONTWRITEBYTECODE=1")
        .arg(format!("MCP_AGENTRUN={}", u.bin.display()))
        .arg(format!(
            "MCP_ARGS={}",
            serde_json::to_string(args).expect("JSON args")
        ));
    for (k, v) in env {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.arg("/usr/bin/python3")
        .arg(tests.join("sdk_client.py"))
        .arg(scenario)
        .current_dir(&u.home);
    cmd
}

/// The user's `XDG_RUNTIME_DIR` (`~/run`), made 0700 and the user's.
fn runtime_dir(u: &User) -> PathBuf {
    let dir = u.home.join("run");
    fs::create_dir_all(&dir).unwrap();
    fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    u.chown(&dir);
    dir
}

/// Everything under `dir` but directories and lock files (`slot.lock`, `daemon.lock`: empty
/// flock files, kept so that a lock is never taken on a file being removed).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            } else if e.file_name() != "slot.lock" && e.file_name() != "daemon.lock" {
                found.push(p);
            }
        }
    }
    found.sort();
    found
}

/// `agentrun mcp` on stdio as an ordinary user, started by the official MCP SDK client as an
/// MCP host starts it: print(1), a session's state between calls, the file tools inside the
/// sandbox, a workspace, the egress allowlist, the wall-clock and memory limits, escapes refused (root's 0600 file, the user's
/// own file, a host process of the user's, the image), and nothing left once the client is
/// gone (no process of the user's, no sandbox state under XDG_RUNTIME_DIR, no host mount).
#[test]
fn mcp_stdio_server_as_an_ordinary_user() {
    let Some((u, _s, _l)) = user() else { return };
    let run_dir = runtime_dir(u);
    let secret = PathBuf::from(format!("/etc/agentrun-rootless-mcp-{}", std::process::id()));
    fs::write(&secret, "root's secret\n").unwrap();
    fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let own = u.home.join("private-mcp.txt");
    fs::write(&own, "the user's own\n").unwrap();
    u.chown(&own);
    let mut sleeper = Running::spawn(
        {
            let mut c = Command::new("runuser");
            c.args(["-u", &u.name, "--", "sleep", "120"]);
            c
        },
        None,
    );
    let pid = sleeper.pid().to_string();
    // Two host HTTP servers answering "ok": one allowed (--allow-host), one not.
    let mut ports = Vec::new();
    for _ in 0..2 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        ports.push(listener.local_addr().unwrap().port());
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                use std::io::{Read, Write};
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                );
            }
        });
    }
    let allow = format!("127.0.0.1:{}", ports[0]);
    let (allowed, denied) = (
        format!("http://127.0.0.1:{}/", ports[0]),
        format!("http://127.0.0.1:{}/", ports[1]),
    );
    let ws = u.home.join("mcp-ws");
    fs::create_dir_all(&ws).unwrap();
    u.chown(&ws);
    let cmd = mcp_client(
        u,
        "rootless",
        &[
            "--pool-size",
            "1",
            "--workspace",
            ws.to_str().unwrap(),
            "--allow-host",
            &allow,
        ],
        &[
            ("ALLOWED_URL", &allowed),
            ("DENIED_URL", &denied),
            ("ESC_SECRET", secret.to_str().unwrap()),
            ("ESC_OWN", own.to_str().unwrap()),
            ("ESC_PID", &pid),
        ],
    );
    let out = run_with_timeout(cmd, None, Duration::from_secs(240));
    let _ = fs::remove_file(&secret);
    assert!(
        out.status.success() && out.stdout().contains("OK rootless"),
        "{out}"
    );
    assert!(
        !sleeper.exited(),
        "the host process was killed from the sandbox"
    );
    sleeper.stop();
    // The sandbox sees its own processes only (a handful), not the host's.
    let pids: usize = out
        .stdout()
        .lines()
        .find_map(|l| l.strip_prefix("PIDS "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no PIDS line\n{out}"));
    assert!(pids < 10, "the sandbox sees {pids} processes\n{out}");
    // The workspace's file, written by write_file, is the user's on the host.
    let written = ws.join("from-mcp.txt");
    assert_eq!(fs::read_to_string(&written).unwrap(), "ws");
    assert_eq!(fs::metadata(&written).unwrap().uid(), u.uid);
    // The image (`host`, the default: the host's /usr) is unchanged by the attempted writes.
    assert!(
        !Path::new("/usr/bin/planted").exists(),
        "a file planted in /usr"
    );
    // Nothing left: the servers ended with their client, their sandboxes with them.
    let left = wait_until(Duration::from_secs(20), || {
        u.pids().is_empty().then_some(())
    });
    assert!(left.is_some(), "processes left: {:?}", u.pids());
    let state = run_dir.join("agentrun");
    assert!(
        state.join("mcp").is_dir(),
        "the state is under XDG_RUNTIME_DIR"
    );
    assert_eq!(files_under(&state), Vec::<PathBuf>::new(), "state left");
    let home = u.home.to_str().unwrap();
    let mounts: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(home))
        .map(String::from)
        .collect();
    assert_eq!(
        mounts,
        Vec::<String>::new(),
        "host mounts under the user's home"
    );
}

/// The MCP SDK scenarios of tests/tests/mcp_sdk.rs that need no root-only setup, as the user:
/// the tools and their schemas (`basics`), Python globals per session (`sessions`),
/// `--one-shot`, and the policy's denials with their rules (`denials`, a workspace of the
/// user's).
#[test]
fn mcp_sdk_scenarios_as_an_ordinary_user() {
    let Some((u, _s, _l)) = user() else { return };
    runtime_dir(u);
    let ws = u.home.join("mcp-denials-ws");
    fs::create_dir_all(&ws).unwrap();
    u.chown(&ws);
    let ws_s = ws.to_str().unwrap();
    for (scenario, args) in [
        ("basics", &[][..]),
        ("sessions", &[][..]),
        ("one_shot", &["--one-shot"][..]),
        ("denials", &["--workspace", ws_s][..]),
    ] {
        let out = run_with_timeout(
            mcp_client(u, scenario, args, &[]),
            None,
            Duration::from_secs(240),
        );
        assert!(
            out.status.success() && out.stdout().contains(&format!("OK {scenario}")),
            "{scenario}: {out}"
        );
        if scenario == "denials" {
            let w: serde_json::Value = out
                .stdout()
                .lines()
                .find_map(|l| l.strip_prefix("WRITE_DENIAL "))
                .and_then(|j| serde_json::from_str(j).ok())
                .unwrap_or_else(|| panic!("no WRITE_DENIAL\n{out}"));
            assert_eq!(w["rule_id"], "filesystem.default", "{w}");
            assert!(!Path::new("/etc/agentrun-mcp-evil").exists());
            assert_eq!(fs::read_to_string(ws.join("ok.txt")).unwrap(), "fine");
        }
    }
    let left = wait_until(Duration::from_secs(20), || {
        u.pids().is_empty().then_some(())
    });
    assert!(left.is_some(), "processes left: {:?}", u.pids());
}

/// No process of the user's, no host mount under its home, no sandbox state dir left.
fn assert_nothing_left(u: &User) {
    let left = wait_until(Duration::from_secs(10), || {
        u.pids().is_empty().then_some(())
    });
    assert!(left.is_some(), "processes left: {:?}", u.pids());
    let home = u.home.to_str().unwrap();
    let mounts: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(home))
        .map(String::from)
        .collect();
    assert_eq!(mounts, Vec::<String>::new(), "host mounts under the home");
    let sandboxes: Vec<_> = fs::read_dir(u.state_dir().join("sandboxes"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(sandboxes.is_empty(), "state dirs left: {sandboxes:?}");
}

/// `agentrun volume` and `exec --volume` as the user: the volume's files are the user's on
/// the host and root's inside, they persist from a cold run to a warm one, `:ro` holds, bad
/// input is one line, root's volumes and this user's store stay out of reach of others.
#[test]
fn named_volumes_are_the_users_and_persist_across_runs() {
    let Some((u, _s, _l)) = user() else { return };
    assert_eq!(
        u.run(&["volume", "create", "data"], &[]).success(),
        "data\n"
    );
    let out = u.run(&["volume", "inspect", "data"], &[]);
    let v: serde_json::Value = serde_json::from_str(&out.success()).expect("inspect JSON");
    let mountpoint = PathBuf::from(v[0]["mountpoint"].as_str().unwrap());
    assert_eq!(v[0]["uid"], u.uid, "{out}");
    assert!(mountpoint.starts_with(u.store().join("volumes")), "{out}");
    let m = fs::metadata(&mountpoint).unwrap();
    assert_eq!(m.uid(), u.uid, "the volume's directory is the user's");
    // Written cold as the sandbox's root; on the host the file is the user's.
    let out = u.run(
        &[
            "exec",
            "--image",
            "busybox",
            "--volume",
            "data:/data",
            "--",
            "sh",
            "-c",
            "echo one > /data/f && stat -c %u /data/f",
        ],
        &[("AGENTRUN_NO_DAEMON", "1")],
    );
    assert_eq!(out.success(), "0\n", "{out}");
    let f = mountpoint.join("f");
    assert_eq!(fs::read_to_string(&f).unwrap(), "one\n");
    assert_eq!(fs::metadata(&f).unwrap().uid(), u.uid);
    // Read again by a warm run (the user's daemon), which appends.
    {
        let _d = Daemon::start(u, "busybox:default=1");
        let out = u.run(
            &[
                "exec",
                "--image",
                "busybox",
                "--volume",
                "data:/v",
                "--",
                "sh",
                "-c",
                "cat /v/f && echo two >> /v/f",
            ],
            &[],
        );
        assert_eq!(out.success(), "one\n", "{out}");
        let shells = Daemon::shells(u);
        assert!(
            shells.contains(&last_run_sandbox(u)),
            "the run was not the daemon's: {shells:?}"
        );
    }
    assert_eq!(fs::read_to_string(&f).unwrap(), "one\ntwo\n");
    // Read-only stays read-only; a volume named first by exec is made and kept.
    let out = u.run(
        &[
            "exec",
            "--image",
            "busybox",
            "--volume",
            "data:/v:ro",
            "--volume",
            "fresh:/w",
            "--",
            "sh",
            "-c",
            "cat /v/f; echo x > /v/g 2>/dev/null && echo WROTE; echo w > /w/w; echo done",
        ],
        &[("AGENTRUN_NO_DAEMON", "1")],
    );
    assert_eq!(out.success(), "one\ntwo\ndone\n", "{out}");
    assert!(!mountpoint.join("g").exists());
    let out = u.run(&["volume", "ls", "--json"], &[]);
    let listed: Vec<(String, String)> = serde_json::from_str::<serde_json::Value>(&out.success())
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let s = |k: &str| v[k].as_str().unwrap().to_string();
            (s("name"), s("created_by"))
        })
        .collect();
    let want = [("data", "cli"), ("fresh", "cli")].map(|(n, b)| (n.to_string(), b.to_string()));
    assert_eq!(listed, want, "{out}");
    // Bad input: one line, exit 125, nothing made.
    for args in [
        &["volume", "create", "../x"][..],
        &["volume", "create", "other", "--owner", "0:0"][..],
        &["volume", "create", "data"][..],
        &["volume", "inspect", "nosuch"][..],
        &["volume", "rm", "nosuch"][..],
        &[
            "exec", "--image", "busybox", "--volume", "data", "--", "true",
        ][..],
        &[
            "exec",
            "--image",
            "busybox",
            "--volume",
            "Bad_Name:/x",
            "--",
            "true",
        ][..],
        &[
            "exec", "--image", "busybox", "--volume", "data:rel", "--", "true",
        ][..],
        &[
            "exec",
            "--image",
            "busybox",
            "--volume",
            "data:/x:rx",
            "--",
            "true",
        ][..],
    ] {
        let out = u.run(args, &[("AGENTRUN_NO_DAEMON", "1")]);
        out.assert_agentrun_error();
    }
    assert!(!u.store().join("volumes/other").exists());
    // Root's volumes: neither its store nor a volume's directory is reachable.
    let root_store = tempdir();
    let rs = root_store.path().to_str().unwrap();
    agentrun(["--root", rs, "volume", "create", "secret"])
        .run()
        .success();
    let secret_dir = root_store.path().join("volumes/secret/data");
    fs::write(secret_dir.join("s"), "root's\n").unwrap();
    fs::set_permissions(
        root_store.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = u.run(&["--root", rs, "volume", "ls"], &[]);
    out.assert_agentrun_error();
    assert!(out.stderr().contains("not by you"), "{out}");
    let spec = format!("{}:/x", secret_dir.display());
    let out = u.run(
        &[
            "exec", "--image", "busybox", "--ro", &spec, "--", "cat", "/x/s",
        ],
        &[("AGENTRUN_NO_DAEMON", "1")],
    );
    assert!(!out.stdout().contains("root's"), "{out}");
    assert_ne!(out.code(), 0, "{out}");
    // Another user (nobody) cannot reach this user's volumes.
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(agentrun_bin())
        .args(["--root", u.store().to_str().unwrap(), "volume", "ls"])
        .env_clear()
        .env("HOME", "/nonexistent")
        .env("PATH", "/usr/bin:/bin");
    let out = run_with_timeout(cmd, None, DEFAULT_TIMEOUT);
    out.assert_agentrun_error();
    // The home is closed to others (Permission denied), or the store is not theirs.
    let err = out.stderr();
    assert!(
        err.contains("not by you") || err.contains("Permission denied"),
        "{out}"
    );
    assert!(!out.stdout().contains("data"), "{out}");
    // rm removes a volume and its files.
    for n in ["data", "fresh"] {
        assert_eq!(u.run(&["volume", "rm", n], &[]).success(), format!("{n}\n"));
    }
    assert!(!mountpoint.exists());
    assert_eq!(
        u.run(&["volume", "ls"], &[]).success(),
        "NAME\tIN USE\tCREATED\tBY\n"
    );
    assert_nothing_left(u);
}

/// The command line of process `pid` (NUL-separated arguments joined by spaces).
fn cmdline(pid: i32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// `curl` as root against the user's daemon: (status, body).
fn api(domain: &str, key: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let mut args = vec![
        "-sS".to_string(),
        "-o".into(),
        "/dev/stdout".into(),
        "-w".into(),
        "\n%{http_code}".into(),
        "-X".into(),
        method.into(),
        "-H".into(),
        format!("OPEN-SANDBOX-API-KEY: {key}"),
    ];
    if let Some(b) = body {
        args.extend([
            "-H".into(),
            "Content-Type: application/json".into(),
            "--data".into(),
            b.into(),
        ]);
    }
    args.push(format!("http://{domain}{path}"));
    let out = host("curl", &args);
    let text = out.stdout();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

/// `agentrun snapshot` as the user: a snapshot of a long-lived sandbox of the user's daemon
/// (stopped while it is read, running on after), listed by `snapshot ls` and `image ls`, run
/// cold with its files, modes, owners and symlink as they were, removed by
/// `snapshot rm`; bad ids one line; root's store out of reach; nothing left.
#[test]
fn snapshots_of_a_users_sandbox_run_with_their_files() {
    let Some((u, _s, _l)) = user() else { return };
    let key = "rootless-snap-key";
    let domain = format!("127.0.0.1:{}", agentrun_e2e::osb::free_port());
    let cmd = u.command(
        &["serve", "--pool", "busybox:default=1", "--listen", &domain],
        &[("AGENTRUN_API_KEY", key)],
    );
    let mut running = Running::spawn(cmd, None);
    let up = wait_until(Duration::from_secs(60), || {
        let (status, _) = api(&domain, key, "GET", "/v1/sandboxes", None);
        (status == 200).then_some(())
    });
    if up.is_none() {
        let out = running.wait_or_kill(Duration::from_secs(5));
        panic!("the user's daemon did not serve\n{out}");
    }
    // Where the default profile lets a sandbox write, in its writable layer.
    let entry = "mkdir -p /var/tmp/w && echo snap > /var/tmp/w/f && chmod 640 /var/tmp/w/f && \
                 ln -s f /var/tmp/w/l && touch /var/tmp/w/ready && exec sleep 600";
    let body = serde_json::json!({
        "image": {"uri": "busybox"},
        "entrypoint": ["sh", "-c", entry],
        "timeout": 600,
        "resourceLimits": {},
    })
    .to_string();
    let (status, created) = api(&domain, key, "POST", "/v1/sandboxes", Some(&body));
    assert!((200..300).contains(&status), "create: {status} {created}");
    let id = serde_json::from_str::<serde_json::Value>(&created).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The entrypoint is done when its sleep runs with /work/ready in its root.
    let sleeper = wait_until(Duration::from_secs(60), || {
        u.pids().into_iter().find(|p| {
            cmdline(*p).trim() == "sleep 600"
                && Path::new(&format!("/proc/{p}/root/var/tmp/w/ready")).exists()
        })
    })
    .unwrap_or_else(|| {
        let (_, state) = api(&domain, key, "GET", &format!("/v1/sandboxes/{id}"), None);
        let procs: Vec<String> = u.pids().into_iter().map(cmdline).collect();
        running.signal(libc::SIGTERM);
        let out = running.wait_or_kill(Duration::from_secs(30));
        panic!("the sandbox's entrypoint did not finish: {state}\n{procs:?}\n{out}")
    });
    let out = u.run(&["snapshot", "create", &id, "--name", "mine"], &[]);
    let snap = out.success().trim().to_string();
    assert!(snap.starts_with("snap-"), "{out}");
    // The sandbox runs on (its sleep not left stopped).
    let state = fs::read_to_string(format!("/proc/{sleeper}/stat")).unwrap();
    let state = state
        .rsplit_once(')')
        .unwrap()
        .1
        .trim_start()
        .chars()
        .next();
    assert_eq!(state, Some('S'), "the sandbox's process after the snapshot");
    let out = u.run(&["snapshot", "ls"], &[]);
    assert!(
        out.success().contains(&snap) && out.stdout().contains("mine"),
        "{out}"
    );
    let image = format!("agentrun.local/snapshot:{snap}");
    let out = u.run(&["image", "ls"], &[]);
    assert!(out.success().contains(&snap), "{out}");
    let out = u.run(&["snapshot", "inspect", &snap], &[]);
    let v: serde_json::Value = serde_json::from_str(&out.success()).unwrap();
    assert_eq!(v[0]["image"], image.as_str(), "{out}");
    // Bad ids: one line each.
    for args in [
        &["snapshot", "create", "nosuch"][..],
        &["snapshot", "inspect", "nosuch"][..],
        &["snapshot", "rm", "nosuch"][..],
    ] {
        u.run(args, &[]).assert_agentrun_error();
    }
    let (status, _) = api(&domain, key, "DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert!((200..300).contains(&status), "delete: {status}");
    running.signal(libc::SIGTERM);
    let _ = running.wait_or_kill(Duration::from_secs(30));
    // Run cold from the snapshot: its files as they were.
    let out = u.cold(
        &image,
        &[
            "sh",
            "-c",
            "cat /var/tmp/w/f; stat -c '%u:%g %a' /var/tmp/w/f; readlink /var/tmp/w/l; \
             ls /var/tmp/w",
        ],
    );
    assert_eq!(out.success(), "snap\n0:0 640\nf\nf\nl\nready\n", "{out}");
    // Root's store (and so its snapshots) is not the user's.
    let root_store = tempdir();
    fs::set_permissions(
        root_store.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let rs = root_store.path().to_str().unwrap();
    agentrun(["--root", rs, "image", "ls"]).run().success();
    let out = u.run(&["--root", rs, "snapshot", "ls"], &[]);
    out.assert_agentrun_error();
    assert!(out.stderr().contains("not by you"), "{out}");
    // Removed: gone from the store's images too.
    assert_eq!(
        u.run(&["snapshot", "rm", &snap], &[]).success(),
        format!("{snap}\n")
    );
    let out = u.run(&["image", "ls"], &[]);
    assert!(!out.success().contains(&snap), "{out}");
    u.run(
        &["exec", "--image", &image, "--", "true"],
        &[("AGENTRUN_NO_DAEMON", "1")],
    )
    .assert_agentrun_error();
    assert_nothing_left(u);
}

/// `agentrun serve --mcp` (Streamable HTTP) as the user: the SDK client's `http` scenario
/// (the tools, a session's state, sessions apart, the API key required) against the user's
/// daemon; nothing left when it stops.
#[test]
fn serve_mcp_over_http_as_an_ordinary_user() {
    let Some((u, _s, _l)) = user() else { return };
    let key = "rootless-mcp-key";
    let addr = format!("127.0.0.1:{}", agentrun_e2e::osb::free_port());
    let cmd = u.command(&["serve", "--mcp", &addr], &[("AGENTRUN_API_KEY", key)]);
    let mut running = Running::spawn(cmd, None);
    let url = format!("http://{addr}/mcp");
    let up = wait_until(Duration::from_secs(60), || {
        std::net::TcpStream::connect(&addr).ok().map(|_| ())
    });
    if up.is_none() {
        let out = running.wait_or_kill(Duration::from_secs(5));
        panic!("the user's daemon did not listen on {addr}\n{out}");
    }
    let out = run_with_timeout(
        mcp_client(u, "http", &[], &[("MCP_URL", &url), ("MCP_API_KEY", key)]),
        None,
        Duration::from_secs(240),
    );
    running.signal(libc::SIGTERM);
    let daemon = running.wait_or_kill(Duration::from_secs(30));
    assert!(
        out.status.success() && out.stdout().contains("OK http"),
        "{out}\n{daemon}"
    );
    assert_nothing_left(u);
}

/// `exec --credential` as the user, cold and warm: the proxy (the user's) adds the
/// credential to requests to its host and path only; the sandbox never sees the secret.
#[test]
fn exec_credential_as_an_ordinary_user() {
    let Some((u, _s, _l)) = user() else { return };
    let d = u.home.join("cred");
    fs::create_dir_all(&d).unwrap();
    agentrun_e2e::tls_server::certs(&d, "IP:127.0.0.1");
    u.chown(&d);
    let secret = format!("rootless-cred-{}", std::process::id());
    let (port, server) = agentrun_e2e::tls_server::bearer_server(&d, &secret);
    let spec = format!("k@127.0.0.1:{port}/v1=env:AGENTRUN_E2E_SECRET");
    let ca = d.join("ca.pem");
    let script = format!(
        "echo \"bound: $(curl -sS https://127.0.0.1:{port}/v1/x)\"; \
         echo \"unbound: $(curl -sS https://127.0.0.1:{port}/other)\"; \
         env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'"
    );
    let args = [
        "exec",
        "--image",
        "host",
        "--credential",
        &spec,
        "--egress-upstream-ca",
        ca.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ];
    let check = |out: &RunOutput, how: &str| {
        let stdout = out.success();
        assert!(
            stdout.contains("bound: auth=ok path=/v1/x\n"),
            "{how}: {out}"
        );
        assert!(
            stdout.contains("unbound: auth=missing path=/other\n"),
            "{how}: {out}"
        );
        assert!(
            !stdout.contains(&secret),
            "{how}: the secret reached the sandbox"
        );
    };
    let cold = u.run(
        &args,
        &[
            ("AGENTRUN_NO_DAEMON", "1"),
            ("AGENTRUN_E2E_SECRET", &secret),
        ],
    );
    check(&cold, "cold");
    {
        let _d = Daemon::start(u, "host:default=1");
        let warm = u.run(&args, &[("AGENTRUN_E2E_SECRET", &secret)]);
        check(&warm, "warm");
        let shells = Daemon::shells(u);
        assert!(
            shells.contains(&last_run_sandbox(u)),
            "the run was not the daemon's: {shells:?}"
        );
    }
    drop(server);
    fs::remove_dir_all(&d).unwrap();
    assert_nothing_left(u);
}
