//! Volumes: host directories a long-lived sandbox mounts beyond its image, and where they come
//! from.
//!
//! - **Host volumes**: a host path under one of the roots the operator allows (`agentrun serve
//!   --volume-root DIR`). [`VolumeRoots::open`] resolves it, and a `subPath` inside it, with
//!   `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` from the root's directory fd: `..` and
//!   symlinks may move within the root but never out of it (an escape is refused, not
//!   clamped), and since the kernel resolves the whole path at once there is no
//!   check-then-mount race: the caller mounts the fd it got ([`fd_path`]), not the path.
//!   Missing directories are made (as upstream OpenSandbox does), root-owned, `0755`.
//! - **Named volumes**: directories agentrun keeps under `$AGENTRUN_ROOT/volumes/NAME/data`
//!   (beside it `volume.json`, what it is, and `lock`), made on first use and kept across
//!   sandboxes until `agentrun volume rm`/`prune`. A sandbox holds a [`VolumeLease`] (a shared
//!   `flock` on `lock`) for as long as it exists: removing takes the lock exclusively, so a
//!   volume in use is never removed, and a daemon that dies lets go of its leases with it.
//!
//! Ownership: the mount is idmapped like a workspace ([`crate::cellrun::RunMounts`]): a
//! root-owned directory is mapped like the image (the sandbox's root writes as the host's
//! root, which is why `$AGENTRUN_ROOT` is `0700`), any other owner to the sandbox's root, so
//! files written land owned by the directory's owner. Mounts are `nosuid,nodev` inside.
//! Rootless (an ordinary user's store under `$XDG_DATA_HOME/agentrun`): a volume is the
//! user's own directory, cloned into the sandbox's user namespace like a workspace (not
//! idmapped): the sandbox's root writes it as the user.

use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{FileType, FlockOperation, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

/// Under `$AGENTRUN_ROOT`: the named volumes.
pub const VOLUMES_DIR: &str = "volumes";
/// A named volume's name: a DNS label (what OpenSandbox's `pvc.claimName` allows).
pub const MAX_NAME: usize = 253;

/// What can go wrong with a volume; each message is one line a caller can show as is.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The request is malformed (a name, a path): the caller's mistake.
    #[error("{0}")]
    Invalid(String),
    /// A host path outside every allowed root (or no root is allowed at all).
    #[error("host path {path} is not under an allowed volume root ({allowed})")]
    NotAllowed { path: String, allowed: String },
    #[error("no such volume: {0}")]
    NotFound(String),
    #[error("volume {0} already exists")]
    Exists(String),
    #[error("volume {0} is in use by a sandbox")]
    InUse(String),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl VolumeError {
    fn io(what: &'static str, path: impl Into<PathBuf>, source: impl Into<std::io::Error>) -> Self {
        VolumeError::Io {
            what,
            path: path.into(),
            source: source.into(),
        }
    }

    /// Whether the caller asked for something wrong (400) rather than the host failing (500).
    pub fn is_client_error(&self) -> bool {
        !matches!(self, VolumeError::Io { .. })
    }
}

/// Checks a named volume's name: a DNS label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`), at most
/// [`MAX_NAME`] bytes.
pub fn check_name(name: &str) -> Result<(), VolumeError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(VolumeError::Invalid(format!(
            "volume name {name:?} is not a DNS label (lowercase letters, digits and '-', at most {MAX_NAME})"
        )))
    }
}

/// A `subPath` checked and normalised: relative, no `..`, no NUL (`.` and empty parts
/// dropped). Empty means the volume's root.
pub fn check_sub_path(sub: &str) -> Result<PathBuf, VolumeError> {
    let bad = |why: &str| Err(VolumeError::Invalid(format!("subPath {sub:?} {why}")));
    if sub.contains('\0') {
        return bad("contains a NUL byte");
    }
    if sub.starts_with('/') {
        return bad("must be relative");
    }
    let mut out = PathBuf::new();
    for c in Path::new(sub).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return bad("must not contain '..'"),
        }
    }
    Ok(out)
}

/// The path the kernel resolves to exactly the file `fd` is open on (for `open_tree` and
/// `stat` by a path): `/proc/self/fd/N`. Valid while `fd` is open, in this process.
pub fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

/// Opens `rel` under `root` (an `O_PATH` fd), never leaving it, making missing directories
/// on the way (root-owned, `0755`) when `create`. The result is an `O_PATH` fd on a
/// directory, or on a regular file when `rel` names one.
fn open_beneath(root: &OwnedFd, rel: &Path, create: bool) -> Result<OwnedFd, Errno> {
    let target = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let open = |p: &Path| {
        rustix::fs::openat2(
            root,
            p,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            beneath(),
        )
    };
    match open(target) {
        Err(Errno::NOENT) if create => {}
        other => return other,
    }
    // Made one level at a time, each from its parent's fd: what is made is beneath `root`.
    let mut dir = open(Path::new("."))?;
    let mut so_far = PathBuf::new();
    for part in rel.components() {
        let Component::Normal(name) = part else {
            return Err(Errno::INVAL);
        };
        so_far.push(name);
        match open(&so_far) {
            Ok(fd) => dir = fd,
            Err(Errno::NOENT) => {
                let parent = rustix::fs::openat2(
                    &dir,
                    ".",
                    OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
                    Mode::empty(),
                    beneath(),
                )?;
                match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e),
                }
                dir = open(&so_far)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(dir)
}

/// Checks that an `O_PATH` fd from [`open_beneath`] is a directory or a regular file.
fn mountable(fd: &OwnedFd, what: &str) -> Result<(), VolumeError> {
    let st = rustix::fs::fstat(fd).map_err(|e| VolumeError::io("stat", what, e))?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory | FileType::RegularFile => Ok(()),
        _ => Err(VolumeError::Invalid(format!(
            "{what} is neither a directory nor a regular file"
        ))),
    }
}

fn resolve_error(e: Errno, what: &str) -> VolumeError {
    match e {
        Errno::XDEV => VolumeError::Invalid(format!("{what} leads out of its volume root")),
        Errno::LOOP => VolumeError::Invalid(format!("{what}: too many symlinks or a magic link")),
        Errno::NOTDIR => VolumeError::Invalid(format!("{what}: a part of it is not a directory")),
        Errno::NOENT => VolumeError::Invalid(format!("{what} does not exist")),
        e => VolumeError::io("cannot open", what, e),
    }
}

/// The host directories host volumes may come from (`serve --volume-root`).
#[derive(Debug, Clone, Default)]
pub struct VolumeRoots {
    /// Each root as given and as resolved (both forms match a request's path).
    roots: Vec<(PathBuf, PathBuf)>,
}

impl VolumeRoots {
    /// The roots, each an existing absolute directory.
    pub fn new(dirs: &[PathBuf]) -> Result<Self, VolumeError> {
        let mut roots = Vec::new();
        for d in dirs {
            if !d.is_absolute() {
                return Err(VolumeError::Invalid(format!(
                    "volume root {} must be an absolute path",
                    d.display()
                )));
            }
            let real = fs::canonicalize(d).map_err(|e| VolumeError::io("volume root", d, e))?;
            if !real.is_dir() {
                return Err(VolumeError::Invalid(format!(
                    "volume root {} is not a directory",
                    d.display()
                )));
            }
            roots.push((d.clone(), real));
        }
        Ok(VolumeRoots { roots })
    }

    /// What the operator should know about the roots: one line for each root-owned root that
    /// other host users can reach. In a root-owned directory the sandbox's root writes as the
    /// host's root (the idmapping), so a setuid-root file a sandbox leaves there (it is
    /// `nosuid` inside, not outside) is one for any host user who can reach it.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (given, real) in &self.roots {
            let Ok(m) = fs::metadata(real) else { continue };
            if m.uid() == 0 && m.mode() & 0o005 != 0 {
                out.push(format!(
                    "volume root {} is root-owned and other users can enter it: files sandboxes write there are the host root's, setuid bits included; make it 0700 or owned by an unprivileged user",
                    given.display()
                ));
            }
        }
        out
    }

    /// The allowed roots, for messages: `"/srv/a, /srv/b"` or `"none are allowed: ..."`.
    pub fn describe(&self) -> String {
        if self.roots.is_empty() {
            "no volume root is allowed: start agentrun serve with --volume-root DIR".into()
        } else {
            let names: Vec<String> = self
                .roots
                .iter()
                .map(|(given, _)| given.display().to_string())
                .collect();
            format!("allowed: {}", names.join(", "))
        }
    }

    /// Opens host path `path` (absolute, no `..`), then `sub` inside it, under the root it
    /// names, making missing directories: an `O_PATH` fd on a directory or regular file.
    pub fn open(&self, path: &str, sub: &Path) -> Result<OwnedFd, VolumeError> {
        if path.contains('\0') || !path.starts_with('/') {
            return Err(VolumeError::Invalid(format!(
                "host path {path:?} must be absolute"
            )));
        }
        let p = Path::new(path);
        if p.components().any(|c| c == Component::ParentDir) {
            return Err(VolumeError::Invalid(format!(
                "host path {path:?} must not contain '..'"
            )));
        }
        let found = self.roots.iter().find_map(|(given, real)| {
            [given, real]
                .into_iter()
                .find_map(|r| p.strip_prefix(r).ok().map(|rel| (real, rel.to_path_buf())))
        });
        let Some((root, rel)) = found else {
            return Err(VolumeError::NotAllowed {
                path: path.to_owned(),
                allowed: self.describe(),
            });
        };
        let root_fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| VolumeError::io("volume root", root, e))?;
        let fd = open_beneath(&root_fd, &rel.join(sub), true)
            .map_err(|e| resolve_error(e, &format!("host path {}", p.join(sub).display())))?;
        mountable(&fd, path)?;
        Ok(fd)
    }
}

/// Who made a named volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Creator {
    /// `agentrun volume create`.
    Cli,
    /// A sandbox's create request (`createIfNotExists`).
    Api,
}

/// `volume.json`: what a named volume is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeMeta {
    pub name: String,
    /// Seconds since the epoch.
    pub created: u64,
    pub created_by: Creator,
    /// Host owner of its data directory.
    pub uid: u32,
    pub gid: u32,
}

/// A named volume as `agentrun volume ls/inspect` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct VolumeInfo {
    #[serde(flatten)]
    pub meta: VolumeMeta,
    /// Its data directory on the host (what sandboxes mount).
    pub mountpoint: PathBuf,
    /// Whether a sandbox holds it now.
    pub in_use: bool,
}

/// The named volumes under `$AGENTRUN_ROOT/volumes`.
#[derive(Debug, Clone)]
pub struct VolumeStore {
    dir: PathBuf,
}

/// A named volume held by a sandbox: while it lives, the volume is in use (not removable).
#[derive(Debug)]
pub struct VolumeLease {
    pub name: String,
    /// Whether this lease made the volume.
    pub created: bool,
    /// `O_PATH` fd on the data directory.
    data: OwnedFd,
    _lock: fs::File,
}

impl VolumeLease {
    /// Opens `sub` inside the volume (made if missing), never leaving it: an `O_PATH` fd.
    pub fn open(&self, sub: &Path) -> Result<OwnedFd, VolumeError> {
        let fd = open_beneath(&self.data, sub, true).map_err(|e| {
            resolve_error(
                e,
                &format!("subPath {} of volume {}", sub.display(), self.name),
            )
        })?;
        mountable(
            &fd,
            &format!("subPath {} of volume {}", sub.display(), self.name),
        )?;
        Ok(fd)
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn is_locked(lock: &fs::File) -> bool {
    match rustix::fs::flock(lock.as_fd(), FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {
            // Dropped: the lock is released on close anyway; we only tested it was free.
            let _ = rustix::fs::flock(lock.as_fd(), FlockOperation::Unlock);
            false
        }
        Err(_) => true,
    }
}

impl VolumeStore {
    /// The store under `agentrun_root` (made on first use, `0700`).
    pub fn new(agentrun_root: &Path) -> Self {
        VolumeStore {
            dir: agentrun_root.join(VOLUMES_DIR),
        }
    }

    fn volume_dir(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn ensure_dir(&self) -> Result<(), VolumeError> {
        fs::create_dir_all(&self.dir).map_err(|e| VolumeError::io("create", &self.dir, e))?;
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| VolumeError::io("chmod", &self.dir, e))
    }

    /// Makes volume `name` (its data directory owned by `owner`, default the caller: root,
    /// or in rootless mode the user, whose sandboxes see it as their root), or
    /// [`VolumeError::Exists`]. Only root may give it another owner. Made complete under a
    /// temporary name, then renamed into place.
    pub fn create(
        &self,
        name: &str,
        owner: Option<(u32, u32)>,
        by: Creator,
    ) -> Result<VolumeMeta, VolumeError> {
        check_name(name)?;
        self.ensure_dir()?;
        let dest = self.volume_dir(name);
        if dest.exists() {
            return Err(VolumeError::Exists(name.into()));
        }
        let caller = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let (uid, gid) = owner.unwrap_or(caller);
        if caller.0 != 0 && (uid, gid) != caller {
            return Err(VolumeError::Invalid(format!(
                "volume {name}: only root may give a volume another owner ({uid}:{gid}); \
                 yours are {}:{}",
                caller.0, caller.1
            )));
        }
        let meta = VolumeMeta {
            name: name.into(),
            created: now_secs(),
            created_by: by,
            uid,
            gid,
        };
        let tmp = self.dir.join(format!(
            ".new-{name}-{}",
            crate::random::hex(8).map_err(|e| VolumeError::io(
                "random",
                &self.dir,
                std::io::Error::other(e.to_string())
            ))?
        ));
        let made = (|| -> std::io::Result<()> {
            fs::create_dir(&tmp)?;
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o700))?;
            let data = tmp.join("data");
            fs::create_dir(&data)?;
            std::os::unix::fs::chown(&data, Some(uid), Some(gid))?;
            fs::set_permissions(&data, fs::Permissions::from_mode(0o755))?;
            fs::File::create(tmp.join("lock"))?;
            let mut f = fs::File::create(tmp.join("volume.json"))?;
            f.write_all(&serde_json::to_vec_pretty(&meta).map_err(std::io::Error::other)?)?;
            f.sync_all()
        })();
        if let Err(e) = made {
            // Dropped: the error returned is the one that matters; a leftover tmp dir is swept by
            // prune (`.removing-`/old tmp names).
            let _ = fs::remove_dir_all(&tmp);
            return Err(VolumeError::io("create", &dest, e));
        }
        // renameat2(RENAME_NOREPLACE): two creators of one name, one wins, the other sees it.
        match rustix::fs::renameat_with(
            rustix::fs::CWD,
            &tmp,
            rustix::fs::CWD,
            &dest,
            rustix::fs::RenameFlags::NOREPLACE,
        ) {
            Ok(()) => Ok(meta),
            Err(e) => {
                // Dropped: as above, the rename's error is returned; the tmp dir is swept later.
                let _ = fs::remove_dir_all(&tmp);
                if e == Errno::EXIST || e == Errno::NOTEMPTY {
                    Err(VolumeError::Exists(name.into()))
                } else {
                    Err(VolumeError::io("create", &dest, e))
                }
            }
        }
    }

    fn read_meta(&self, name: &str) -> Result<VolumeMeta, VolumeError> {
        let path = self.volume_dir(name).join("volume.json");
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(VolumeError::NotFound(name.into()))
            }
            Err(e) => return Err(VolumeError::io("read", &path, e)),
        };
        serde_json::from_slice(&text)
            .map_err(|e| VolumeError::io("read", &path, std::io::Error::other(e)))
    }

    fn open_lock(&self, name: &str) -> Result<fs::File, VolumeError> {
        let path = self.volume_dir(name).join("lock");
        fs::File::open(&path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                VolumeError::NotFound(name.into())
            } else {
                VolumeError::io("open", &path, e)
            }
        })
    }

    /// Volume `name` as `inspect` shows it.
    pub fn inspect(&self, name: &str) -> Result<VolumeInfo, VolumeError> {
        check_name(name)?;
        let meta = self.read_meta(name)?;
        let in_use = is_locked(&self.open_lock(name)?);
        Ok(VolumeInfo {
            meta,
            mountpoint: self.volume_dir(name).join("data"),
            in_use,
        })
    }

    /// Every named volume, by name.
    pub fn list(&self) -> Result<Vec<VolumeInfo>, VolumeError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(VolumeError::io("list", &self.dir, e)),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if check_name(&name).is_err() {
                continue; // a volume being made or removed
            }
            match self.inspect(&name) {
                Ok(v) => out.push(v),
                Err(VolumeError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| a.meta.name.cmp(&b.meta.name));
        Ok(out)
    }

    /// Takes volume `name` for a sandbox, making it first when it does not exist and
    /// `create_if_missing` (else [`VolumeError::NotFound`]).
    pub fn lease(&self, name: &str, create_if_missing: bool) -> Result<VolumeLease, VolumeError> {
        self.lease_or_make(name, create_if_missing.then_some(Creator::Api))
    }

    /// [`VolumeStore::lease`], making a missing volume as made `by` when given (`exec
    /// --volume`: the CLI's).
    pub fn lease_or_make(
        &self,
        name: &str,
        by: Option<Creator>,
    ) -> Result<VolumeLease, VolumeError> {
        check_name(name)?;
        // A remove may be between its lock and its rename: then the lock file is gone once we
        // hold it, and the volume is looked up again.
        for _ in 0..3 {
            let mut created = false;
            let lock = match self.open_lock(name) {
                Ok(l) => l,
                Err(VolumeError::NotFound(_)) if by.is_some() => {
                    match self.create(name, None, by.unwrap_or(Creator::Api)) {
                        Ok(_) => created = true,
                        Err(VolumeError::Exists(_)) => {}
                        Err(e) => return Err(e),
                    }
                    self.open_lock(name)?
                }
                Err(e) => return Err(e),
            };
            rustix::fs::flock(lock.as_fd(), FlockOperation::LockShared)
                .map_err(|e| VolumeError::io("lock", self.volume_dir(name), e))?;
            let st = rustix::fs::fstat(&lock)
                .map_err(|e| VolumeError::io("stat", self.volume_dir(name), e))?;
            if st.st_nlink == 0 {
                continue; // removed meanwhile
            }
            let data_path = self.volume_dir(name).join("data");
            let data = rustix::fs::open(
                &data_path,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| VolumeError::io("open", &data_path, e))?;
            return Ok(VolumeLease {
                name: name.into(),
                created,
                data,
                _lock: lock,
            });
        }
        Err(VolumeError::NotFound(name.into()))
    }

    /// Removes volume `name` and everything in it, unless a sandbox holds it.
    pub fn remove(&self, name: &str) -> Result<(), VolumeError> {
        check_name(name)?;
        let lock = self.open_lock(name)?;
        if rustix::fs::flock(lock.as_fd(), FlockOperation::NonBlockingLockExclusive).is_err() {
            return Err(VolumeError::InUse(name.into()));
        }
        // Out of its name first (a lease that waited for the lock then finds it gone), then
        // removed: what a crash leaves is a hidden `.removing-*` that the next remove ends.
        let doomed = self.dir.join(format!(".removing-{name}-{}", now_secs()));
        let dir = self.volume_dir(name);
        fs::rename(&dir, &doomed).map_err(|e| VolumeError::io("remove", &dir, e))?;
        fs::remove_file(doomed.join("lock")).map_err(|e| VolumeError::io("remove", &dir, e))?;
        drop(lock);
        self.sweep();
        Ok(())
    }

    /// Removes what interrupted creates and removes left (`.new-*`, `.removing-*`).
    fn sweep(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if n.starts_with(".removing-") {
                // Dropped: sweeping leftovers; what stays is tried again on the next prune.
                let _ = fs::remove_dir_all(e.path());
            } else if n.starts_with(".new-") {
                // Older than a minute: no create is still making it.
                let old = e
                    .metadata()
                    .map(|m| now_secs().saturating_sub(m.mtime() as u64) > 60)
                    .unwrap_or(false);
                if old {
                    // Dropped: as above, tried again on the next prune.
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    }

    /// Removes every volume no sandbox holds; their names.
    pub fn prune(&self) -> Result<Vec<String>, VolumeError> {
        let mut removed = Vec::new();
        for v in self.list()? {
            match self.remove(&v.meta.name) {
                Ok(()) => removed.push(v.meta.name),
                Err(VolumeError::InUse(_)) | Err(VolumeError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.sweep();
        Ok(removed)
    }
}

/// Bytes the files under `dir` take (not following symlinks or crossing mounts).
pub fn disk_usage(dir: &Path) -> u64 {
    let Ok(root) = fs::symlink_metadata(dir) else {
        return 0;
    };
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            total += m.blocks() * 512;
            if m.is_dir() && m.dev() == root.dev() {
                stack.push(e.path());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "data", "my-vol-1", "0"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            "a/b",
            "..",
            &"a".repeat(254),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sub_paths() {
        assert_eq!(check_sub_path("").unwrap(), PathBuf::new());
        assert_eq!(check_sub_path("a/./b/").unwrap(), PathBuf::from("a/b"));
        for bad in ["/abs", "..", "a/../b", "a/..", "a\0b"] {
            assert!(check_sub_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn host_paths_stay_under_their_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        fs::create_dir_all(root.join("in")).unwrap();
        fs::create_dir_all(t.path().join("outside")).unwrap();
        std::os::unix::fs::symlink("../outside", root.join("up")).unwrap();
        std::os::unix::fs::symlink("in", root.join("inner")).unwrap();
        std::os::unix::fs::symlink("/", root.join("slash")).unwrap();
        let roots = VolumeRoots::new(std::slice::from_ref(&root)).unwrap();
        let r = root.display().to_string();
        assert!(roots.open(&r, Path::new("")).is_ok());
        assert!(roots.open(&format!("{r}/in"), Path::new("")).is_ok());
        // A symlink inside the root that stays inside is followed.
        assert!(roots.open(&format!("{r}/inner"), Path::new("")).is_ok());
        // Missing directories are made, inside.
        roots
            .open(&format!("{r}/new/deeper"), Path::new("x/y"))
            .unwrap();
        assert!(root.join("new/deeper/x/y").is_dir());
        for escape in ["up", "slash", "slash/etc", "up/x"] {
            let e = roots
                .open(&format!("{r}/{escape}"), Path::new(""))
                .unwrap_err();
            assert!(matches!(e, VolumeError::Invalid(_)), "{escape}: {e}");
        }
        assert!(!t.path().join("outside/x").exists());
        let e = roots
            .open(&format!("{r}/in"), Path::new("../../outside"))
            .unwrap_err();
        assert!(e.is_client_error(), "{e}");
        for other in ["/etc", "/", &format!("{r}x")] {
            let e = roots.open(other, Path::new("")).unwrap_err();
            assert!(matches!(e, VolumeError::NotAllowed { .. }), "{other}: {e}");
        }
        assert!(matches!(
            roots.open(&format!("{r}/../outside"), Path::new("")),
            Err(VolumeError::Invalid(_))
        ));
        // A root-owned 0755 root is reachable by other users: said; 0700 is not.
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(roots.warnings().len(), 1, "{:?}", roots.warnings());
        fs::set_permissions(&root, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(roots.warnings().is_empty());
        let none = VolumeRoots::default();
        let e = none.open("/tmp", Path::new("")).unwrap_err();
        assert!(e.to_string().contains("--volume-root"), "{e}");
    }

    #[test]
    fn named_volumes_live_until_removed_and_not_while_leased() {
        let t = tempfile::tempdir().unwrap();
        let store = VolumeStore::new(t.path());
        assert!(store.list().unwrap().is_empty());
        assert!(matches!(
            store.lease("v", false),
            Err(VolumeError::NotFound(_))
        ));
        let lease = store.lease("v", true).unwrap();
        assert!(lease.created);
        let data = store.inspect("v").unwrap().mountpoint;
        fs::write(data.join("f"), b"x").unwrap();
        assert!(store.inspect("v").unwrap().in_use);
        assert!(matches!(store.remove("v"), Err(VolumeError::InUse(_))));
        assert_eq!(store.prune().unwrap(), Vec::<String>::new());
        // A second lease of an existing volume did not make it.
        let again = store.lease("v", true).unwrap();
        assert!(!again.created);
        drop((lease, again));
        assert!(!store.inspect("v").unwrap().in_use);
        assert!(matches!(
            store.create("v", None, Creator::Cli),
            Err(VolumeError::Exists(_))
        ));
        store.create("w", Some((1000, 1000)), Creator::Cli).unwrap();
        let names: Vec<String> = store
            .list()
            .unwrap()
            .into_iter()
            .map(|v| v.meta.name)
            .collect();
        assert_eq!(names, ["v", "w"]);
        store.remove("v").unwrap();
        assert!(matches!(store.inspect("v"), Err(VolumeError::NotFound(_))));
        assert_eq!(store.prune().unwrap(), ["w"]);
        assert_eq!(fs::read_dir(t.path().join(VOLUMES_DIR)).unwrap().count(), 0);
    }

    #[test]
    fn sub_paths_of_a_named_volume_stay_inside_it() {
        let t = tempfile::tempdir().unwrap();
        let store = VolumeStore::new(t.path());
        let lease = store.lease("v", true).unwrap();
        let data = store.inspect("v").unwrap().mountpoint;
        std::os::unix::fs::symlink("/etc", data.join("etc")).unwrap();
        assert!(lease.open(Path::new("a/b")).is_ok());
        assert!(data.join("a/b").is_dir());
        assert!(lease.open(Path::new("etc")).is_err());
        assert!(lease.open(Path::new("etc/x")).is_err());
        assert!(!Path::new("/etc/x").exists());
    }
}
