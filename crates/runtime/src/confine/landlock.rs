//! Landlock: the filesystem view of the sandboxed process, enforced by the kernel.
//!
//! Read and execute only under the profile's readable paths (default: the whole sandbox root)
//! and the writable ones; write only under the workspace (when the profile makes it writable),
//! the profile's writable paths and the rw mounts; plus the few device files programs write to.
//! Once the rules are in place, `..`, symlinks to `/etc` and the like are judged by the kernel
//! on the path they resolve to.
//!
//! The rules' own paths come from the profile but are looked up in the image, which the
//! profile's author does not control: an image whose `/tmp` is a link to `/` must not make the
//! whole root writable. So each rule path is opened with `openat2` from the sandbox's root
//! ([`open_rule`]):
//! - a writable path must contain no symlink at all (`RESOLVE_NO_SYMLINKS`);
//! - a readable path may follow the image's links inside the root (`RESOLVE_IN_ROOT`, so
//!   merged-/usr images, `/bin -> usr/bin`, keep working) only to a target beneath a path the
//!   rules already name (readable or writable), so a link never widens what the profile lists;
//! - a device path may follow links within `/dev` (`/dev/ptmx -> pts/ptmx`).
//!
//! A path that breaks these is an error that fails the sandbox's setup (exit 125 with the
//! reason), not a skipped rule: a skipped writable rule would fail the command later in a
//! confusing way, and a profile whose paths the image subverts is something the operator must
//! see and fix (the image or the profile). Paths the image lacks are skipped, as before.
//!
//! Scoped (ABI 6+) so the process cannot signal or reach abstract sockets outside its domain,
//! which also keeps it from ptrace-style access to agentrun's init. Best effort by ABI: the
//! host's ABI is probed up front ([`abi`]) and reported, and [`restrict`] fails if the kernel
//! enforces less than that ABI promised.
//!
//! Observing denials: on ABI 7+ (Linux 6.15+) the ruleset asks the kernel to log the
//! command's denied accesses (`LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`). The kernel emits them
//! as `AUDIT_LANDLOCK_ACCESS` records (with the domain, pid, path and the blocked right) only
//! while the audit subsystem is enabled on the host (`auditctl -e 1` or `audit=1`); then they
//! are in the host's audit log (auditd, journald). agentrun does not turn audit on by itself;
//! when it is on, [`crate::host::kaudit`] reads the records of a run and `agentrun exec` writes each
//! into agentrun's own audit log and the run's span as a policy decision.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, PathBeneath, RestrictionStatus, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetError, RulesetStatus, Scope, ABI,
};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// The ABI that can log denials after exec (`LANDLOCK_RESTRICT_SELF_LOG_NEW_EXEC_ON`).
const LOG_NEW_EXEC_ABI: u32 = 7;

/// The newest ABI whose rights agentrun asks for.
const TARGET_ABI: ABI = ABI::V6;

/// Device files every program may write (and use terminal ioctls on).
const WRITABLE_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
    "/dev/shm",
];

/// Paths a sandboxed process may write (inside the sandbox's root).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LandlockRules {
    /// Read and execute (files and directory listings).
    pub readable: Vec<PathBuf>,
    /// Everything, including read.
    pub writable: Vec<PathBuf>,
}

/// Errors applying Landlock.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    #[error("landlock: {0}")]
    Ruleset(#[from] landlock::RulesetError),
    #[error("landlock: the kernel enforced less than expected ({0:?})")]
    NotEnforced(RulesetStatus),
    #[error(
        "landlock: writable path {0} goes through a symlink in the image; refused (a link \
         could make a wider tree writable): make it a real directory or change the profile"
    )]
    WritableThroughLink(PathBuf),
    #[error(
        "landlock: {path} resolves through a link in the image to {target}, outside every path \
         the profile allows; refused"
    )]
    LinkOutside { path: PathBuf, target: String },
    #[error("landlock: opening {path} for a rule: {errno}")]
    Open { path: PathBuf, errno: Errno },
    #[error("landlock: copying the ruleset: {0}")]
    Share(std::io::Error),
}

/// How symlinks in a rule's path are treated (see the module doc).
#[derive(Debug, Clone, Copy)]
pub enum Links<'a> {
    /// None may appear anywhere in the path.
    Refused,
    /// Followed inside the root, to a target beneath one of these paths.
    Within(&'a [PathBuf]),
}

/// Opens the rule path `path` (absolute, inside the sandbox) from the sandbox's root `root`
/// (an `O_PATH` directory fd), treating symlinks as `links` says. `Ok(None)`: the image has
/// no such path (or it is a dangling link).
pub fn open_rule(
    root: &OwnedFd,
    path: &Path,
    links: Links<'_>,
) -> Result<Option<OwnedFd>, LandlockError> {
    let rel = path.strip_prefix("/").unwrap_or(path);
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let open = |resolve: ResolveFlags| {
        rustix::fs::openat2(
            root,
            rel,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            resolve,
        )
    };
    let failed = |errno: Errno| match errno {
        Errno::NOENT | Errno::NOTDIR => Ok(None),
        errno => Err(LandlockError::Open {
            path: path.to_owned(),
            errno,
        }),
    };
    match open(ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS) {
        Ok(fd) => return Ok(Some(fd)),
        Err(Errno::LOOP) => {}
        Err(errno) => return failed(errno),
    }
    // A symlink somewhere in the path.
    let Links::Within(bases) = links else {
        return Err(LandlockError::WritableThroughLink(path.to_owned()));
    };
    let fd = match open(ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS) {
        Ok(fd) => fd,
        Err(errno) => return failed(errno),
    };
    // Where it resolved, as a path inside the root.
    let fd_path = |fd: &OwnedFd| std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    let target = fd_path(&fd).and_then(|t| {
        let root_path = fd_path(root)?;
        t.strip_prefix(&root_path)
            .map(|rel| Path::new("/").join(rel))
            .map_err(|_| std::io::Error::other(format!("{} is outside the root", t.display())))
    });
    match target {
        Ok(t) if t.is_absolute() && bases.iter().any(|b| t.starts_with(b)) => Ok(Some(fd)),
        Ok(t) => Err(LandlockError::LinkOutside {
            path: path.to_owned(),
            target: t.display().to_string(),
        }),
        Err(e) => Err(LandlockError::LinkOutside {
            path: path.to_owned(),
            target: format!("an unknown place ({e})"),
        }),
    }
}

/// [`open_rule`] for each path, skipping the ones the image lacks.
fn open_rules(
    root: &OwnedFd,
    paths: &[PathBuf],
    links: Links<'_>,
) -> Result<Vec<OwnedFd>, LandlockError> {
    let mut fds = Vec::with_capacity(paths.len());
    for p in paths {
        if let Some(fd) = open_rule(root, p, links)? {
            fds.push(fd);
        }
    }
    Ok(fds)
}

/// Landlock rules granting `access` beneath each of `fds` (on a file that is not a
/// directory, only the rights a file can have: the kernel refuses the others).
fn beneath(
    fds: Vec<OwnedFd>,
    access: landlock::BitFlags<AccessFs>,
) -> impl Iterator<Item = Result<PathBeneath<OwnedFd>, RulesetError>> {
    fds.into_iter().map(move |fd| {
        let is_dir = rustix::fs::fstat(&fd)
            .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir())
            .unwrap_or(true);
        let access = if is_dir {
            access
        } else {
            access & AccessFs::from_file(TARGET_ABI)
        };
        Ok(PathBeneath::new(fd, access))
    })
}

/// The Landlock ABI this kernel supports (0: none).
pub fn abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns the ABI number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        0
    } else {
        v as u32
    }
}

/// Restricts the calling process (and its future children), whose root is the sandbox's.
/// Requires no_new_privs.
pub fn restrict(rules: &LandlockRules, host_abi: u32) -> Result<RestrictionStatus, LandlockError> {
    restrict_sharing(rules, host_abi, false).map(|(status, _)| status)
}

/// [`restrict`], and with `share` a copy of the ruleset it enforced: another process given it
/// (a cell's Python zygote child, see [`crate::inside::zygote`]) restricts itself to exactly the same
/// rules with `landlock_restrict_self`.
pub fn restrict_sharing(
    rules: &LandlockRules,
    host_abi: u32,
    share: bool,
) -> Result<(RestrictionStatus, Option<std::os::fd::OwnedFd>), LandlockError> {
    let abi = TARGET_ABI;
    let root = rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| LandlockError::Open {
        path: "/".into(),
        errno,
    })?;
    // A readable link may lead anywhere the rules already grant reading.
    let named: Vec<PathBuf> = rules
        .readable
        .iter()
        .chain(&rules.writable)
        .cloned()
        .collect();
    let readable = open_rules(&root, &rules.readable, Links::Within(&named))?;
    let writable = open_rules(&root, &rules.writable, Links::Refused)?;
    let dev = [PathBuf::from("/dev")];
    let device_paths: Vec<PathBuf> = WRITABLE_DEVICES.iter().map(PathBuf::from).collect();
    let devices = open_rules(&root, &device_paths, Links::Within(&dev))?;
    drop(root);
    let created = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))?
        .scope(Scope::from_all(abi))?
        .create()?;
    // ABI 7+: denials of the command (a new exec after this call) are logged to the audit
    // subsystem too, which records them when the host has audit enabled (see module doc).
    let created = if host_abi >= LOG_NEW_EXEC_ABI {
        created.log_new_exec(true)?
    } else {
        created
    };
    let created = created
        .add_rules(beneath(readable, AccessFs::from_read(abi)))?
        .add_rules(beneath(writable, AccessFs::from_all(abi)))?
        .add_rules(beneath(
            devices,
            AccessFs::from_read(abi) | AccessFs::from_write(abi),
        ))?;
    let shared = if share {
        let copy = created.try_clone().map_err(LandlockError::Share)?;
        Option::<std::os::fd::OwnedFd>::from(copy)
    } else {
        None
    };
    let status = created.restrict_self()?;
    let expected = if host_abi == 0 {
        RulesetStatus::NotEnforced
    } else if host_abi >= TARGET_ABI as u32 {
        RulesetStatus::FullyEnforced
    } else {
        RulesetStatus::PartiallyEnforced
    };
    if host_abi > 0 && status.ruleset == RulesetStatus::NotEnforced {
        return Err(LandlockError::NotEnforced(status.ruleset));
    }
    if expected == RulesetStatus::FullyEnforced && status.ruleset != RulesetStatus::FullyEnforced {
        return Err(LandlockError::NotEnforced(status.ruleset));
    }
    Ok((status, shared))
}

/// How Landlock is enforced on a host with `host_abi`: "full", "partial (ABI n)" or "none".
pub fn describe(host_abi: u32) -> String {
    match host_abi {
        0 => "none".into(),
        n if n >= TARGET_ABI as u32 => "full".into(),
        n => format!("partial (ABI {n})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// An image-like tree: merged /usr, /tmp linked to /, /lib linked to /, a real /etc.
    fn tree() -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        for d in ["usr/bin", "usr/lib", "etc", "var/tmp", "dev/pts"] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        symlink("usr/bin", r.join("bin")).unwrap();
        symlink("/", r.join("tmp")).unwrap();
        symlink("/", r.join("lib")).unwrap();
        symlink("/etc", r.join("var/etc")).unwrap();
        symlink("pts/ptmx", r.join("dev/ptmx")).unwrap();
        symlink("/nowhere", r.join("dangling")).unwrap();
        std::fs::write(r.join("dev/pts/ptmx"), b"").unwrap();
        let root = rustix::fs::open(r, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        (dir, root)
    }

    #[test]
    fn writable_paths_through_links_are_refused() {
        let (_dir, root) = tree();
        let w = |p: &str| open_rule(&root, Path::new(p), Links::Refused);
        assert!(matches!(
            w("/tmp"),
            Err(LandlockError::WritableThroughLink(_))
        ));
        assert!(matches!(
            w("/var/etc"),
            Err(LandlockError::WritableThroughLink(_))
        ));
        assert!(matches!(
            w("/bin/x"),
            Err(LandlockError::WritableThroughLink(_))
        ));
        assert!(w("/var/tmp").unwrap().is_some());
        assert!(w("/etc").unwrap().is_some());
        assert!(w("/missing").unwrap().is_none());
        let e = w("/tmp").unwrap_err().to_string();
        assert!(e.contains("/tmp") && e.contains("symlink"), "{e}");
    }

    #[test]
    fn readable_links_must_stay_beneath_named_paths() {
        let (_dir, root) = tree();
        let bases: Vec<PathBuf> = ["/usr", "/bin", "/lib", "/tmp", "/var/etc"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let r = |p: &str| open_rule(&root, Path::new(p), Links::Within(&bases));
        // Merged /usr: /bin -> usr/bin is beneath /usr.
        assert!(r("/bin").unwrap().is_some());
        // /lib -> / and /tmp -> / would widen the rules to the whole root.
        for p in ["/lib", "/tmp"] {
            match r(p) {
                Err(LandlockError::LinkOutside { target, .. }) => assert_eq!(target, "/"),
                other => panic!("{p}: {other:?}"),
            }
        }
        match r("/var/etc") {
            Err(LandlockError::LinkOutside { target, .. }) => assert_eq!(target, "/etc"),
            other => panic!("{other:?}"),
        }
        assert!(r("/dangling").unwrap().is_none());
        // With / among the named paths, anything inside the root is fine.
        let all = [PathBuf::from("/")];
        assert!(open_rule(&root, Path::new("/lib"), Links::Within(&all))
            .unwrap()
            .is_some());
        // Devices: links within /dev only.
        let dev = [PathBuf::from("/dev")];
        assert!(
            open_rule(&root, Path::new("/dev/ptmx"), Links::Within(&dev))
                .unwrap()
                .is_some()
        );
    }
}
