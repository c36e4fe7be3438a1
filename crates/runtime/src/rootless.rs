//! A rootless shell: what libcontainer does for a root caller, done by an ordinary user in a
//! user namespace of its own, as bubblewrap does. libcontainer cannot be used here: on a
//! cgroup v1 or hybrid host its cgroup manager writes `tasks` files only root may write.
//!
//! This module owns the shell's creation in rootless mode: one `clone` with new user, mount,
//! pid, ipc, uts, net and cgroup namespaces (the child is the sandbox's PID 1); the caller
//! writes its id mapping (the caller is root inside, see [`crate::host::privilege::mapping`]; through
//! `newuidmap`/`newgidmap` when the user has subordinate ids); the child, root in its
//! namespace, mounts the size-capped tmpfs and the overlay rootfs (`userxattr`: the kernel
//! allows an overlay in a user namespace since 5.11), /proc, /dev (the host's null, zero,
//! full, random, urandom and tty bound in: no mknod), /sys, the spec's binds, masked and
//! read-only paths, pivots into the rootfs, sets the spec's rlimits, no_new_privs and
//! capabilities, and hands over to the same [`SandboxExecutor`] a root shell runs, which
//! makes a cell per run. Every mount is in the sandbox's own mount namespace: nothing is
//! left on the host when its PID 1 dies (it dies with its creator: `PR_SET_PDEATHSIG`).

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use caps::{CapSet, Capability};
use libcontainer::workload::Executor;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;
use oci_spec::runtime::Spec;

use crate::error::RuntimeError;
use crate::host::privilege::{mapping, UserIds, NEWGIDMAP, NEWUIDMAP};
use crate::inside::executor::SandboxExecutor;
use crate::mounts::{mount_fs, NOSUID_NODEV};
use crate::spec::BindMount;

/// Host devices a rootless sandbox's /dev gets (bound: an unprivileged user cannot mknod).
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// What a rootless shell is made from.
pub struct RootlessShell<'a> {
    /// The sandbox's state dir (the caller's): `rw/` and `bundle/rootfs` are mounted on in
    /// the sandbox's mount namespace only.
    pub state: &'a Path,
    /// The image's layers, topmost first.
    pub layers: &'a [PathBuf],
    pub tmpfs_bytes: u64,
    pub binds: &'a [BindMount],
    pub spec: &'a Spec,
    pub executor: &'a SandboxExecutor,
    /// The init's capabilities (in its user namespace); all others are dropped.
    pub caps: &'a [Capability],
    pub ids: &'a UserIds,
    /// The init's stdin, stdout and stderr.
    pub stdio: [&'a OwnedFd; 3],
}

/// Creates the shell; returns its PID 1 (a child of this process) and its user namespace
/// (opened before the init makes itself non-dumpable, which closes /proc/PID/ns to us). The
/// caller must be single-threaded, and have put the control channel at
/// [`crate::control::INIT_CONTROL_FD`].
pub fn spawn(s: &RootlessShell) -> Result<(Pid, OwnedFd), RuntimeError> {
    let (sync_r, sync_w) = pipe()?;
    let (ready_r, ready_w) = pipe()?;
    let lowerdir = s
        .layers
        .iter()
        .map(|l| {
            let p = l.display().to_string();
            if p.contains([':', ',']) {
                Err(RuntimeError::InvalidInput(format!(
                    "image layer path {p} has a ':' or ',' (an overlay option cannot hold it): \
                     use an image store path without them"
                )))
            } else {
                Ok(p)
            }
        })
        .collect::<Result<Vec<_>, _>>()?
        .join(":");
    if lowerdir.is_empty() {
        return Err(RuntimeError::InvalidInput("the image has no layers".into()));
    }
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWCGROUP;
    // SAFETY: clone without CLONE_VM and without a stack is fork(2) with new namespaces; the
    // caller is single-threaded (the contract above), so the child may allocate.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        return Err(RuntimeError::Unsupported(format!(
            "cannot create a user namespace as uid {} ({e}){}",
            s.ids.uid,
            match crate::host::privilege::UsernsFacts::probe().blocker() {
                Some(b) => format!(": {b}"),
                None => String::new(),
            }
        )));
    }
    if pid == 0 {
        drop((sync_w, ready_r));
        let mut ready = fs::File::from(ready_w);
        let msg = match child(s, &lowerdir, sync_r, &ready) {
            Ok(never) => match never {},
            Err(e) => e.to_string(),
        };
        // Dropped: the parent reads an empty report as "exited during setup", still an error.
        let _ = ready.write_all(msg.as_bytes());
        // SAFETY: _exit ends this child without running the parent's atexit/destructors.
        unsafe { libc::_exit(crate::exit::EXIT_SETUP_FAILED) };
    }
    let pid = Pid::from_raw(pid as i32);
    drop((sync_r, ready_w));
    let fail = |e: RuntimeError| {
        // Dropped: tearing down the child after a failure: ESRCH/ECHILD only; the error passed
        // in is returned.
        let _ = kill(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
        e
    };
    write_mappings(pid, s.ids).map_err(fail)?;
    let ns_path = format!("/proc/{pid}/ns/user");
    let userns: OwnedFd = fs::File::open(&ns_path)
        .map_err(|e| fail(RuntimeError::io("open", &ns_path, e)))?
        .into();
    fs::File::from(sync_w)
        .write_all(b"m")
        .map_err(|e| fail(RuntimeError::io("write", "the sandbox's sync pipe", e)))?;
    let mut buf = Vec::new();
    // Dropped: a failed read leaves `buf` empty, reported below as the init having exited.
    let _ = fs::File::from(ready_r).take(4096).read_to_end(&mut buf);
    match buf.as_slice() {
        b"ok" => Ok((pid, userns)),
        [] => Err(fail(RuntimeError::Container(
            "the rootless sandbox's init exited during setup".into(),
        ))),
        m => {
            let m = String::from_utf8_lossy(m.strip_prefix(b"ok").unwrap_or(m)).into_owned();
            Err(fail(RuntimeError::Container(format!(
                "rootless sandbox setup: {m}"
            ))))
        }
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), RuntimeError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::sys("pipe", e))
}

/// Whether `prog` is an executable on the usual paths.
fn installed(prog: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(prog))
        .find(|p| {
            fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Writes the child's uid and gid maps: the caller is root inside; with subordinate ranges
/// (and `newuidmap`/`newgidmap` installed) they follow it from id 1.
fn write_mappings(pid: Pid, ids: &UserIds) -> Result<(), RuntimeError> {
    let helpers = installed(NEWUIDMAP).zip(installed(NEWGIDMAP));
    if let (Some((uidmap, gidmap)), Some(su), Some(sg)) = (helpers, ids.subuid, ids.subgid) {
        for (prog, own, sub) in [(uidmap, ids.uid, su), (gidmap, ids.gid, sg)] {
            let mut cmd = std::process::Command::new(&prog);
            cmd.arg(pid.to_string());
            for (inside, outside, count) in mapping(own, Some(sub)) {
                cmd.args([inside.to_string(), outside.to_string(), count.to_string()]);
            }
            let out = cmd
                .stdin(std::process::Stdio::null())
                .output()
                .map_err(|e| RuntimeError::io("run", &prog, e))?;
            if !out.status.success() {
                return Err(RuntimeError::Container(format!(
                    "{} failed: {}",
                    prog.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        return Ok(());
    }
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let line = |own| {
        mapping(own, None)
            .iter()
            .map(|(i, o, c)| format!("{i} {o} {c}\n"))
            .collect::<String>()
    };
    for (file, text) in [
        ("uid_map", line(ids.uid)),
        ("setgroups", "deny".to_string()),
        ("gid_map", line(ids.gid)),
    ] {
        let p = proc.join(file);
        fs::write(&p, text).map_err(|e| RuntimeError::io("write", &p, e))?;
    }
    Ok(())
}

enum Never {}

/// A step of making the rootless shell that failed, in its PID 1 (which reports the text to
/// the caller over its ready pipe and exits 125).
#[derive(Debug, thiserror::Error)]
enum ChildError {
    #[error("the caller did not write the id mapping")]
    NoMapping,
    #[error("the shell's init returned")]
    InitReturned,
    #[error("{0}: {1}")]
    Sys(String, nix::Error),
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}: {1}")]
    Caps(String, caps::errors::CapsError),
}

/// The sandbox's PID 1 until it becomes the shell's init; returns only an error message.
fn child(
    s: &RootlessShell,
    lowerdir: &str,
    sync: OwnedFd,
    ready: &fs::File,
) -> Result<Never, ChildError> {
    fn e(what: &'static str) -> impl Fn(nix::Error) -> ChildError {
        move |err| ChildError::Sys(what.to_string(), err)
    }
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets a flag of this process.
    unsafe {
        libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    let mut b = [0u8; 1];
    match nix::unistd::read(sync.as_raw_fd(), &mut b) {
        Ok(1) => {}
        _ => return Err(ChildError::NoMapping),
    }
    drop(sync);
    let root = nix::unistd::Gid::from_raw(0);
    nix::unistd::setresgid(root, root, root).map_err(e("setresgid"))?;
    let uroot = nix::unistd::Uid::from_raw(0);
    nix::unistd::setresuid(uroot, uroot, uroot).map_err(e("setresuid"))?;
    // Dropped: EPERM when setgroups is denied ("deny" in setgroups): no groups to drop then.
    let _ = nix::unistd::setgroups(&[]);
    let hostname = s
        .spec
        .hostname()
        .clone()
        .unwrap_or_else(|| "sandbox".into());
    nix::unistd::sethostname(&hostname).map_err(e("sethostname"))?;
    crate::mounts::remount("/", MsFlags::MS_REC | MsFlags::MS_PRIVATE)
        .map_err(e("making / private"))?;

    // The writable layer and the overlay root.
    let rw = s.state.join("rw");
    let rootfs = s.state.join("bundle").join("rootfs");
    for d in [&rw, &rootfs] {
        fs::create_dir_all(d)
            .map_err(|err| ChildError::Io(format!("creating {}", d.display()), err))?;
    }
    mount_fs(
        "tmpfs",
        &rw,
        NOSUID_NODEV,
        &format!("size={},mode=0700", s.tmpfs_bytes),
    )
    .map_err(e("mounting the writable layer's tmpfs"))?;
    let upper = rw.join("upper");
    let work = rw.join("work");
    for d in [&upper, &work] {
        fs::create_dir(d)
            .map_err(|err| ChildError::Io(format!("creating {}", d.display()), err))?;
    }
    // Dropped: create_dir made it 0755 under the usual umask already; this only overrides a
    // stricter umask.
    let _ = fs::set_permissions(&upper, fs::Permissions::from_mode(0o755));
    let opts = format!(
        "lowerdir={lowerdir},upperdir={},workdir={},userxattr",
        upper.display(),
        work.display()
    );
    mount_fs("overlay", &rootfs, NOSUID_NODEV, &opts).map_err(e("mounting the overlay rootfs"))?;

    let at = |p: &str| rootfs.join(p.trim_start_matches('/'));
    let dir = |p: &Path| {
        fs::create_dir_all(p).map_err(|err| ChildError::Io(p.display().to_string(), err))
    };
    let nosuid_nodev_noexec = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    dir(&at("proc"))?;
    mount_fs("proc", &at("proc"), nosuid_nodev_noexec, "").map_err(e("mounting /proc"))?;
    dir(&at("dev"))?;
    mount_fs(
        "tmpfs",
        &at("dev"),
        MsFlags::MS_NOSUID | MsFlags::MS_STRICTATIME,
        "mode=755,size=65536k",
    )
    .map_err(e("mounting /dev"))?;
    for d in DEVICES {
        let dst = at("dev").join(d);
        fs::File::create(&dst).map_err(|err| ChildError::Io(dst.display().to_string(), err))?;
        mount(
            Some(Path::new("/dev").join(d).as_path()),
            &dst,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|err| ChildError::Sys(format!("binding /dev/{d}"), err))?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        // Dropped: a link the image already has (EEXIST) is kept.
        let _ = std::os::unix::fs::symlink(to, at("dev").join(link));
    }
    for (name, fstype, flags, data) in [
        (
            "pts",
            "devpts",
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            "newinstance,ptmxmode=0666,mode=0620",
        ),
        ("shm", "tmpfs", nosuid_nodev_noexec, "mode=1777,size=65536k"),
        ("mqueue", "mqueue", nosuid_nodev_noexec, ""),
    ] {
        let dst = at("dev").join(name);
        dir(&dst)?;
        mount(Some(fstype), &dst, Some(fstype), flags, Some(data))
            .map_err(|err| ChildError::Sys(format!("mounting /dev/{name}"), err))?;
    }
    dir(&at("sys"))?;
    if mount(
        Some("sysfs"),
        &at("sys"),
        Some("sysfs"),
        nosuid_nodev_noexec | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .is_err()
    {
        bind(Path::new("/sys"), &at("sys"), false, true)?;
    }
    for b in s.binds {
        let dst = at(&b.target.to_string_lossy());
        if b.source.is_dir() {
            dir(&dst)?;
        } else {
            if let Some(p) = dst.parent() {
                dir(p)?;
            }
            // Dropped: a mount point that cannot be made fails the bind below with its own error.
            let _ = fs::OpenOptions::new().create(true).append(true).open(&dst);
        }
        bind(&b.source, &dst, b.writable, true)?;
    }
    let linux = s.spec.linux().as_ref();
    for p in linux
        .and_then(|l| l.masked_paths().as_ref())
        .into_iter()
        .flatten()
    {
        let dst = at(p);
        match fs::symlink_metadata(&dst) {
            Ok(m) if m.is_dir() => mount_fs("tmpfs", &dst, MsFlags::MS_RDONLY, "")
                .map_err(|err| ChildError::Sys(format!("masking {p}"), err))?,
            Ok(_) => mount(
                Some(at("dev/null").as_path()),
                &dst,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|err| ChildError::Sys(format!("masking {p}"), err))?,
            Err(_) => {}
        }
    }
    for p in linux
        .and_then(|l| l.readonly_paths().as_ref())
        .into_iter()
        .flatten()
    {
        let dst = at(p);
        if dst.exists() {
            bind(&dst, &dst, false, true)?;
        }
    }

    // Into the rootfs; the host's tree is gone from this mount namespace.
    nix::unistd::chdir(&rootfs).map_err(e("chdir to the rootfs"))?;
    nix::unistd::pivot_root(".", ".").map_err(e("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(e("detaching the old root"))?;
    nix::unistd::chdir("/").map_err(e("chdir /"))?;

    let process = s.spec.process().as_ref();
    for r in process
        .and_then(|p| p.rlimits().as_ref())
        .into_iter()
        .flatten()
    {
        let res = match r.typ() {
            oci_spec::runtime::PosixRlimitType::RlimitNofile => libc::RLIMIT_NOFILE,
            oci_spec::runtime::PosixRlimitType::RlimitNproc => libc::RLIMIT_NPROC,
            oci_spec::runtime::PosixRlimitType::RlimitCore => libc::RLIMIT_CORE,
            _ => continue,
        };
        let lim = libc::rlimit {
            rlim_cur: r.soft(),
            rlim_max: r.hard(),
        };
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(res, &lim) } != 0 {
            return Err(ChildError::Io(
                format!("setrlimit {:?}", r.typ()),
                std::io::Error::last_os_error(),
            ));
        }
    }
    for (i, fd) in s.stdio.iter().enumerate() {
        nix::unistd::dup2(fd.as_raw_fd(), i as i32).map_err(e("dup2"))?;
    }
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) only sets a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(ChildError::Io(
            "no_new_privs".into(),
            std::io::Error::last_os_error(),
        ));
    }
    let keep: caps::CapsHashSet = s.caps.iter().copied().collect();
    for c in caps::all() {
        if !keep.contains(&c) {
            caps::drop(None, CapSet::Bounding, c)
                .map_err(|err| ChildError::Caps(format!("dropping {c}"), err))?;
        }
    }
    caps::set(None, CapSet::Inheritable, &caps::CapsHashSet::new())
        .map_err(|err| ChildError::Caps("capabilities".into(), err))?;
    caps::clear(None, CapSet::Ambient)
        .map_err(|err| ChildError::Caps("capabilities".into(), err))?;
    caps::set(None, CapSet::Effective, &keep)
        .map_err(|err| ChildError::Caps("capabilities".into(), err))?;
    caps::set(None, CapSet::Permitted, &keep)
        .map_err(|err| ChildError::Caps("capabilities".into(), err))?;

    let mut r = ready;
    r.write_all(b"ok")
        .map_err(|err| ChildError::Io("reporting ready".into(), err))?;
    // Returns only on error (it exits then, having said why on its stderr).
    // Returns only on error, which exec has said on stderr; the caller reports ours.
    let _ = s.executor.exec(s.spec);
    Err(ChildError::InitReturned)
}

/// Bind-mounts `src` on `dst` (read-only unless `writable`), keeping the flags the kernel
/// locks on a mount that came from a more privileged namespace.
fn bind(src: &Path, dst: &Path, writable: bool, recursive: bool) -> Result<(), ChildError> {
    let mut flags = MsFlags::MS_BIND;
    if recursive {
        flags |= MsFlags::MS_REC;
    }
    mount(Some(src), dst, None::<&str>, flags, None::<&str>).map_err(|err| {
        ChildError::Sys(
            format!("binding {} on {}", src.display(), dst.display()),
            err,
        )
    })?;
    if writable {
        return Ok(());
    }
    let locked = nix::sys::statvfs::statvfs(dst)
        .map(|v| {
            use nix::sys::statvfs::FsFlags;
            // The kernel's ST_RELATIME (statfs f_flags), which nix names on glibc only.
            const ST_RELATIME: libc::c_ulong = 0x1000;
            let f = v.flags();
            let mut m = MsFlags::MS_NOSUID;
            for (fs_flag, ms) in [
                (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
                (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
                (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
                (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
                (FsFlags::from_bits_retain(ST_RELATIME), MsFlags::MS_RELATIME),
            ] {
                if f.contains(fs_flag) {
                    m |= ms;
                }
            }
            m
        })
        .unwrap_or(MsFlags::MS_NOSUID);
    let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | locked;
    crate::mounts::remount(dst, flags)
        .map_err(|err| ChildError::Sys(format!("making {} read-only", dst.display()), err))
}
