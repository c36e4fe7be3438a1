//! Frozen layers: a copy of a live sandbox's overlayfs upper directory, kept in the upper
//! form it has (whiteouts as 0/0 character devices, opaque directories as
//! `user.overlay.opaque`, files owned by the host ids of the sandbox range), so that it can
//! be a read-only *lower* layer of other sandboxes' overlays (a fork's copies: each cell's
//! overlay is `lowerdir=<frozen layers>:<the shell's root>` with an upper of its own).
//!
//! This module owns the copy ([`freeze_upper`]). Where layers are kept (a directory of the
//! daemon's state dir, emptied at its start), reading the upper while it does not change
//! (the sandbox frozen) and keeping a layer until its last user is gone are the pool's
//! (`agentrun_pool::snapshot::freeze`).
//!
//! What is copied: directories, regular files (data, hard links kept as links), symlinks,
//! fifos, sockets and whiteouts, each with its owner, mode and mtime, and its xattrs but the
//! overlay's bookkeeping of an upper (`user.overlay.origin`, `impure`, `nlink`...), which has
//! no meaning in a lower layer: only `user.overlay.opaque`, the xattr whiteout markers and
//! escaped user xattrs (`user.overlay.overlay.*`) are overlay xattrs a lower layer keeps.
//! Other device nodes are not copied (no cell can make one). Nothing is followed: the walk
//! uses `lstat` and the upper is frozen, so no path changes under it.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::ImageError;

/// Overlay xattrs of an upper directory that keep their meaning in a lower layer.
fn keep_xattr(name: &[u8]) -> bool {
    match name.strip_prefix(b"user.overlay.") {
        None => !name.starts_with(b"trusted.overlay."),
        Some(rest) => {
            matches!(rest, b"opaque" | b"whiteout" | b"whiteouts") || rest.starts_with(b"overlay.")
        }
    }
}

/// What [`copy_upper`] made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrozenCopy {
    /// Apparent bytes of its regular files.
    pub bytes: u64,
    /// Entries copied (the root not counted).
    pub entries: u64,
}

/// Copies the overlay upper directory `src` (a path the host can read, such as
/// `/proc/self/fd/N`) to `dst`, which must not exist (the cells reach it through a mount;
/// host users not at all: it is made under a directory of mode 0700). On failure the caller
/// removes `dst`.
pub fn copy_upper(src: &Path, dst: &Path) -> Result<FrozenCopy, ImageError> {
    let mut out = FrozenCopy::default();
    let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let meta = fs::symlink_metadata(src).map_err(ImageError::io("reading", src))?;
    fs::create_dir(dst).map_err(ImageError::io("creating", dst))?;
    copy_dir(src, dst, &mut out, &mut links)?;
    finish(src, dst, &meta)?;
    Ok(out)
}

fn copy_dir(
    src: &Path,
    dst: &Path,
    out: &mut FrozenCopy,
    links: &mut HashMap<(u64, u64), PathBuf>,
) -> Result<(), ImageError> {
    for entry in fs::read_dir(src).map_err(ImageError::io("reading", src))? {
        let entry = entry.map_err(ImageError::io("reading", src))?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let meta = fs::symlink_metadata(&from).map_err(ImageError::io("reading", &from))?;
        let ft = meta.file_type();
        out.entries += 1;
        if ft.is_dir() {
            fs::create_dir(&to).map_err(ImageError::io("creating", &to))?;
            copy_dir(&from, &to, out, links)?;
            finish(&from, &to, &meta)?;
            continue;
        }
        if !ft.is_dir() && meta.nlink() > 1 {
            if let Some(first) = links.get(&(meta.dev(), meta.ino())) {
                fs::hard_link(first, &to).map_err(ImageError::io("linking", &to))?;
                continue;
            }
            links.insert((meta.dev(), meta.ino()), to.clone());
        }
        if ft.is_file() {
            let mut r = fs::File::open(&from).map_err(ImageError::io("reading", &from))?;
            let mut w = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&to)
                .map_err(ImageError::io("creating", &to))?;
            io::copy(&mut r, &mut w).map_err(ImageError::io("copying", &from))?;
            out.bytes += meta.len();
        } else if ft.is_symlink() {
            let target = fs::read_link(&from).map_err(ImageError::io("reading", &from))?;
            std::os::unix::fs::symlink(&target, &to).map_err(ImageError::io("creating", &to))?;
        } else if ft.is_char_device() && meta.rdev() == 0 {
            // A whiteout.
            mknod(&to, libc::S_IFCHR, 0)?;
        } else if ft.is_fifo() {
            mknod(&to, libc::S_IFIFO, 0)?;
        } else if ft.is_socket() {
            mknod(&to, libc::S_IFSOCK, 0)?;
        } else {
            // A device node: no cell can make one; not carried.
            out.entries -= 1;
            continue;
        }
        finish(&from, &to, &meta)?;
    }
    Ok(())
}

fn mknod(path: &Path, kind: libc::mode_t, dev: libc::dev_t) -> Result<(), ImageError> {
    nix::sys::stat::mknod(
        path,
        nix::sys::stat::SFlag::from_bits_truncate(kind),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        dev,
    )
    .map_err(|e| ImageError::Io {
        context: "creating",
        path: path.to_owned(),
        source: e.into(),
    })
}

/// Owner, xattrs, mode and mtime of `to` as `from` has them (in that order: a chown clears
/// set-id bits, which the mode then sets again).
fn finish(from: &Path, to: &Path, meta: &fs::Metadata) -> Result<(), ImageError> {
    std::os::unix::fs::lchown(to, Some(meta.uid()), Some(meta.gid()))
        .map_err(ImageError::io("chown", to))?;
    let symlink = meta.file_type().is_symlink();
    if let Ok(names) = xattr::list(from) {
        for name in names {
            if !keep_xattr(name.as_encoded_bytes()) {
                continue;
            }
            if let Ok(Some(value)) = xattr::get(from, &name) {
                xattr::set(to, &name, &value).map_err(ImageError::io("xattr", to))?;
            }
        }
    }
    if !symlink {
        fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(ImageError::io("chmod", to))?;
    }
    let mtime = nix::sys::time::TimeSpec::new(meta.mtime(), meta.mtime_nsec());
    let atime = nix::sys::time::TimeSpec::new(meta.atime(), meta.atime_nsec());
    nix::sys::stat::utimensat(
        None,
        to,
        &atime,
        &mtime,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .map_err(|e| ImageError::Io {
        context: "utimensat",
        path: to.to_owned(),
        source: e.into(),
    })
}

/// Copies `upper` into a new frozen layer `parent/name` (`parent` made mode 0700 if
/// missing), refused over `max_bytes` before anything is written
/// ([`ImageError::SnapshotTooLarge`]); nothing is left of a failed copy.
pub fn freeze_upper(
    parent: &Path,
    upper: &Path,
    name: &str,
    max_bytes: Option<u64>,
) -> Result<(PathBuf, FrozenCopy), ImageError> {
    if let Some(max) = max_bytes {
        let bytes = crate::snapshot::tree_bytes(upper);
        if bytes > max {
            return Err(ImageError::SnapshotTooLarge { bytes, max });
        }
    }
    fs::create_dir_all(parent).map_err(ImageError::io("creating", parent))?;
    fs::set_permissions(parent, fs::Permissions::from_mode(0o700))
        .map_err(ImageError::io("chmod", parent))?;
    let dst = parent.join(name);
    match copy_upper(upper, &dst) {
        Ok(c) => Ok((dst, c)),
        Err(e) => {
            // Best effort: a leftover in the frozen dir is swept by the daemon at its next start.
            let _ = fs::remove_dir_all(&dst);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_bookkeeping_is_dropped_and_markers_kept() {
        assert!(keep_xattr(b"user.overlay.opaque"));
        assert!(keep_xattr(b"user.overlay.whiteout"));
        assert!(keep_xattr(b"user.overlay.overlay.mine"));
        assert!(keep_xattr(b"user.mine"));
        assert!(keep_xattr(b"security.capability"));
        assert!(!keep_xattr(b"user.overlay.origin"));
        assert!(!keep_xattr(b"user.overlay.impure"));
        assert!(!keep_xattr(b"trusted.overlay.origin"));
    }

    #[test]
    fn an_upper_is_copied_with_its_whiteouts_opaque_dirs_links_and_modes() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (mknod of a whiteout)");
            return;
        }
        let t = std::env::temp_dir().join(format!("agentrun-frozen-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&t);
        let up = t.join("up");
        fs::create_dir_all(up.join("d/e")).unwrap();
        fs::write(up.join("d/f"), b"data").unwrap();
        fs::hard_link(up.join("d/f"), up.join("d/g")).unwrap();
        std::os::unix::fs::symlink("../nowhere", up.join("d/l")).unwrap();
        mknod(&up.join("gone"), libc::S_IFCHR, 0).unwrap();
        xattr::set(up.join("d/e"), "user.overlay.opaque", b"y").unwrap();
        xattr::set(up.join("d"), "user.overlay.impure", b"y").unwrap();
        std::os::unix::fs::lchown(up.join("d/f"), Some(100_000_123), Some(100_000_007)).unwrap();
        // After the chown (which clears set-id bits).
        fs::set_permissions(up.join("d/f"), fs::Permissions::from_mode(0o4750)).unwrap();
        let dst = t.join("frozen");
        let c = copy_upper(&up, &dst).unwrap();
        assert_eq!(c.bytes, 4);
        let m = fs::symlink_metadata(dst.join("gone")).unwrap();
        assert!(m.file_type().is_char_device() && m.rdev() == 0);
        assert_eq!(
            xattr::get(dst.join("d/e"), "user.overlay.opaque").unwrap(),
            Some(b"y".to_vec())
        );
        assert_eq!(
            xattr::get(dst.join("d"), "user.overlay.impure").unwrap(),
            None
        );
        let f = fs::metadata(dst.join("d/f")).unwrap();
        assert_eq!(
            (f.uid(), f.gid(), f.mode() & 0o7777),
            (100_000_123, 100_000_007, 0o4750)
        );
        assert_eq!(f.ino(), fs::metadata(dst.join("d/g")).unwrap().ino());
        assert_eq!(
            fs::read_link(dst.join("d/l")).unwrap(),
            Path::new("../nowhere")
        );
        assert_eq!(fs::read(dst.join("d/f")).unwrap(), b"data");
        fs::remove_dir_all(&t).unwrap();
    }
}
