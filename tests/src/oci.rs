//! Helpers for the OCI runtime tests (tests/tests/oci.rs): OCI bundles made from the busybox
//! image, a busybox OCI image tarball, and a private containerd.
//!
//! - [`busybox_rootfs`]: `images/busybox/build.sh` into a dir, built once per test binary.
//! - [`Bundle`]: a bundle dir (a copy-free bind of that rootfs is not needed: the rootfs is
//!   only read) with a `config.json` from runc's starter spec, adjusted per test.
//! - [`busybox_image_tar`]: an OCI image layout tarball of that rootfs made with `umoci`
//!   (Debian package), for `ctr image import`. No registry.
//! - [`Containerd`]: `containerd` (Debian package) on its own socket, root and state dirs
//!   under a temp dir, CRI and unused snapshotters disabled, stopped (and everything it
//!   started killed and deleted) on drop.
//! - [`SeccompAgent`]: a seccomp agent (the runtime spec's "seccomp notify"): it takes the
//!   container process state and the notify fd from the runtime over `SCM_RIGHTS` and answers
//!   every notification (seccomp_unotify(2)).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{run_with_timeout, wait_until, workspace_root, RunOutput};

/// The containerd namespace the tests use.
pub const NAMESPACE: &str = "agentrun-e2e";
/// The image name the busybox tarball is imported under.
pub const IMAGE: &str = "agentrun.test/busybox:latest";
/// The sandbox ("pause") image of the CRI tests, from the same tarball.
pub const PAUSE_IMAGE: &str = "agentrun.test/busybox:pause";

static ROOTFS: OnceLock<PathBuf> = OnceLock::new();

/// The busybox rootfs (built once per test binary, removed when it exits; see
/// [`crate::binary_dir`]).
pub fn busybox_rootfs() -> PathBuf {
    ROOTFS
        .get_or_init(|| {
            let dir = crate::binary_dir(Some("oci-rootfs")).unwrap_or_else(|e| panic!("{e}"));
            let rootfs = dir.join("rootfs");
            let mut build = Command::new(workspace_root().join("images/busybox/build.sh"));
            build.arg(&rootfs);
            let out = run_with_timeout(build, None, Duration::from_secs(120));
            assert_eq!(out.status.code(), Some(0), "building busybox\n{out}");
            rootfs
        })
        .clone()
}

/// Runs a host program with a deadline and asserts it succeeded.
pub fn must(program: &str, args: &[&str]) -> RunOutput {
    let out = crate::host(program, args);
    assert_eq!(out.status.code(), Some(0), "{program} failed\n{out}");
    out
}

/// An OCI bundle: `config.json` (runc's starter spec, non-terminal, writable root, the given
/// process args, a cgroups path under `cgroup_parent`) and `rootfs` (a busybox rootfs copy).
pub struct Bundle {
    pub dir: PathBuf,
}

impl Bundle {
    /// Creates the bundle in `dir` (which must exist).
    pub fn new(dir: &Path, args: &[&str], cgroup_parent: &str, id: &str) -> Bundle {
        fs::create_dir_all(dir).unwrap();
        let mut spec = Command::new("runc");
        spec.args(["spec", "--bundle"]).arg(dir);
        let out = run_with_timeout(spec, None, Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(0), "runc spec\n{out}");
        let b = Bundle {
            dir: dir.to_owned(),
        };
        let src = format!("{}/.", busybox_rootfs().display());
        fs::create_dir_all(dir.join("rootfs")).unwrap();
        must("cp", &["-a", &src, dir.join("rootfs").to_str().unwrap()]);
        b.edit(|c| {
            c["process"]["terminal"] = false.into();
            c["process"]["args"] = args.iter().map(|a| Value::from(*a)).collect();
            c["root"]["path"] = "rootfs".into();
            c["root"]["readonly"] = false.into();
            c["linux"]["cgroupsPath"] = format!("{cgroup_parent}/{id}").into();
        });
        b
    }

    /// Rewrites `config.json` through `f`.
    pub fn edit(&self, f: impl FnOnce(&mut Value)) {
        let path = self.dir.join("config.json");
        let mut c: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        f(&mut c);
        fs::write(&path, serde_json::to_vec_pretty(&c).unwrap()).unwrap();
    }
}

static IMAGE_TAR: OnceLock<PathBuf> = OnceLock::new();

/// An OCI image layout tarball of the busybox rootfs, built with umoci: tag `latest` runs
/// `sh`, tag `pause` sleeps forever (a CRI sandbox image). Imported with `--base-name
/// agentrun.test/busybox`, they are [`IMAGE`] and [`PAUSE_IMAGE`].
pub fn busybox_image_tar() -> PathBuf {
    IMAGE_TAR
        .get_or_init(|| {
            let dir = crate::binary_dir(Some("oci-image")).unwrap_or_else(|e| panic!("{e}"));
            let layout = dir.join("layout");
            let unpacked = dir.join("unpacked");
            let image = format!("{}:latest", layout.display());
            must("umoci", &["init", "--layout", layout.to_str().unwrap()]);
            must("umoci", &["new", "--image", &image]);
            must(
                "umoci",
                &["unpack", "--image", &image, unpacked.to_str().unwrap()],
            );
            let src = format!("{}/.", busybox_rootfs().display());
            must(
                "cp",
                &["-a", &src, unpacked.join("rootfs").to_str().unwrap()],
            );
            must(
                "umoci",
                &["repack", "--image", &image, unpacked.to_str().unwrap()],
            );
            must(
                "umoci",
                &["config", "--image", &image, "--config.cmd", "sh"],
            );
            // `:pause`, the same rootfs sleeping forever: the CRI tests' sandbox image.
            must("umoci", &["tag", "--image", &image, "pause"]);
            let pause = format!("{}:pause", layout.display());
            let cmd = ["--config.cmd", "sleep", "--config.cmd", "2147483647"];
            must(
                "umoci",
                &[&["config", "--image", pause.as_str()][..], &cmd[..]].concat(),
            );
            let tar = dir.join("busybox-oci.tar");
            must(
                "tar",
                &[
                    "-C",
                    layout.to_str().unwrap(),
                    "-cf",
                    tar.to_str().unwrap(),
                    ".",
                ],
            );
            let _ = fs::remove_dir_all(&unpacked);
            tar
        })
        .clone()
}

/// A private containerd.
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    child: Option<Child>,
}

impl Containerd {
    /// Starts containerd with everything under `dir`, CRI disabled, and waits (10 s at most)
    /// for its socket.
    pub fn start(dir: &Path) -> Containerd {
        Self::start_with(dir, None, &[])
    }

    /// Like [`Containerd::start`]; with `cri` (the CRI plugin's TOML sections), CRI enabled;
    /// `env` is added to containerd's environment (its shims and runtimes inherit it).
    pub fn start_with(dir: &Path, cri: Option<&str>, env: &[(&str, String)]) -> Containerd {
        let socket = dir.join("containerd.sock");
        let mut config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = [
  {cri_plugin}
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
"#,
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            sock = socket.display(),
            cri_plugin = if cri.is_some() {
                ""
            } else {
                "\"io.containerd.grpc.v1.cri\","
            },
        );
        if let Some(cri) = cri {
            config.push_str(cri);
        }
        fs::write(dir.join("config.toml"), config).unwrap();
        let log = File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn containerd (Debian package containerd)");
        let mut c = Containerd {
            dir: dir.to_owned(),
            socket,
            child: Some(child),
        };
        let up = wait_until(Duration::from_secs(10), || {
            (c.socket.exists() && c.ctr(["version"]).status.success()).then_some(())
        });
        if up.is_none() {
            c.stop();
            panic!("containerd did not come up\n{}", c.log());
        }
        c
    }

    /// containerd's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// `ctr -a SOCK -n agentrun-e2e ARGS...`, 60 s at most.
    pub fn ctr<I, S>(&self, args: I) -> RunOutput
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        run_with_timeout(self.ctr_command(args), None, Duration::from_secs(60))
    }

    /// The `ctr` command, to spawn.
    pub fn ctr_command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.ctr_command_in(NAMESPACE, args)
    }

    /// `ctr -a SOCK -n NS ARGS...`, to spawn.
    pub fn ctr_command_in<I, S>(&self, ns: &str, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = Command::new("ctr");
        cmd.arg("-a").arg(&self.socket).args(["-n", ns]);
        cmd.args(args);
        cmd
    }

    /// `ctr -a SOCK -n agentrun-e2e run ARGS...` (`args` without the `run`), 60 s at most;
    /// its stdout and stderr are the container's, complete ([`crate::ctr`]: ctr's own stdout
    /// can lose the tail).
    pub fn run<I, S>(&self, args: I) -> RunOutput
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let args: Vec<std::ffi::OsString> = std::iter::once("run".into())
            .chain(args.into_iter().map(|a| a.as_ref().to_owned()))
            .collect();
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        crate::ctr::run(
            self.ctr_command([] as [&str; 0]),
            &args,
            Duration::from_secs(60),
        )
    }

    /// `ctr -a SOCK -n NS ARGS...`, 60 s at most.
    pub fn ctr_in<I, S>(&self, ns: &str, args: I) -> RunOutput
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        run_with_timeout(self.ctr_command_in(ns, args), None, Duration::from_secs(60))
    }

    /// Task ids and statuses (`ctr task ls`).
    pub fn tasks(&self) -> Vec<(String, String)> {
        self.tasks_in(NAMESPACE)
    }

    /// Task ids and statuses in namespace `ns`.
    pub fn tasks_in(&self, ns: &str) -> Vec<(String, String)> {
        let out = self.ctr_in(ns, ["task", "ls"]);
        out.stdout()
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 3).then(|| (f[0].to_owned(), f[2].to_owned()))
            })
            .collect()
    }

    /// Kills and deletes every task and container, then stops containerd (SIGTERM, 10 s, then
    /// SIGKILL).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if child.try_wait().ok().flatten().is_none() {
            for ns in [NAMESPACE, "k8s.io"] {
                for (id, _) in self.tasks_in(ns) {
                    let _ = self.ctr_in(ns, ["task", "kill", "-s", "SIGKILL", &id]);
                    let _ = wait_until(Duration::from_secs(10), || {
                        self.tasks_in(ns)
                            .iter()
                            .any(|(t, s)| t == &id && s == "STOPPED")
                            .then_some(())
                    });
                    let _ = self.ctr_in(ns, ["task", "delete", "--force", &id]);
                }
                let out = self.ctr_in(ns, ["container", "ls", "-q"]);
                for id in out.stdout().split_whitespace() {
                    let _ = self.ctr_in(ns, ["container", "delete", id]);
                }
            }
            // SAFETY: kill on our own unreaped child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
        // containerd leaves its overlay snapshots mounted only while it runs; unmount anything
        // left under its root so the temp dir can go.
        for m in crate::mounts_under(&self.dir).into_iter().rev() {
            let c = std::ffi::CString::new(m.to_string_lossy().as_bytes()).unwrap();
            // SAFETY: umount2 on a path we own; failure only leaves the mount.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// A parent cgroup (`/<prefix>-<test binary pid>`) for a test's containers: its cgroups path
/// is [`CgroupParent::path`]. Dropped (test passed or panicked), it kills what is still in its
/// child cgroups and removes them and itself, in every hierarchy.
pub struct CgroupParent {
    pub name: String,
}

impl CgroupParent {
    pub fn new(prefix: &str) -> CgroupParent {
        CgroupParent {
            name: format!("{prefix}-{}", std::process::id()),
        }
    }

    /// The cgroups path to put containers under (`/<name>`).
    pub fn path(&self) -> String {
        format!("/{}", self.name)
    }

    /// Child cgroups (containers' cgroups) that still exist.
    pub fn children(&self) -> Vec<PathBuf> {
        child_cgroups(&cgroup_dirs(&self.name))
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        let children = self.children();
        for c in &children {
            let procs = fs::read_to_string(c.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2) of a process left in a cgroup this test created.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        for c in &children {
            let _ = wait_until(Duration::from_secs(5), || fs::remove_dir(c).ok());
        }
        remove_cgroup_dirs(&self.name);
    }
}

/// Cgroup directories named `name` directly under any controller's hierarchy root
/// (`/sys/fs/cgroup/<controller>/<name>` on v1, `/sys/fs/cgroup/<name>` on v2).
pub fn cgroup_dirs(name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let root = Path::new("/sys/fs/cgroup");
    if root.join(name).is_dir() {
        found.push(root.join(name));
    }
    if let Ok(rd) = fs::read_dir(root) {
        for e in rd.flatten() {
            let p = e.path().join(name);
            if p.is_dir() {
                found.push(p);
            }
        }
    }
    found
}

/// Sub-cgroups (directories) under each of `dirs`.
pub fn child_cgroups(dirs: &[PathBuf]) -> Vec<PathBuf> {
    dirs.iter()
        .flat_map(|d| fs::read_dir(d).into_iter().flatten().flatten())
        .filter(|e| e.path().is_dir())
        .map(|e| e.path())
        .collect()
}

/// Removes the (empty) cgroup directories named `name` made for a test.
pub fn remove_cgroup_dirs(name: &str) {
    for d in cgroup_dirs(name) {
        let _ = fs::remove_dir(&d);
    }
}

/// How a [`SeccompAgent`] answers notified syscalls.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    /// Fail the syscall with this errno.
    Errno(i32),
    /// Let the kernel run it (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`).
    Continue,
}

/// A seccomp agent listening on a unix socket until dropped. Every connection is a runtime
/// handing over one notify fd with the container process state (JSON); each fd gets a thread
/// answering its notifications until the processes behind it are gone.
pub struct SeccompAgent {
    pub path: PathBuf,
    states: std::sync::mpsc::Receiver<(Value, usize)>,
    answered: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SeccompAgent {
    pub fn start(path: &Path, answer: Answer) -> SeccompAgent {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = std::os::unix::net::UnixListener::bind(path)
            .unwrap_or_else(|e| panic!("binding {}: {e}", path.display()));
        listener.set_nonblocking(true).unwrap();
        let (tx, states) = std::sync::mpsc::channel();
        let answered = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, halt) = (answered.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !halt.load(Ordering::Relaxed) {
                let conn = match listener.accept() {
                    Ok((c, _)) => c,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    Err(e) => panic!("agent accept: {e}"),
                };
                conn.set_nonblocking(false).unwrap();
                let (state, fds) = receive_state(&conn);
                let n = fds.len();
                let _ = tx.send((state, n));
                for fd in fds {
                    let count = count.clone();
                    std::thread::spawn(move || answer_notifications(fd, answer, &count));
                }
            }
        });
        SeccompAgent {
            path: path.to_owned(),
            states,
            answered,
            stop,
            thread: Some(thread),
        }
    }

    /// The next container process state a runtime sent, and how many fds came with it.
    pub fn next_state(&self, timeout: Duration) -> Option<(Value, usize)> {
        self.states.recv_timeout(timeout).ok()
    }

    /// How many notifications were answered so far.
    pub fn answered(&self) -> usize {
        self.answered.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for SeccompAgent {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = fs::remove_file(&self.path);
    }
}

/// Receives one message: the JSON state and the fds passed with it.
fn receive_state(conn: &std::os::unix::net::UnixStream) -> (Value, Vec<std::os::fd::OwnedFd>) {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let mut buf = vec![0u8; 64 * 1024];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
    let msg = recvmsg::<UnixAddr>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .expect("agent recvmsg");
    let mut fds = Vec::new();
    for c in msg.cmsgs().unwrap() {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel installed these fds in this process for this message.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let len = msg.bytes;
    let state = serde_json::from_slice(&buf[..len])
        .unwrap_or_else(|e| panic!("agent got no JSON state ({e}): {:?}", &buf[..len]));
    (state, fds)
}

/// Answers the notifications of one notify fd until its processes are gone.
fn answer_notifications(
    fd: std::os::fd::OwnedFd,
    answer: Answer,
    count: &std::sync::atomic::AtomicUsize,
) {
    use std::os::fd::AsRawFd;
    let recv = nix::request_code_readwrite!(b'!', 0, std::mem::size_of::<libc::seccomp_notif>());
    let send =
        nix::request_code_readwrite!(b'!', 1, std::mem::size_of::<libc::seccomp_notif_resp>());
    loop {
        // SAFETY: seccomp_notif is plain data; the kernel wants it zeroed.
        let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: `req` is a seccomp_notif the ioctl fills in.
        if unsafe { libc::ioctl(fd.as_raw_fd(), recv as _, &mut req) } != 0 {
            return; // ENOENT: nobody left behind this filter
        }
        let (error, flags) = match answer {
            Answer::Errno(e) => (-e, 0),
            Answer::Continue => (0, libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32),
        };
        let mut resp = libc::seccomp_notif_resp {
            id: req.id,
            val: 0,
            error,
            flags,
        };
        // SAFETY: `resp` is a seccomp_notif_resp the ioctl reads.
        if unsafe { libc::ioctl(fd.as_raw_fd(), send as _, &mut resp) } == 0 {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
