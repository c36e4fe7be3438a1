//! Layers: unpacking a layer tarball into a directory overlayfs can use as a lower layer, the
//! layer store `<root>/layers/<diff-id hex>/fs`, and leases that keep `prune` off layers in use.
//!
//! Unpacking is written by hand over the `tar` crate's parser because no crate converts OCI
//! whiteouts to overlayfs ones and applies the path rules a store that runs as root needs:
//! - entry paths are relative to the layer root: a leading `/` is dropped, `..` is refused;
//! - no entry is created through a symlink (a parent that is a symlink fails the layer), so an
//!   entry can never land outside the layer directory;
//! - hard links must point at an earlier entry of the same layer, resolved the same way;
//! - device nodes are not created (a sandbox gets its own `/dev`), they are counted instead;
//! - `.wh.NAME` becomes an overlayfs whiteout (char device 0:0), `.wh..wh..opq` marks its
//!   directory opaque (`trusted.overlay.opaque=y`);
//! - owners, modes (set-id bits included), mtimes and `user.*`/`security.capability` xattrs are
//!   kept. Symlink targets are stored as they are: they are only ever followed inside a
//!   sandbox, where `/` is the sandbox's root.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{lchown, symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::stat::{mknod, Mode, SFlag};

use crate::blobs::{temp_path, BlobStore};
use crate::digest::{hex_of, HashingReader};
use crate::limits::{drain, Budget, TarError, TarGuard};
use crate::progress::Tick;
use crate::ImageError;

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
const OVERLAY_OPAQUE_XATTR: &str = "trusted.overlay.opaque";
/// The same marker of an overlay mounted with `userxattr` (a sandbox's cell, in its user
/// namespace).
const OVERLAY_USER_OPAQUE_XATTR: &str = "user.overlay.opaque";

/// What unpacking a layer found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpackReport {
    /// Digest of the uncompressed tar stream (the layer's diff id).
    pub diff_id: String,
    /// Bytes of regular file content.
    pub content_bytes: u64,
    /// Device nodes left out.
    pub skipped_devices: usize,
}

/// Opens a possibly compressed layer stream (gzip and zstd detected by magic number).
pub fn decompress<'a>(r: impl Read + 'a) -> io::Result<Box<dyn Read + 'a>> {
    let mut r = BufReader::with_capacity(256 * 1024, r);
    let head = r.fill_buf()?;
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(r))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(
            ruzstd::decoding::StreamingDecoder::new(r)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?,
        )
    } else {
        Box::new(r)
    })
}

/// Unpacks a (possibly compressed) layer tarball into `dest` (an empty directory), charging
/// what it unpacks to `budget` (see [`crate::limits`]).
pub fn unpack(
    blob: impl Read,
    dest: &Path,
    layer: &str,
    budget: &Budget,
) -> Result<UnpackReport, ImageError> {
    let guard = TarGuard::new(budget);
    // A limit the guard hit explains any failure better than the error it caused.
    let fail = |message: String| match guard.exceeded() {
        Some(x) => x.into_error(format!("layer {layer}")),
        None => ImageError::Layer {
            layer: layer.to_owned(),
            message,
        },
    };
    let stream = decompress(guard.compressed(blob)).map_err(|e| fail(format!("reading: {e}")))?;
    let mut hashing = HashingReader::new(guard.unpacked(stream));
    let mut report = UnpackReport::default();
    let mut dir_times: Vec<(PathBuf, i64)> = Vec::new();
    {
        let mut archive = tar::Archive::new(&mut hashing);
        let mut entries = archive
            .entries()
            .map_err(|e| fail(format!("not a tar stream: {e}")))?;
        while let Some(entry) = guard.next_entry(&mut entries) {
            let mut entry = entry.map_err(|e| match e {
                TarError::Limit(x) => x.into_error(format!("layer {layer}")),
                TarError::Io(e) => fail(format!("corrupt tar stream: {e}")),
            })?;
            let raw = entry
                .path()
                .map_err(|e| fail(format!("bad entry path: {e}")))?
                .into_owned();
            let rel = relative(&raw).map_err(|why| fail(format!("entry {raw:?}: {why}")))?;
            let Some(rel) = rel else {
                drain(&mut entry).map_err(|e| fail(format!("reading: {e}")))?;
                continue;
            };
            budget
                .check_depth(&rel)
                .map_err(|x| x.into_error(format!("layer {layer}")))?;
            apply_entry(&mut entry, dest, &rel, &mut report, &mut dir_times, &guard)
                .map_err(|why| fail(format!("entry {}: {why}", rel.display())))?;
            drain(&mut entry).map_err(|e| fail(format!("reading: {e}")))?;
        }
    }
    // Directory mtimes last: creating their entries changed them.
    for (dir, mtime) in dir_times.iter().rev() {
        set_mtime(dir, *mtime);
    }
    let (diff_id, _) = hashing
        .finish()
        .map_err(|e| fail(format!("reading: {e}")))?;
    report.diff_id = diff_id;
    Ok(report)
}

/// Why one tar entry (of a layer, or of an archive being extracted) was refused or failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EntryError {
    #[error("'..' in a layer path is not allowed")]
    ParentDir,
    #[error("bad path")]
    Prefix,
    #[error(
        "goes through the symlink {} (refused: it could point outside the layer)",
        .0.display()
    )]
    ThroughSymlink(PathBuf),
    #[error("parent {} is not a directory", .0.display())]
    ParentNotDir(PathBuf),
    /// A file system call on the entry failed; `op` says which (`mkdir`, `chmod`, ...).
    #[error("{op}: {source}")]
    Io { op: &'static str, source: io::Error },
    #[error("{op}: {source}")]
    Sys {
        op: &'static str,
        source: nix::errno::Errno,
    },
    #[error("xattr {key}: {source}")]
    Xattr { key: String, source: io::Error },
    #[error(
        "whiteout {0:?} does not name an entry of its directory (refused: it would remove a parent directory)"
    )]
    WhiteoutParent(std::ffi::OsString),
    /// `kind` is `symlink` or `hard link`.
    #[error("{kind} without a target")]
    NoTarget { kind: &'static str },
    #[error("hard link to the layer root")]
    LinkToRoot,
    #[error("hard link to {} which is not in this layer", .0.display())]
    LinkOutside(PathBuf),
    #[error("hard link to a directory")]
    LinkToDir,
    #[error("unsupported tar entry type {0:?}")]
    Unsupported(tar::EntryType),
    /// An archive entry (`raw` as the archive names it) that failed for `source`.
    #[error("entry {raw:?}: {source}")]
    Entry {
        raw: PathBuf,
        source: Box<EntryError>,
    },
    #[error("entry {0:?} is an absolute symlink")]
    AbsoluteSymlink(PathBuf),
    #[error("symlink {0:?} without target")]
    SymlinkWithoutTarget(PathBuf),
    /// A call on an extracted path failed (`create`, `write`, `symlink`).
    #[error("{op} {}: {source}", path.display())]
    Path {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("bad link: {0}")]
    BadLink(io::Error),
    /// What a caller's own entry handler failed with.
    #[error(transparent)]
    Caller(io::Error),
}

impl EntryError {
    /// Maps an I/O error of the step `op`.
    pub(crate) fn io(op: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |source| EntryError::Io { op, source }
    }

    fn sys(op: &'static str) -> impl FnOnce(nix::errno::Errno) -> Self {
        move |source| EntryError::Sys { op, source }
    }

    /// This error, said of the archive entry `raw`.
    pub(crate) fn of_entry(raw: &Path) -> impl FnOnce(Self) -> Self + '_ {
        move |e| EntryError::Entry {
            raw: raw.to_owned(),
            source: Box::new(e),
        }
    }
}

/// The entry's path relative to the layer root; `None` for the root itself.
pub(crate) fn relative(p: &Path) -> Result<Option<PathBuf>, EntryError> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err(EntryError::ParentDir),
            Component::Prefix(_) => return Err(EntryError::Prefix),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Makes sure every parent of `rel` under `root` is a real directory (created if missing),
/// never a symlink, and returns the full path.
pub(crate) fn safe_parent(root: &Path, rel: &Path) -> Result<PathBuf, EntryError> {
    let mut cur = root.to_path_buf();
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            cur.push(c);
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(EntryError::ThroughSymlink(
                        cur.strip_prefix(root).unwrap_or(&cur).to_owned(),
                    ))
                }
                Ok(_) => return Err(EntryError::ParentNotDir(cur)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir(&cur).map_err(EntryError::io("mkdir"))?;
                    fs::set_permissions(&cur, fs::Permissions::from_mode(0o755))
                        .map_err(EntryError::io("chmod"))?;
                }
                Err(e) => return Err(EntryError::io("stat")(e)),
            }
        }
    }
    Ok(root.join(rel))
}

/// Removes whatever is at `path` (not following symlinks).
fn clear(path: &Path) -> Result<(), EntryError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).map_err(EntryError::io("replace dir")),
        Ok(_) => fs::remove_file(path).map_err(EntryError::io("replace")),
        Err(_) => Ok(()),
    }
}

fn apply_entry<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    root: &Path,
    rel: &Path,
    report: &mut UnpackReport,
    dir_times: &mut Vec<(PathBuf, i64)>,
    guard: &TarGuard<'_>,
) -> Result<(), EntryError> {
    let name = rel.file_name().unwrap_or_default().as_bytes();
    let path = safe_parent(root, rel)?;
    let header = entry.header().clone();
    let kind = header.entry_type();

    // Whiteouts.
    if name == OPAQUE_MARKER.as_bytes() {
        let dir = path.parent().expect("a marker has a parent");
        xattr::set(dir, OVERLAY_OPAQUE_XATTR, b"y").map_err(EntryError::io("opaque xattr"))?;
        return Ok(());
    }
    if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
        if hidden.starts_with(WHITEOUT_PREFIX.as_bytes()) {
            // Other aufs metadata (.wh..wh.plnk, ...): no meaning for overlayfs.
            return Ok(());
        }
        // A whiteout hides one entry of its own directory: `.wh.`, `.wh..` and `.wh...`
        // would name the directory itself or its parent.
        if hidden.is_empty() || hidden == b"." || hidden == b".." || hidden.contains(&b'/') {
            return Err(EntryError::WhiteoutParent(
                OsStr::from_bytes(name).to_owned(),
            ));
        }
        let target = path.with_file_name(OsStr::from_bytes(hidden));
        clear(&target)?;
        mknod(&target, SFlag::S_IFCHR, Mode::empty(), 0).map_err(EntryError::sys("whiteout"))?;
        return Ok(());
    }

    let mode = header.mode().map_err(EntryError::io("mode"))? & 0o7777;
    // Empty numeric fields mean 0, as Go's archive/tar (which wrote most layers) reads them.
    let uid = header.uid().unwrap_or(0) as u32;
    let gid = header.gid().unwrap_or(0) as u32;
    let mtime = header.mtime().unwrap_or(0) as i64;

    match kind {
        tar::EntryType::Directory => {
            match fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => {}
                _ => {
                    clear(&path)?;
                    fs::create_dir(&path).map_err(EntryError::io("mkdir"))?;
                }
            }
            dir_times.push((path.clone(), mtime));
        }
        tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
            clear(&path)?;
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .mode(0o600)
                .open(&path)
                .map_err(EntryError::io("create"))?;
            // A sparse file's holes are written as zeros that were never in the stream:
            // they are charged as they are written.
            let mut out = ChargedWriter {
                inner: f,
                guard: (kind == tar::EntryType::GNUSparse).then_some(guard),
            };
            report.content_bytes += io::copy(entry, &mut out).map_err(EntryError::io("write"))?;
        }
        tar::EntryType::Symlink => {
            let target = entry
                .link_name()
                .map_err(EntryError::io("link name"))?
                .ok_or(EntryError::NoTarget { kind: "symlink" })?;
            clear(&path)?;
            symlink(&target, &path).map_err(EntryError::io("symlink"))?;
        }
        tar::EntryType::Link => {
            let target = entry
                .link_name()
                .map_err(EntryError::io("link name"))?
                .ok_or(EntryError::NoTarget { kind: "hard link" })?;
            let target_rel = relative(&target)?.ok_or(EntryError::LinkToRoot)?;
            let target_path = safe_parent(root, &target_rel)?;
            let m = fs::symlink_metadata(&target_path)
                .map_err(|_| EntryError::LinkOutside(target_rel.clone()))?;
            if m.is_dir() {
                return Err(EntryError::LinkToDir);
            }
            clear(&path)?;
            fs::hard_link(&target_path, &path).map_err(EntryError::io("link"))?;
            // A hard link shares the target's inode: its metadata is already set.
            return Ok(());
        }
        tar::EntryType::Fifo => {
            clear(&path)?;
            mknod(&path, SFlag::S_IFIFO, Mode::from_bits_truncate(0o600), 0)
                .map_err(EntryError::sys("mkfifo"))?;
        }
        tar::EntryType::Char | tar::EntryType::Block => {
            report.skipped_devices += 1;
            return Ok(());
        }
        tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => return Ok(()),
        other => return Err(EntryError::Unsupported(other)),
    }

    let mut xattrs = pax_xattrs(entry);
    // Rootless (an ordinary user's store): every file is the user's own, which a rootless
    // sandbox maps to its root; ownership and the xattrs only root may set are not kept.
    if nix::unistd::geteuid().is_root() {
        lchown(&path, Some(uid), Some(gid)).map_err(EntryError::io("chown"))?;
    } else {
        xattrs.retain(|(k, _)| k.starts_with("user."));
    }
    if kind != tar::EntryType::Symlink {
        // After chown, which clears set-id bits.
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .map_err(EntryError::io("chmod"))?;
        for (k, v) in xattrs {
            xattr::set(&path, &k, &v).map_err(|source| EntryError::Xattr { key: k, source })?;
        }
        if kind != tar::EntryType::Directory {
            set_mtime(&path, mtime);
        }
    }
    Ok(())
}

/// A file being written, charging what it writes to the guard when it has one.
struct ChargedWriter<'g, 'b> {
    inner: File,
    guard: Option<&'g TarGuard<'b>>,
}

impl io::Write for ChargedWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(g) = self.guard {
            g.charge_written(buf.len() as u64)?;
        }
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The xattrs a PAX header carries that a layer may set: `user.*` and file capabilities.
/// (`trusted.*` and `security.*` others would be host-level metadata, never taken from a tar.)
fn pax_xattrs<R: Read>(entry: &mut tar::Entry<'_, R>) -> Vec<(String, Vec<u8>)> {
    let Ok(Some(exts)) = entry.pax_extensions() else {
        return Vec::new();
    };
    exts.filter_map(Result::ok)
        .filter_map(|e| {
            let key = e.key().ok()?.strip_prefix("SCHILY.xattr.")?.to_owned();
            (key.starts_with("user.") || key == "security.capability")
                .then(|| (key, e.value_bytes().to_vec()))
        })
        .collect()
}

fn set_mtime(path: &Path, secs: i64) {
    let t = nix::sys::time::TimeSpec::new(secs, 0);
    // Times are cosmetic for overlayfs and builds; a file keeps the time it was written.
    let _ = nix::sys::stat::utimensat(
        None,
        path,
        &t,
        &t,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    );
}

/// Unpacked layers, by diff id: `<root>/layers/<hex>/fs`.
#[derive(Debug, Clone)]
pub struct LayerStore {
    dir: PathBuf,
    tmp: PathBuf,
}

impl LayerStore {
    pub fn open(root: &Path) -> Result<Self, ImageError> {
        let dir = root.join("layers");
        let tmp = root.join("tmp");
        for d in [&dir, &tmp] {
            fs::create_dir_all(d).map_err(ImageError::io("create", d))?;
        }
        Ok(LayerStore { dir, tmp })
    }

    /// The directory overlayfs uses for a layer.
    pub fn fs_path(&self, diff_id: &str) -> Result<PathBuf, ImageError> {
        Ok(self.dir.join(hex_of(diff_id)?).join("fs"))
    }

    /// Unpacks the blob `blob_digest` as layer `diff_id` unless it is there already,
    /// charging `budget`.
    pub fn ensure(
        &self,
        blobs: &BlobStore,
        blob_digest: &str,
        diff_id: &str,
        budget: &Budget,
        tick: &Tick<'_>,
    ) -> Result<UnpackReport, ImageError> {
        let fs_path = self.fs_path(diff_id)?;
        if fs_path.is_dir() {
            return Ok(UnpackReport {
                diff_id: diff_id.to_owned(),
                ..UnpackReport::default()
            });
        }
        let tmp = temp_path(&self.tmp, "layer");
        let result = (|| {
            let staged = tmp.join("fs");
            fs::create_dir_all(&staged).map_err(ImageError::io("create", &staged))?;
            fs::set_permissions(&staged, fs::Permissions::from_mode(0o755))
                .map_err(ImageError::io("chmod", &staged))?;
            let blob = tick.reader(blobs.open_blob(blob_digest)?);
            let report = unpack(blob, &staged, blob_digest, budget)?;
            if report.diff_id != diff_id {
                return Err(ImageError::DigestMismatch {
                    what: format!("layer {blob_digest} (uncompressed)"),
                    expected: diff_id.to_owned(),
                    actual: report.diff_id,
                });
            }
            let dst = fs_path.parent().expect("layer dir").to_path_buf();
            match fs::rename(&tmp, &dst) {
                Ok(()) => Ok(report),
                // Another process unpacked it first: theirs is as good as ours.
                Err(_) if fs_path.is_dir() => Ok(report),
                Err(e) => Err(ImageError::io("rename", &tmp)(e)),
            }
        })();
        // Best effort: a leftover in tmp/ is swept by the next garbage collection.
        let _ = fs::remove_dir_all(&tmp);
        result
    }

    /// Every stored layer's diff id.
    pub fn list(&self) -> Result<Vec<String>, ImageError> {
        crate::digest::digests_named_in(&self.dir)
    }

    /// Whether a sandbox holds a lease on a layer (it has it mounted).
    pub fn is_leased(&self, diff_id: &str) -> bool {
        let Ok(p) = self.fs_path(diff_id) else {
            return false;
        };
        let Ok(dir) = File::open(&p) else {
            return false;
        };
        Flock::lock(dir, FlockArg::LockExclusiveNonblock).is_err()
    }

    /// Removes a layer unless a sandbox holds a lease on it. Returns whether it was removed.
    pub fn remove_unless_leased(&self, diff_id: &str) -> Result<bool, ImageError> {
        let fs_path = self.fs_path(diff_id)?;
        let dir = File::open(&fs_path).map_err(ImageError::io("open", &fs_path))?;
        let Ok(lock) = Flock::lock(dir, FlockArg::LockExclusiveNonblock) else {
            return Ok(false);
        };
        // Renamed away first (under the lock), so a sandbox starting now cannot find it.
        let layer_dir = fs_path.parent().expect("layer dir");
        let doomed = temp_path(&self.tmp, "rm-layer");
        fs::rename(layer_dir, &doomed).map_err(ImageError::io("rename", layer_dir))?;
        drop(lock);
        fs::remove_dir_all(&doomed).map_err(ImageError::io("remove", &doomed))?;
        Ok(true)
    }

    /// Apparent size of a layer's files (for `image ls`), in bytes.
    pub fn size(&self, diff_id: &str) -> u64 {
        self.fs_path(diff_id).map(|p| tree_size(&p)).unwrap_or(0)
    }
}

pub(crate) fn tree_size(p: &Path) -> u64 {
    let Ok(m) = fs::symlink_metadata(p) else {
        return 0;
    };
    if m.is_dir() {
        fs::read_dir(p)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| tree_size(&e.path()))
                    .sum()
            })
            .unwrap_or(0)
    } else {
        m.len()
    }
}

/// Shared locks on a sandbox's layers, held for the sandbox's life.
#[derive(Debug, Default)]
pub struct LayerLease {
    _locks: Vec<Flock<File>>,
}

impl LayerLease {
    pub(crate) fn take(layers: &[PathBuf]) -> Result<Self, ImageError> {
        let mut locks = Vec::with_capacity(layers.len());
        for l in layers {
            let dir = File::open(l).map_err(ImageError::io("open layer", l))?;
            let lock = Flock::lock(dir, FlockArg::LockSharedNonblock)
                .map_err(|(_, e)| ImageError::io("lock layer", l)(e.into()))?;
            locks.push(lock);
        }
        Ok(LayerLease { _locks: locks })
    }
}

/// Writes a directory tree as an uncompressed layer tar (used to make an image from a root
/// filesystem directory). Sockets and device nodes are left out.
pub fn tar_dir(src: &Path, out: &mut dyn io::Write) -> io::Result<()> {
    TreeTar {
        ids: None,
        overlay: false,
    }
    .write(src, out)
}

/// How a sandbox's host ids become image ids: `(inside, host, count)` ranges (a user
/// namespace's `uid_map`/`gid_map` lines), for uids and for gids. Any other host id is
/// written as 65534 (nobody).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdMap {
    pub uids: Vec<(u32, u32, u32)>,
    pub gids: Vec<(u32, u32, u32)>,
}

impl IdMap {
    /// Host ids `[base, base + count)` are `0..count` (root's sandboxes), for both.
    pub fn range(base: u32, count: u32) -> IdMap {
        IdMap {
            uids: vec![(0, base, count)],
            gids: vec![(0, base, count)],
        }
    }

    fn map(ranges: &[(u32, u32, u32)], host: u32) -> u64 {
        ranges
            .iter()
            .find(|(_, h, n)| host >= *h && host - h < *n)
            .map_or(65534, |(inside, h, _)| u64::from(inside + (host - h)))
    }

    /// The image uid of host uid `host`.
    pub fn uid(&self, host: u32) -> u64 {
        Self::map(&self.uids, host)
    }

    /// The image gid of host gid `host`.
    pub fn gid(&self, host: u32) -> u64 {
        Self::map(&self.gids, host)
    }
}

/// Writes an overlayfs upper directory (what a sandbox changed) as an OCI layer tar:
/// whiteouts (0:0 char devices) become `.wh.NAME`, opaque directories get `.wh..wh..opq`,
/// overlayfs' own xattrs are dropped, and owners in the sandbox's id range
/// `[base, base+len)` are shifted back to image ids (anything else becomes 65534, nobody).
pub fn tar_upper(upper: &Path, base: u32, len: u32, out: &mut dyn io::Write) -> io::Result<()> {
    tar_upper_mapped(upper, &IdMap::range(base, len), out)
}

/// [`tar_upper`] with the sandbox's id mapping given whole (a rootless sandbox's: the user
/// is root, its subordinate ids `1..`).
pub fn tar_upper_mapped(upper: &Path, ids: &IdMap, out: &mut dyn io::Write) -> io::Result<()> {
    TreeTar {
        ids: Some(ids.clone()),
        overlay: true,
    }
    .write(upper, out)
}

/// The entries of `dir` in name order, each as its path, its name under `rel` and its own
/// metadata (a symlink's, not its target's), read as the caller reaches it: the order a tree
/// is written into a tar in, so that the same tree always makes the same bytes (and digest),
/// whatever order the filesystem lists it in.
pub fn sorted_entries(
    dir: &Path,
    rel: &Path,
) -> io::Result<impl Iterator<Item = io::Result<(PathBuf, PathBuf, fs::Metadata)>>> {
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    let rel = rel.to_owned();
    Ok(entries.into_iter().map(move |e| {
        let path = e.path();
        let m = fs::symlink_metadata(&path)?;
        Ok((path, rel.join(e.file_name()), m))
    }))
}

/// One way of turning a directory tree into a layer tar.
struct TreeTar {
    /// Shift owners from the sandbox's host ids back to image ids.
    ids: Option<IdMap>,
    /// The tree is an overlayfs upper dir.
    overlay: bool,
}

impl TreeTar {
    fn write(&self, src: &Path, out: &mut dyn io::Write) -> io::Result<()> {
        let mut b = tar::Builder::new(out);
        b.follow_symlinks(false);
        let mut hardlinks = HashMap::new();
        self.append_children(&mut b, src, Path::new(""), &mut hardlinks)?;
        b.finish()
    }

    fn uid(&self, host: u32) -> u64 {
        self.ids.as_ref().map_or(u64::from(host), |m| m.uid(host))
    }

    fn gid(&self, host: u32) -> u64 {
        self.ids.as_ref().map_or(u64::from(host), |m| m.gid(host))
    }

    fn header(&self, m: &fs::Metadata, kind: tar::EntryType) -> tar::Header {
        use std::os::unix::fs::MetadataExt;
        let mut h = tar::Header::new_gnu();
        h.set_metadata_in_mode(m, tar::HeaderMode::Complete);
        h.set_entry_type(kind);
        h.set_uid(self.uid(m.uid()));
        h.set_gid(self.gid(m.gid()));
        h.set_size(0);
        h
    }

    fn empty_file(b: &mut tar::Builder<&mut dyn io::Write>, name: &Path) -> io::Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(0);
        b.append_data(&mut h, name, io::empty())
    }

    fn append_children(
        &self,
        b: &mut tar::Builder<&mut dyn io::Write>,
        dir: &Path,
        rel: &Path,
        hardlinks: &mut HashMap<(u64, u64), PathBuf>,
    ) -> io::Result<()> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        for entry in sorted_entries(dir, rel)? {
            let (path, name, m) = entry?;
            let ft = m.file_type();
            if self.overlay && ft.is_char_device() && m.rdev() == 0 {
                let mut wh = std::ffi::OsString::from(WHITEOUT_PREFIX);
                wh.push(name.file_name().unwrap_or_default());
                Self::empty_file(b, &rel.join(wh))?;
            } else if ft.is_dir() {
                let mut h = self.header(&m, tar::EntryType::Directory);
                b.append_data(&mut h, &name, io::empty())?;
                if self.overlay
                    && [OVERLAY_OPAQUE_XATTR, OVERLAY_USER_OPAQUE_XATTR]
                        .iter()
                        .any(|x| xattr::get(&path, x).ok().flatten().as_deref() == Some(b"y"))
                {
                    Self::empty_file(b, &name.join(OPAQUE_MARKER))?;
                }
                self.append_children(b, &path, &name, hardlinks)?;
            } else if ft.is_symlink() {
                let mut h = self.header(&m, tar::EntryType::Symlink);
                b.append_link(&mut h, &name, fs::read_link(&path)?)?;
            } else if ft.is_file() {
                if m.nlink() > 1 {
                    if let Some(first) = hardlinks.get(&(m.dev(), m.ino())) {
                        let mut h = self.header(&m, tar::EntryType::Link);
                        b.append_link(&mut h, &name, first)?;
                        continue;
                    }
                    hardlinks.insert((m.dev(), m.ino()), name.clone());
                }
                let mut h = self.header(&m, tar::EntryType::Regular);
                h.set_size(m.len());
                b.append_data(&mut h, &name, File::open(&path)?)?;
            } else if ft.is_fifo() {
                let mut h = self.header(&m, tar::EntryType::Fifo);
                b.append_data(&mut h, &name, io::empty())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    #[test]
    fn id_maps_shift_each_range_and_the_rest_is_nobody() {
        // A rootless sandbox's: the user (1000) is root, its subordinate ids are 1..
        let m = IdMap {
            uids: vec![(0, 1000, 1), (1, 100000, 65536)],
            gids: vec![(0, 1001, 1)],
        };
        assert_eq!((m.uid(1000), m.uid(100000), m.uid(100999)), (0, 1, 1000));
        assert_eq!(
            (m.uid(0), m.uid(1001), m.uid(165536)),
            (65534, 65534, 65534)
        );
        assert_eq!((m.gid(1001), m.gid(1000)), (0, 65534));
        let r = IdMap::range(2_000_000, 65536);
        assert_eq!(
            (r.uid(2_000_000), r.gid(2_065_535), r.uid(2_065_536)),
            (0, 65535, 65534)
        );
    }

    /// The limit `err` says was hit, if it is a limit's error.
    fn limit_of(err: &ImageError) -> Option<crate::Limit> {
        match err {
            ImageError::Limit { limit, .. } => Some(*limit),
            _ => None,
        }
    }

    fn up(tar: &[u8], dest: &Path) -> Result<UnpackReport, ImageError> {
        unpack(tar, dest, "t", &Budget::new(Default::default()))
    }

    /// A tar built entry by entry (paths set raw, so malicious names survive).
    struct TarBuilder(tar::Builder<Vec<u8>>);

    impl TarBuilder {
        fn new() -> Self {
            TarBuilder(tar::Builder::new(Vec::new()))
        }
        fn header(kind: tar::EntryType, path: &str, size: u64) -> tar::Header {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(if kind == tar::EntryType::Directory {
                0o755
            } else {
                0o644
            });
            h.set_uid(0);
            h.set_gid(0);
            h.set_size(size);
            // Raw bytes: the tar crate's set_path refuses '..'.
            let name = &mut h.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            h.set_cksum();
            h
        }
        fn file(mut self, path: &str, data: &str) -> Self {
            let h = Self::header(tar::EntryType::Regular, path, data.len() as u64);
            self.0.append(&h, data.as_bytes()).unwrap();
            self
        }
        /// A file with a path of any length (a GNU long name when it needs one).
        fn file_long(mut self, path: &str, data: &str) -> Self {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            self.0.append_data(&mut h, path, data.as_bytes()).unwrap();
            self
        }
        fn dir(mut self, path: &str) -> Self {
            let h = Self::header(tar::EntryType::Directory, path, 0);
            self.0.append(&h, &[][..]).unwrap();
            self
        }
        fn link(mut self, kind: tar::EntryType, path: &str, target: &str) -> Self {
            let mut h = Self::header(kind, path, 0);
            h.set_link_name(target).unwrap();
            h.set_cksum();
            self.0.append(&h, &[][..]).unwrap();
            self
        }
        fn device(mut self, path: &str) -> Self {
            let mut h = Self::header(tar::EntryType::Char, path, 0);
            h.set_device_major(1).unwrap();
            h.set_device_minor(3).unwrap();
            h.set_cksum();
            self.0.append(&h, &[][..]).unwrap();
            self
        }
        fn bytes(self) -> Vec<u8> {
            self.0.into_inner().unwrap()
        }
    }

    #[test]
    fn whiteouts_become_overlay_whiteouts() {
        let d = test_dir("layer-wh");
        let tar = TarBuilder::new()
            .dir("etc/")
            .file("etc/.wh.motd", "")
            .dir("opt/")
            .file("opt/.wh..wh..opq", "")
            .file("opt/new", "n")
            .bytes();
        up(&tar, &d).unwrap();
        let m = fs::symlink_metadata(d.join("etc/motd")).unwrap();
        assert!(m.file_type().is_char_device());
        assert_eq!(m.rdev(), 0);
        assert!(!d.join("etc/.wh.motd").exists());
        assert_eq!(
            xattr::get(d.join("opt"), OVERLAY_OPAQUE_XATTR).unwrap(),
            Some(b"y".to_vec())
        );
        assert!(!d.join("opt/.wh..wh..opq").exists());
        assert_eq!(fs::read_to_string(d.join("opt/new")).unwrap(), "n");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn whiteouts_of_the_directory_itself_or_its_parent_are_refused() {
        // The layer is unpacked into base/fs; base/sentinel stands for what lies beside it.
        for (what, tar) in [
            (
                ".wh..",
                TarBuilder::new()
                    .dir("d/")
                    .file("d/keep", "k")
                    .file("d/.wh..", ""),
            ),
            (
                ".wh...",
                TarBuilder::new()
                    .dir("d/")
                    .file("d/keep", "k")
                    .file("d/.wh...", ""),
            ),
            ("top .wh...", TarBuilder::new().file(".wh...", "")),
            (
                ".wh.",
                TarBuilder::new()
                    .dir("d/")
                    .file("d/keep", "k")
                    .file("d/.wh.", ""),
            ),
        ] {
            let base = test_dir("layer-badwh");
            let dest = base.join("fs");
            fs::create_dir(&dest).unwrap();
            fs::write(base.join("sentinel"), "s").unwrap();
            let err = up(&tar.bytes(), &dest).unwrap_err().to_string();
            assert!(
                err.contains("does not name an entry of its directory"),
                "{what}: {err}"
            );
            assert!(base.join("sentinel").exists(), "{what}: removed a parent");
            if what != "top .wh..." {
                assert_eq!(
                    fs::read_to_string(dest.join("d/keep")).unwrap(),
                    "k",
                    "{what}"
                );
            }
            fs::remove_dir_all(&base).unwrap();
        }
    }

    /// A zstd frame: `prefix` in raw blocks, then `zeros` zero bytes in RLE blocks (4 bytes
    /// per 128 KiB: a 32768:1 expansion, as a bomb would use).
    pub(crate) fn zstd_rle_frame(prefix: &[u8], zeros: u64) -> Vec<u8> {
        assert!(zeros > 0);
        // Magic, frame header descriptor (no size, no checksum), window 1 MiB.
        let mut f = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x50];
        let block = |f: &mut Vec<u8>, last: bool, kind: u32, size: u64| {
            let h = u32::from(last) | (kind << 1) | ((size as u32) << 3);
            f.extend_from_slice(&h.to_le_bytes()[..3]);
        };
        for chunk in prefix.chunks(128 << 10) {
            block(&mut f, false, 0, chunk.len() as u64);
            f.extend_from_slice(chunk);
        }
        let mut left = zeros;
        while left > 0 {
            let n = left.min(128 << 10);
            left -= n;
            block(&mut f, left == 0, 1, n);
            f.push(0);
        }
        f
    }

    /// A tar whose one file is `size` zero bytes, as a zstd frame of RLE blocks.
    fn zstd_bomb(size: u64) -> Vec<u8> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_path("zeros").unwrap();
        h.set_mode(0o644);
        h.set_size(size);
        h.set_cksum();
        zstd_rle_frame(h.as_bytes(), size + 1024)
    }

    #[test]
    fn a_zstd_bomb_is_refused_by_its_expansion_ratio_and_leaves_a_partial_file_only() {
        // 1 TiB declared; refused once it has unpacked 64 MiB.
        let bomb = zstd_bomb(1 << 40);
        assert!(bomb.len() < 40 << 20);
        let d = test_dir("layer-zbomb");
        let err = up(&bomb, &d).unwrap_err();
        assert_eq!(limit_of(&err), Some(crate::Limit::Ratio), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("max_ratio") && msg.contains("--max-ratio"),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "one line: {msg}");
        assert!(fs::metadata(d.join("zeros")).unwrap().len() <= 80 << 20);
        // With the ratio off, the byte limit stops it.
        let limits = crate::UnpackLimits {
            max_ratio: 0,
            max_bytes: 96 << 20,
            ..Default::default()
        };
        let d2 = test_dir("layer-zbomb2");
        let err = unpack(&bomb[..], &d2, "t", &Budget::new(limits)).unwrap_err();
        assert_eq!(limit_of(&err), Some(crate::Limit::Bytes), "{err}");
        // A legitimate zero-filled file under the floor unpacks (and hashes) fine.
        let small = zstd_bomb(8 << 20);
        let d3 = test_dir("layer-zsmall");
        up(&small, &d3).unwrap();
        assert_eq!(fs::metadata(d3.join("zeros")).unwrap().len(), 8 << 20);
        for p in [d, d2, d3] {
            fs::remove_dir_all(p).unwrap();
        }
    }

    #[test]
    fn entries_and_depth_are_limited() {
        let mut t = TarBuilder::new();
        for i in 0..50 {
            t = t.file(&format!("f{i}"), "");
        }
        let tar = t.bytes();
        let limits = crate::UnpackLimits {
            max_entries: 20,
            ..Default::default()
        };
        let d = test_dir("layer-entries");
        let err = unpack(&tar[..], &d, "t", &Budget::new(limits)).unwrap_err();
        assert_eq!(limit_of(&err), Some(crate::Limit::Entries), "{err}");
        let deep = "a/".repeat(40) + "f";
        let tar = TarBuilder::new().file_long(&deep, "x").bytes();
        let limits = crate::UnpackLimits {
            max_depth: 16,
            ..Default::default()
        };
        let err = unpack(&tar[..], &d, "t", &Budget::new(limits)).unwrap_err();
        assert_eq!(limit_of(&err), Some(crate::Limit::Depth), "{err}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn dotdot_paths_are_refused() {
        let d = test_dir("layer-dotdot");
        let tar = TarBuilder::new().file("../../escaped", "x").bytes();
        let err = up(&tar, &d).unwrap_err().to_string();
        assert!(err.contains("'..'"), "{err}");
        assert!(!d.parent().unwrap().join("escaped").exists());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn writes_through_symlinks_are_refused() {
        let d = test_dir("layer-symlink");
        let outside = test_dir("layer-symlink-outside");
        let tar = TarBuilder::new()
            .link(tar::EntryType::Symlink, "evil", outside.to_str().unwrap())
            .file("evil/pwned", "x")
            .bytes();
        let err = up(&tar, &d).unwrap_err().to_string();
        assert!(err.contains("symlink"), "{err}");
        assert!(!outside.join("pwned").exists());
        // Absolute symlinks themselves are kept as they are (they resolve inside a sandbox).
        let tar = TarBuilder::new()
            .link(tar::EntryType::Symlink, "abs", "/etc/passwd")
            .bytes();
        let d2 = test_dir("layer-symlink2");
        up(&tar, &d2).unwrap();
        assert_eq!(
            fs::read_link(d2.join("abs")).unwrap(),
            Path::new("/etc/passwd")
        );
        for p in [d, d2, outside] {
            fs::remove_dir_all(p).unwrap();
        }
    }

    #[test]
    fn hard_links_stay_inside_the_layer_and_devices_are_skipped() {
        let d = test_dir("layer-hard");
        let tar = TarBuilder::new()
            .file("a", "data")
            .link(tar::EntryType::Link, "b", "a")
            .device("dev/null")
            .bytes();
        let r = up(&tar, &d).unwrap();
        assert_eq!(r.skipped_devices, 1);
        assert!(!d.join("dev/null").exists());
        let (a, b) = (
            fs::metadata(d.join("a")).unwrap(),
            fs::metadata(d.join("b")).unwrap(),
        );
        assert_eq!(a.ino(), b.ino());
        let tar = TarBuilder::new()
            .link(tar::EntryType::Link, "shadow", "/etc/shadow")
            .bytes();
        let d2 = test_dir("layer-hard2");
        let err = up(&tar, &d2).unwrap_err().to_string();
        assert!(err.contains("not in this layer"), "{err}");
        let tar = TarBuilder::new()
            .link(tar::EntryType::Link, "up", "../x")
            .bytes();
        assert!(up(&tar, &d2).is_err());
        fs::remove_dir_all(&d).unwrap();
        fs::remove_dir_all(&d2).unwrap();
    }

    #[test]
    fn tar_upper_turns_overlay_markers_into_oci_whiteouts() {
        use std::os::unix::fs::lchown;
        let upper = test_dir("layer-upper");
        fs::write(upper.join("new"), "n").unwrap();
        lchown(upper.join("new"), Some(100_000_007), Some(100_000_008)).unwrap();
        fs::write(upper.join("foreign"), "f").unwrap();
        lchown(upper.join("foreign"), Some(5), Some(5)).unwrap();
        mknod(&upper.join("gone"), SFlag::S_IFCHR, Mode::empty(), 0).unwrap();
        fs::create_dir(upper.join("opq")).unwrap();
        xattr::set(upper.join("opq"), OVERLAY_OPAQUE_XATTR, b"y").unwrap();
        let mut tar = Vec::new();
        tar_upper(&upper, 100_000_000, 65536, &mut tar).unwrap();
        let mut names = Vec::new();
        for e in tar::Archive::new(&tar[..]).entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            names.push((
                e.path().unwrap().display().to_string(),
                h.uid().unwrap(),
                h.gid().unwrap(),
            ));
        }
        assert_eq!(
            names,
            vec![
                ("foreign".to_string(), 65534, 65534),
                (".wh.gone".to_string(), 0, 0),
                ("new".to_string(), 7, 8),
                ("opq".to_string(), 65534, 65534),
                ("opq/.wh..wh..opq".to_string(), 0, 0),
            ]
        );
        // Unpacked again, the markers are overlay markers.
        let d = test_dir("layer-upper-back");
        up(&tar, &d).unwrap();
        assert!(fs::symlink_metadata(d.join("gone"))
            .unwrap()
            .file_type()
            .is_char_device());
        fs::remove_dir_all(&upper).unwrap();
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn tar_dir_round_trips_with_the_same_diff_id() {
        let src = test_dir("layer-src");
        fs::create_dir_all(src.join("bin")).unwrap();
        fs::write(src.join("bin/tool"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(src.join("bin/tool"), fs::Permissions::from_mode(0o4755)).unwrap();
        fs::hard_link(src.join("bin/tool"), src.join("bin/tool2")).unwrap();
        symlink("tool", src.join("bin/alias")).unwrap();
        let mut tar = Vec::new();
        tar_dir(&src, &mut tar).unwrap();
        let dst = test_dir("layer-dst");
        let r = up(&tar, &dst).unwrap();
        assert_eq!(r.diff_id, crate::digest::of_bytes(&tar));
        let m = fs::metadata(dst.join("bin/tool")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o4755);
        assert_eq!(m.ino(), fs::metadata(dst.join("bin/tool2")).unwrap().ino());
        assert_eq!(
            fs::read_link(dst.join("bin/alias")).unwrap(),
            Path::new("tool")
        );
        fs::remove_dir_all(&src).unwrap();
        fs::remove_dir_all(&dst).unwrap();
    }
}
