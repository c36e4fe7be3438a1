//! `checkpoint` and `restore` as runc has them, with CRIU (the `criu` binary on `PATH`).
//!
//! - `checkpoint [--image-path DIR] [--work-path DIR] [--leave-running] ... ID` dumps the
//!   running (or paused: containerd pauses a task first) container's process tree into DIR (libcontainer's `Container::checkpoint`, over
//!   CRIU's RPC); without `--leave-running` the container is then deleted, as runc does.
//! - `restore [--image-path DIR] [--work-path DIR] [--bundle B] [--detach] [--pid-file F] ID`
//!   brings such a tree back as container ID from bundle B: CRIU recreates its namespaces,
//!   mounts (over the bundle's rootfs, bind-mounted at `<work>/criu-root` as runc does; the
//!   spec's bind mounts mapped to their sources), cgroups and processes, and the container's
//!   state is written as `create`+`start` would have (so `state`, `kill`, `delete` work).
//!
//! A failure names CRIU's own first error line, from its log (`dump.log` / `restore.log` in
//! the work path, or the image path without one): e.g. Debian 12's CRIU 3.17 on a kernel
//! >= 6.13 says `vdso: Unexpected rt vDSO area bounds` (hack/criu builds a CRIU that works).
//!
//! A container confined by an agentrun profile annotation is refused: its Landlock domain is
//! not something CRIU saves, so a restored process would run without it.

use std::fs::{self, File};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use libcontainer::config::YoukiConfig;
use libcontainer::container::{CheckpointOptions, Container, ContainerStatus};
use liboci_cli::Checkpoint;
use oci_spec::runtime::{LinuxNamespaceType, Spec};

use crate::annotations::Hardening;
use crate::container;
use crate::globals::Globals;
use crate::record::Record;
use crate::OciError;

/// CRIU's log of a dump, in the work path (or the image path).
const DUMP_LOG: &str = "dump.log";
/// CRIU's log of a restore.
const RESTORE_LOG: &str = "restore.log";
/// How long `restore` waits for CRIU to finish restoring the tree.
const RESTORE_DEADLINE: Duration = Duration::from_secs(60);

/// `restore`: runc's flags (those CRIU can honour here; the rest are accepted and ignored as
/// runc ignores them without their features).
#[derive(Parser, Debug)]
pub struct Restore {
    /// Path to the criu image files to restore from.
    #[arg(long, default_value = "checkpoint")]
    pub image_path: PathBuf,
    /// Path for saving work files and logs.
    #[arg(long)]
    pub work_path: Option<PathBuf>,
    /// The bundle (config.json and rootfs) of the restored container.
    #[arg(long, short = 'b', default_value = ".")]
    pub bundle: PathBuf,
    /// Detach from the container's process.
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// File to write the restored process's pid to.
    #[arg(long)]
    pub pid_file: Option<PathBuf>,
    /// Accepted for runc's command line (a restored tree has no new terminal).
    #[arg(long)]
    pub console_socket: Option<PathBuf>,
    /// Allow open tcp connections.
    #[arg(long)]
    pub tcp_established: bool,
    /// Allow external unix sockets.
    #[arg(long)]
    pub ext_unix_sk: bool,
    /// Allow shell jobs.
    #[arg(long)]
    pub shell_job: bool,
    /// Handle file locks.
    #[arg(long)]
    pub file_locks: bool,
    /// Link unlinked files back when possible.
    #[arg(long)]
    pub link_remap: bool,
    /// cgroups mode: soft (default), ignore, full or strict.
    #[arg(long, default_value = "soft", value_parser = clap::builder::PossibleValuesParser::new(["ignore", "full", "strict", "soft"]))]
    pub manage_cgroups_mode: String,
    /// Accepted for runc's command line.
    #[arg(long)]
    pub no_subreaper: bool,
    /// Accepted for runc's command line.
    #[arg(long)]
    pub no_pivot: bool,
    /// Accepted for runc's command line.
    #[arg(long)]
    pub auto_dedup: bool,
    #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new(), required = true)]
    pub container_id: String,
}

fn cg_mode(mode: &str) -> rust_criu::CgMode {
    match mode {
        "ignore" => rust_criu::CgMode::IGNORE,
        "full" => rust_criu::CgMode::FULL,
        "strict" => rust_criu::CgMode::STRICT,
        _ => rust_criu::CgMode::SOFT,
    }
}

/// The first `Error (...)` line of a CRIU log, trimmed of its timestamp.
pub fn criu_reason(log: &Path) -> Option<String> {
    let text = fs::read_to_string(log).ok()?;
    text.lines()
        // Logged by every CRIU run here (its own RLIMIT_NOFILE), failed or not: not a cause.
        .filter(|l| !l.contains("Can't setup RLIMIT_NOFILE for self"))
        .find(|l| l.contains("Error ("))
        .map(|l| {
            let l = l.trim();
            // "(00.053247) Error (criu/vdso.c:381): vdso: ..." -> "Error (criu/vdso.c:381): ..."
            match l.find("Error (") {
                Some(i) => l[i..].to_string(),
                None => l.to_string(),
            }
        })
}

fn criu_failed(action: &str, log: &Path, detail: &str) -> OciError {
    match criu_reason(log) {
        Some(reason) => OciError::Criu(format!(
            "{action}: criu: {reason} (log: {})",
            log.display()
        )),
        None if !log.exists() => OciError::Criu(format!(
            "{action}: criu: {detail} (no CRIU log at {}: is criu >= 3.15 installed? hack/criu builds one)",
            log.display()
        )),
        None => OciError::Criu(format!(
            "{action}: criu: {detail} (log: {})",
            log.display()
        )),
    }
}

/// Refuses a container whose confinement CRIU cannot carry over.
fn check_confinement(spec: &Spec) -> Result<(), OciError> {
    let hardening = Hardening::from_spec(spec)?;
    if hardening.landlock.is_some() {
        return Err(OciError::Invalid(format!(
            "cannot checkpoint a container confined by the agentrun profile {:?}: CRIU does not save Landlock domains, a restored process would run without its profile",
            hardening.profile.unwrap_or_default()
        )));
    }
    Ok(())
}

/// `checkpoint ID`.
pub fn checkpoint(globals: &Globals, args: Checkpoint) -> Result<(), OciError> {
    let mut c = container::load(&globals.root, &args.container_id)?;
    let paused = c.status() == ContainerStatus::Paused;
    if c.status() != ContainerStatus::Running && !paused {
        return Err(OciError::NotRunning);
    }
    let spec = Spec::load(c.bundle().join("config.json"))?;
    check_confinement(&spec)?;
    // containerd pauses a task before it checkpoints it (runc dumps it frozen): CRIU seizes
    // and stops the tasks itself, a frozen cgroup would keep them from answering. Thawed for
    // the dump, frozen again after it if they stay.
    if paused {
        c.resume()?;
    }
    let image_path = absolute(&args.image_path)?;
    let work_path = args.work_path.as_deref().map(absolute).transpose()?;
    let log = work_path.as_ref().unwrap_or(&image_path).join(DUMP_LOG);
    // CRIU appends: a log of an earlier attempt must not name this one's reason.
    // Absent is the usual case.
    let _ = fs::remove_file(&log);
    let record = Record::load(&container::dir(&globals.root, &args.container_id)?);
    let pid = c.pid().map(nix::unistd::Pid::as_raw);
    let opts = CheckpointOptions {
        ext_unix_sk: args.ext_unix_sk,
        file_locks: args.file_locks,
        image_path: image_path.clone(),
        leave_running: args.leave_running,
        shell_job: args.shell_job,
        tcp_established: args.tcp_established,
        work_path,
        manage_cgroups_mode: cg_mode(&args.manage_cgroups_mode),
        link_remap: args.link_remap,
    };
    let dumped = c
        .checkpoint(&opts)
        .map_err(|e| criu_failed("checkpoint", &log, &crate::error::chain(&e)));
    if paused && (args.leave_running || dumped.is_err()) {
        if let Ok(mut again) = container::load(&globals.root, &args.container_id) {
            if let Err(e) = again.pause() {
                tracing::warn!("checkpoint: pausing the container again: {e}");
            }
        }
    }
    dumped?;
    if !args.leave_running {
        // libcontainer deleted the container: its lifetime span ends here.
        if let Some(r) = record {
            r.finish_span(&args.container_id, pid);
        }
    }
    Ok(())
}

fn absolute(p: &Path) -> Result<PathBuf, OciError> {
    if p.is_absolute() {
        return Ok(p.to_owned());
    }
    let cwd = std::env::current_dir().map_err(|e| OciError::io("working directory", ".", e))?;
    Ok(cwd.join(p))
}

/// Keys of the stdio fds the dump recorded as pipes (`pipe:[N]`), which the restored tree
/// takes from ours (CRIU's `--inherit-fd`), as runc does.
fn inherited_stdio(image_path: &Path) -> Vec<(i32, String)> {
    let Ok(text) = fs::read_to_string(image_path.join("descriptors.json")) else {
        return Vec::new();
    };
    let Ok(paths) = serde_json::from_str::<Vec<String>>(&text) else {
        return Vec::new();
    };
    paths
        .into_iter()
        .enumerate()
        .filter(|(_, p)| p.starts_with("pipe:"))
        .map(|(n, p)| (n as i32, p))
        .collect()
}

/// `restore ID`: returns the exit code (0 with `--detach`; else the process's).
pub fn restore(globals: &Globals, args: Restore) -> Result<i32, OciError> {
    let id = args.container_id.clone();
    let dir = container::dir(&globals.root, &id)?;
    if dir.exists() {
        return Err(OciError::Exists(id));
    }
    let bundle =
        fs::canonicalize(&args.bundle).map_err(|e| OciError::io("bundle", &args.bundle, e))?;
    let spec = Spec::load(bundle.join("config.json"))?;
    check_confinement(&spec)?;
    let image_path = absolute(&args.image_path)?;
    if !image_path.join("inventory.img").exists() {
        return Err(OciError::Invalid(format!(
            "restore: {} holds no checkpoint (no inventory.img)",
            image_path.display()
        )));
    }
    let work_path = absolute(args.work_path.as_deref().unwrap_or(&image_path))?;
    fs::create_dir_all(&work_path).map_err(|e| OciError::io("work path", &work_path, e))?;
    let root_path = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .unwrap_or_else(|| PathBuf::from("rootfs"));
    let rootfs = fs::canonicalize(bundle.join(&root_path))
        .map_err(|e| OciError::io("rootfs", bundle.join(&root_path), e))?;
    // CRIU mounts the restored tree's root over a mount point of its own (runc's way).
    let criu_root = work_path.join("criu-root");
    fs::create_dir_all(&criu_root).map_err(|e| OciError::io("criu root", &criu_root, e))?;
    let _root_mount = BindMount::new(&rootfs, &criu_root)?;
    let log = work_path.join(RESTORE_LOG);
    // Absent is the usual case.
    let _ = fs::remove_file(&log);
    let pid_path = work_path.join("restore.pid");
    // Absent is the usual case.
    let _ = fs::remove_file(&pid_path);

    let mut cmd = Command::new("criu");
    cmd.arg("restore")
        .arg("--images-dir")
        .arg(&image_path)
        .arg("--work-dir")
        .arg(&work_path)
        .args(["--log-file", RESTORE_LOG, "-v4"])
        .arg("--root")
        .arg(&criu_root)
        .arg("--restore-detached")
        .arg("--pidfile")
        .arg(&pid_path)
        .arg(format!("--manage-cgroups={}", args.manage_cgroups_mode))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (flag, on) in [
        ("--tcp-established", args.tcp_established),
        ("--ext-unix-sk", args.ext_unix_sk),
        ("--shell-job", args.shell_job),
        ("--file-locks", args.file_locks),
        ("--link-remap", args.link_remap),
    ] {
        if on {
            cmd.arg(flag);
        }
    }
    // The spec's bind mounts were dumped as external (key: their destination).
    for m in spec.mounts().iter().flatten() {
        let bind = m.typ().as_deref() == Some("bind")
            || m.options()
                .iter()
                .flatten()
                .any(|o| o == "bind" || o == "rbind");
        if bind {
            if let Some(src) = m.source() {
                cmd.arg("--ext-mount-map").arg(format!(
                    "{}:{}",
                    m.destination().display(),
                    src.display()
                ));
            }
        }
    }
    // Cgroup v1 mount points were dumped as external too (key: the host's mount point).
    for mp in v1_cgroup_mounts() {
        cmd.arg("--ext-mount-map").arg(format!("{mp}:{mp}"));
    }
    // Namespaces the spec joins by path were external at the dump: give CRIU ours.
    let mut keep: Vec<OwnedFd> = Vec::new();
    for (typ, name) in [
        (LinuxNamespaceType::Network, "net"),
        (LinuxNamespaceType::Pid, "pid"),
    ] {
        if let Some(path) = ns_path(&spec, typ) {
            let f = File::open(&path).map_err(|e| OciError::io("namespace", &path, e))?;
            let fd: OwnedFd = f.into();
            cmd.arg("--inherit-fd").arg(format!(
                "fd[{}]:{}",
                fd.as_raw_fd(),
                rust_criu::criu_ns_to_key(name)
            ));
            keep.push(fd);
        }
    }
    for (n, key) in inherited_stdio(&image_path) {
        cmd.arg("--inherit-fd").arg(format!("fd[{n}]:{key}"));
    }
    // Our stdio become the tree's where it had pipes; the namespace fds must survive exec.
    if inherited_stdio(&image_path).iter().any(|(n, _)| *n == 0) {
        cmd.stdin(Stdio::inherit());
    }
    if inherited_stdio(&image_path).iter().any(|(n, _)| *n == 1) {
        cmd.stdout(Stdio::inherit());
    }
    if inherited_stdio(&image_path).iter().any(|(n, _)| *n == 2) {
        cmd.stderr(Stdio::inherit());
    }
    let raw: Vec<i32> = keep.iter().map(AsRawFd::as_raw_fd).collect();
    // SAFETY: the closure only calls fcntl (async-signal-safe) on fds this process owns.
    unsafe {
        cmd.pre_exec(move || {
            for &fd in &raw {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let status =
        match cmd.status() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(OciError::Criu(
                "restore: criu is not installed (hack/criu builds one that works on this kernel)"
                    .into(),
            )),
            Err(e) => return Err(OciError::io("running", "criu", e)),
        };
    drop(keep);
    if !status.success() {
        return Err(criu_failed(
            "restore",
            &log,
            &format!("criu restore: {status}"),
        ));
    }
    let pid: i32 = wait_pid_file(&pid_path)?;
    // The state `create` + `start` would have left.
    fs::create_dir_all(&dir).map_err(|e| OciError::io("container dir", &dir, e))?;
    let saved = (|| -> Result<(), OciError> {
        let mut c = Container::new(&id, ContainerStatus::Running, Some(pid), &bundle, &dir)?;
        c.set_systemd(false);
        c.set_annotations(spec.annotations().clone());
        c.set_creator(nix::unistd::geteuid().as_raw());
        c.save()?;
        YoukiConfig::from_spec(&spec, &id)
            .map_err(|e| OciError::Invalid(format!("restore: {e}")))?
            .save(&dir)
            .map_err(|e| OciError::Invalid(format!("restore: {e}")))?;
        Record::new(&spec, &bundle, None).save(&dir)
    })();
    if let Err(e) = saved {
        // It may be gone already; the save error is what the caller hears.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        // Half a state dir is not a container (delete removes it as well).
        let _ = fs::remove_dir_all(&dir);
        return Err(e);
    }
    if let Some(p) = &args.pid_file {
        fs::write(p, pid.to_string()).map_err(|e| OciError::io("pid file", p, e))?;
    }
    if args.detach {
        return Ok(0);
    }
    // Not detached: wait for the restored process (not our child: poll its pidfd), then
    // delete the container, as `run` does.
    let code = wait_foreign(pid);
    if let Err(e) = crate::lifecycle::delete(globals, &id, true) {
        tracing::warn!("restore: deleting the container {id} after its exit: {e}");
    }
    Ok(code)
}

fn ns_path(spec: &Spec, typ: LinuxNamespaceType) -> Option<PathBuf> {
    spec.linux()
        .as_ref()?
        .namespaces()
        .as_ref()?
        .iter()
        .find(|n| n.typ() == typ)
        .and_then(|n| n.path().clone())
}

/// The host's cgroup v1 hierarchies' mount points under /sys/fs/cgroup.
fn v1_cgroup_mounts() -> Vec<String> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split_whitespace().next()?;
            let mp = pre.split_whitespace().nth(4)?;
            (fstype == "cgroup" && mp.starts_with("/sys/fs/cgroup/")).then(|| mp.to_string())
        })
        .collect()
}

fn wait_pid_file(path: &Path) -> Result<i32, OciError> {
    let start = Instant::now();
    loop {
        if let Ok(text) = fs::read_to_string(path) {
            if let Ok(pid) = text.trim().parse() {
                return Ok(pid);
            }
        }
        if start.elapsed() > RESTORE_DEADLINE {
            return Err(OciError::Criu(format!(
                "restore: criu wrote no pid file ({})",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a process that is not our child to end; its exit code is unknown to us (0).
fn wait_foreign(pid: i32) -> i32 {
    // SAFETY: pidfd_open makes a new fd for `pid`; poll only reads it.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return 0;
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd; close of the fd we opened.
    unsafe {
        while libc::poll(&mut p, 1, -1) < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
        libc::close(fd);
    }
    0
}

/// A bind mount removed (lazily) when dropped.
struct BindMount(PathBuf);

impl BindMount {
    fn new(src: &Path, dst: &Path) -> Result<BindMount, OciError> {
        use nix::mount::{mount, MsFlags};
        mount(
            Some(src),
            dst,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| OciError::io("bind-mounting the rootfs at", dst, e.into()))?;
        Ok(BindMount(dst.to_owned()))
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        if let Err(e) = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!("unmounting the restore's root bind mount: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_crius_first_error_line_but_its_rlimit_notice() {
        let dir = std::env::temp_dir().join(format!("agentrun-criu-log-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join("dump.log");
        fs::write(
            &log,
            "(00.000001) Version: 3.17.1\n\
             (00.028498) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n\
             (00.053247) Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds\n\
             (00.053249) Error (criu/vdso.c:613): vdso: Failed to fill self vdso symtable\n",
        )
        .unwrap();
        assert_eq!(
            criu_reason(&log).as_deref(),
            Some("Error (criu/vdso.c:381): vdso: Unexpected rt vDSO area bounds")
        );
        fs::write(&log, "(00.1) Dumping finished successfully\n").unwrap();
        assert_eq!(criu_reason(&log), None);
        let e = criu_failed("checkpoint", &dir.join("none.log"), "spawn failed");
        assert!(e.to_string().contains("criu >= 3.15"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn restore_takes_runcs_flags() {
        let r = Restore::try_parse_from([
            "restore",
            "--image-path",
            "/i",
            "--work-path",
            "/w",
            "--bundle",
            "/b",
            "--detach",
            "--pid-file",
            "/p",
            "--no-subreaper",
            "--manage-cgroups-mode",
            "ignore",
            "id1",
        ])
        .unwrap();
        assert!(r.detach);
        assert_eq!(r.container_id, "id1");
        assert_eq!(r.manage_cgroups_mode, "ignore");
        assert!(Restore::try_parse_from(["restore", "--manage-cgroups-mode", "x", "id"]).is_err());
        assert!(Restore::try_parse_from(["restore"]).is_err());
    }
}
