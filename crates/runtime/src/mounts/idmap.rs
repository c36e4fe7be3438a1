//! ID mapping: user namespaces made only to carry a mapping, and idmapped mounts.
//!
//! The sandbox's root is an unprivileged host uid (`UID_BASE`). Files it reads from the image
//! and host directories must still look root-owned inside, and files it writes into the
//! workspace must land on the host owned by the workspace's owner. Both come from idmapped
//! mounts (`mount_setattr(MOUNT_ATTR_IDMAP)`), which take a user namespace fd describing the
//! mapping. nix does not wrap `open_tree`/`mount_setattr`/`move_mount`, so they are called
//! through `libc::syscall` here.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, pipe2, ForkResult};

use crate::error::RuntimeError;

/// First host uid/gid of the sandbox range: sandbox uid N is host uid `UID_BASE + N`.
pub const UID_BASE: u32 = 100_000_000;
/// Number of uids/gids mapped into a sandbox.
pub const UID_COUNT: u32 = 65_536;

/// A user namespace kept alive by an fd, used only as the mapping of idmapped mounts.
pub struct MappingNamespace {
    fd: OwnedFd,
}

impl MappingNamespace {
    /// The sandbox mapping: sandbox ids 0..UID_COUNT are host ids UID_BASE.., so image files
    /// owned by host root appear owned by the sandbox's root.
    pub fn sandbox_range() -> Result<Self, RuntimeError> {
        let map = format!("0 {UID_BASE} {UID_COUNT}\n");
        Self::new(&map, &map)
    }

    /// Maps one host owner to the sandbox's root: files the sandbox's root creates are stored
    /// owned by `uid:gid` on the host.
    pub fn owner(uid: u32, gid: u32) -> Result<Self, RuntimeError> {
        Self::new(
            &format!("{uid} {UID_BASE} 1\n"),
            &format!("{gid} {UID_BASE} 1\n"),
        )
    }

    fn new(uid_map: &str, gid_map: &str) -> Result<Self, RuntimeError> {
        let sys = |what: &'static str| move |e: nix::Error| RuntimeError::sys(what, e);
        let (ready_r, ready_w) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys("pipe"))?;
        let (done_r, done_w) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(sys("pipe"))?;
        // SAFETY: the caller is single-threaded while sandboxes are created (the runtime's
        // documented contract), and the child only makes raw syscalls before `_exit`.
        match unsafe { fork() }.map_err(sys("fork"))? {
            ForkResult::Child => {
                drop(ready_r);
                drop(done_w);
                let ok = unshare(CloneFlags::CLONE_NEWUSER).is_ok();
                // Dropped: if the parent is gone nothing reads it; a short write reads as "0" there.
                let _ = nix::unistd::write(&ready_w, if ok { b"1" } else { b"0" });
                let mut buf = [0u8; 1];
                // Blocks until the parent has opened our namespace and closed its end.
                let _ = nix::unistd::read(done_r.as_raw_fd(), &mut buf);
                // SAFETY: _exit is async-signal-safe and skips the parent's atexit handlers.
                unsafe { libc::_exit(0) }
            }
            ForkResult::Parent { child } => {
                drop(ready_w);
                drop(done_r);
                let result = (|| {
                    let mut ready = File::from(ready_r);
                    let mut buf = [0u8; 1];
                    ready
                        .read_exact(&mut buf)
                        .map_err(|e| RuntimeError::io("user namespace helper", "pipe", e))?;
                    if buf[0] != b'1' {
                        return Err(RuntimeError::Unsupported(
                            "cannot create user namespaces on this host".into(),
                        ));
                    }
                    let proc = format!("/proc/{child}");
                    for (file, map) in [("uid_map", uid_map), ("gid_map", gid_map)] {
                        let path = format!("{proc}/{file}");
                        File::options()
                            .write(true)
                            .open(&path)
                            .and_then(|mut f| f.write_all(map.as_bytes()))
                            .map_err(|e| RuntimeError::io("write", path.clone(), e))?;
                    }
                    let ns = format!("{proc}/ns/user");
                    let f = File::open(&ns).map_err(|e| RuntimeError::io("open", ns, e))?;
                    Ok(MappingNamespace { fd: f.into() })
                })();
                drop(done_w);
                // Dropped: reaps our own child (ECHILD only if already reaped); nothing is left behind.
                let _ = waitpid(child, None);
                result
            }
        }
    }
}

/// `struct mount_attr` from <linux/mount.h>.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

fn cpath(p: &Path) -> Result<CString, RuntimeError> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| RuntimeError::InvalidInput(format!("path contains NUL: {}", p.display())))
}

/// Attaches at `target` a clone of the mount tree at `source`, idmapped through `ns` when
/// given (a plain bind otherwise), read-only when asked, always nosuid+nodev.
pub fn attach_clone(
    source: &Path,
    target: &Path,
    ns: Option<&MappingNamespace>,
    readonly: bool,
) -> Result<(), RuntimeError> {
    attach_tree(&detached_clone(source, ns, readonly)?, target)
}

/// Attaches a detached mount (from [`detached_clone`]) at the host path `target`.
pub fn attach_tree(tree: &OwnedFd, target: &Path) -> Result<(), RuntimeError> {
    let dst = cpath(target)?;
    move_mount(tree.as_fd(), libc::AT_FDCWD, &dst, MOVE_MOUNT_F_EMPTY_PATH)
        .map_err(|e| RuntimeError::io("move_mount to", target, e))
}

/// move_mount(2) of the detached tree `tree` to `to_path` relative to `to_dir` (with
/// `MOVE_MOUNT_T_EMPTY_PATH` in `flags`: onto what `to_dir` is open on).
fn move_mount(
    tree: BorrowedFd<'_>,
    to_dir: RawFd,
    to_path: &CStr,
    flags: libc::c_uint,
) -> std::io::Result<()> {
    let empty = c"";
    // SAFETY: move_mount with a detached tree's fd we hold, a directory fd (or AT_FDCWD) the
    // caller holds, and two NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            to_dir,
            to_path.as_ptr(),
            flags,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A detached clone of the mount tree at `source` (`open_tree(OPEN_TREE_CLONE)`), idmapped
/// through `ns` when given, read-only when asked, always nosuid+nodev: an fd that can be
/// passed to another process and attached there with [`move_detached`] (a cell attaches the
/// run's mounts this way: made by the host, never a path the sandbox resolves). Unattached,
/// it goes away with its last fd.
pub fn detached_clone(
    source: &Path,
    ns: Option<&MappingNamespace>,
    readonly: bool,
) -> Result<OwnedFd, RuntimeError> {
    let src = cpath(source)?;
    let empty = c"";
    // SAFETY: open_tree with a valid NUL-terminated path; the returned fd is owned below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(RuntimeError::io(
            "open_tree",
            source,
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: fd was just returned by open_tree and is not owned elsewhere.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut attr = MountAttr {
        attr_set: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: 0,
    };
    if readonly {
        attr.attr_set |= MOUNT_ATTR_RDONLY;
    }
    if let Some(ns) = ns {
        attr.attr_set |= MOUNT_ATTR_IDMAP;
        attr.userns_fd = ns.fd.as_raw_fd() as u64;
    }
    // SAFETY: mount_setattr on our detached tree fd with a properly sized mount_attr.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(RuntimeError::io(
            if ns.is_some() {
                "idmapped mount of"
            } else {
                "mount_setattr"
            },
            source,
            std::io::Error::last_os_error(),
        ));
    }
    Ok(tree)
}

/// [`detached_clone`] idmapped through `ns`, or a plain one when `source`'s file system cannot
/// be idmapped; the flag says whether it is idmapped.
pub fn detached_clone_idmapped(
    source: &Path,
    ns: &MappingNamespace,
    readonly: bool,
) -> Result<(OwnedFd, bool), RuntimeError> {
    match detached_clone(source, Some(ns), readonly) {
        Ok(fd) => Ok((fd, true)),
        Err(RuntimeError::Io { source: e, .. })
            if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::EPERM)) =>
        {
            Ok((detached_clone(source, None, readonly)?, false))
        }
        Err(e) => Err(e),
    }
}

/// Attaches a detached mount (from [`detached_clone`]) on the directory or file `target` is
/// open on (an `O_PATH` fd).
pub fn move_detached(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> std::io::Result<()> {
    move_mount(
        tree,
        target.as_raw_fd(),
        c"",
        MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
    )
}

impl crate::host::info::HostInfo {
    /// The full probe for `agentrun info`: [`HostInfo::probe`](crate::host::info::HostInfo::probe)
    /// and an idmapped mount of `dir` tried. Here, beside the probe it adds, so the cheap
    /// probe every run makes does not depend on the mount code.
    pub fn probe_full(dir: &Path) -> Self {
        let mut info = Self::probe();
        info.idmapped_mounts = Some(idmap_supported(dir));
        info
    }
}

/// Whether this host can make idmapped mounts of `dir`'s filesystem.
pub fn idmap_supported(dir: &Path) -> bool {
    let Ok(ns) = MappingNamespace::sandbox_range() else {
        return false;
    };
    let probe = std::env::temp_dir().join(format!("agentrun-idmap-probe-{}", std::process::id()));
    if std::fs::create_dir_all(&probe).is_err() {
        return false;
    }
    let ok = attach_clone(dir, &probe, Some(&ns), true).is_ok();
    if ok {
        // Dropped: a probe's cleanup (a detached unmount of our own mount).
        let _ = nix::mount::umount2(&probe, nix::mount::MntFlags::MNT_DETACH);
    }
    // Dropped: a failure leaves an empty probe dir behind, not a wrong answer.
    let _ = std::fs::remove_dir(&probe);
    ok
}

/// Clones (`open_tree`, recursive) each of `sources` (path, read-only) in a helper process
/// that joins the user namespace `userns` and unshares a mount namespace there, and
/// returns the detached trees (nosuid, nodev). For an ordinary user's sandbox (see
/// [`crate::cellrun::RunMounts::prepare_rootless`]). The child makes only raw system calls
/// on data prepared before the fork (the daemon that calls this has threads).
pub fn clone_in_userns(
    userns: BorrowedFd<'_>,
    sources: &[(CString, bool)],
) -> Result<Vec<OwnedFd>, RuntimeError> {
    let (ours, theirs) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| RuntimeError::sys("socketpair", e))?;
    let ns_fd = userns.as_raw_fd();
    let sock = theirs.as_raw_fd();
    // SAFETY: fork(2); the child below makes only raw system calls on data prepared before the
    // fork, and leaves with _exit.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(RuntimeError::sys("fork", nix::Error::last()));
    }
    if child == 0 {
        // SAFETY: the child of a fork: raw system calls, then _exit.
        unsafe {
            let fail = |code: i32| -> ! {
                let errno = *libc::__errno_location();
                let msg = [code as u8, errno as u8];
                libc::send(sock, msg.as_ptr().cast(), 2, 0);
                libc::_exit(1)
            };
            if libc::setns(ns_fd, libc::CLONE_NEWUSER) != 0 {
                fail(1);
            }
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                fail(2);
            }
            for (path, readonly) in sources {
                let fd = libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    OPEN_TREE_CLONE
                        | libc::AT_RECURSIVE as libc::c_uint
                        | libc::O_CLOEXEC as libc::c_uint,
                ) as i32;
                if fd < 0 {
                    fail(3);
                }
                let mut attr = MountAttr {
                    attr_set: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                    attr_clr: 0,
                    propagation: libc::MS_PRIVATE,
                    userns_fd: 0,
                };
                if *readonly {
                    attr.attr_set |= MOUNT_ATTR_RDONLY;
                }
                if libc::syscall(
                    libc::SYS_mount_setattr,
                    fd,
                    c"".as_ptr(),
                    libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
                    &mut attr as *mut MountAttr,
                    std::mem::size_of::<MountAttr>(),
                ) != 0
                {
                    fail(4);
                }
                // One fd per message, in a cmsg buffer on the stack.
                let mut cbuf = [0u64; 4];
                let mut byte = [0u8; 1];
                let mut iov = libc::iovec {
                    iov_base: byte.as_mut_ptr().cast(),
                    iov_len: 1,
                };
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = &mut iov;
                msg.msg_iovlen = 1;
                msg.msg_control = cbuf.as_mut_ptr().cast();
                msg.msg_controllen = libc::CMSG_SPACE(4) as _;
                let cmsg = libc::CMSG_FIRSTHDR(&msg);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(4) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<i32>(), fd);
                if libc::sendmsg(sock, &msg, 0) < 0 {
                    fail(5);
                }
                libc::close(fd);
            }
            libc::_exit(0)
        }
    }
    drop(theirs);
    let child = nix::unistd::Pid::from_raw(child);
    let mut fds = Vec::with_capacity(sources.len());
    let result = (|| {
        for (path, _) in sources {
            let mut byte = [0u8; 2];
            let mut cbuf = nix::cmsg_space!([RawFd; 1]);
            let mut iov = [std::io::IoSliceMut::new(&mut byte)];
            let msg = nix::sys::socket::recvmsg::<()>(
                ours.as_raw_fd(),
                &mut iov,
                Some(&mut cbuf),
                nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
            )
            .map_err(|e| RuntimeError::sys("recvmsg", e))?;
            let mut got = None;
            for c in msg.cmsgs().map_err(|e| RuntimeError::sys("recvmsg", e))? {
                if let nix::sys::socket::ControlMessageOwned::ScmRights(v) = c {
                    // SAFETY: SCM_RIGHTS gave us this fd; nothing else owns it.
                    got = v.first().map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
            let bytes = msg.bytes;
            match got {
                Some(fd) => fds.push(fd),
                None => {
                    let step = match (bytes, byte[0]) {
                        (2, 1) => "joining the sandbox's user namespace",
                        (2, 2) => "making a mount namespace",
                        (2, 3) => "open_tree",
                        (2, 4) => "mount_setattr",
                        _ => "the mount helper",
                    };
                    let errno = if bytes == 2 { i32::from(byte[1]) } else { 0 };
                    return Err(RuntimeError::io(
                        "cannot mount (rootless)",
                        std::path::PathBuf::from(std::ffi::OsStr::from_bytes(path.as_bytes())),
                        std::io::Error::other(format!(
                            "{step}: {}",
                            std::io::Error::from_raw_os_error(errno)
                        )),
                    ));
                }
            }
        }
        Ok(())
    })();
    // Dropped: reaps our own child; the result above is what the caller needs.
    let _ = waitpid(child, None);
    result.map(|()| fds)
}
