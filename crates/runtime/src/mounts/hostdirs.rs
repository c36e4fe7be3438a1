//! agentrun's own host directories, kept private: the image store (`AGENTRUN_ROOT`, default
//! `/var/lib/agentrun`) holds every image's layers, setuid binaries included, and the state dir
//! (`AGENTRUN_STATE_DIR`, default `/run/agentrun`) holds every sandbox's root filesystem and
//! writable layer. A local user who could traverse them could run an image's setuid-root
//! binary or read what a sandbox wrote. [`secure`] creates or repairs both when a command
//! that uses them starts (`exec`, `serve`, `gc`, `image ...`):
//!
//! - the store: `0700 root:root`. Nothing reaches into it but agentrun as root: layers enter a
//!   sandbox as idmapped mounts cloned by the host process (`open_tree`), never by path from
//!   inside.
//! - the state dir: `0710 root:<sandbox gid>` where the sandbox gid is host gid
//!   [`UID_BASE`](crate::mounts::idmap::UID_BASE), the gid of every sandbox's root. The container's
//!   init runs as the sandbox's root while libcontainer mounts the bundle's rootfs and the
//!   staged binds by their paths under the state dir, so that gid, and no other, must be able
//!   to traverse (search, not list) it. Other local users (and sandbox uids other than root,
//!   which never walk host paths) get nothing.
//!
//! A directory owned by someone other than root is refused rather than taken over: its owner
//! could change it back at any time. Running as an ordinary user (rootless mode), both are
//! the user's own, mode 0700, and one owned by anyone else is refused.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::error::RuntimeError;
use crate::mounts::idmap::UID_BASE;

/// Mode of the image store.
pub const STORE_MODE: u32 = 0o700;
/// Mode of the state dir (group: the sandbox's root gid, [`UID_BASE`]).
pub const STATE_DIR_MODE: u32 = 0o710;

/// Makes the image store at `root` and the state dir at `state_dir` private, creating them if
/// needed. Returns one line per repair of a directory that already held something (for a
/// warning: its contents were exposed until now), nothing otherwise.
pub fn secure(root: &Path, state_dir: &Path) -> Result<Vec<String>, RuntimeError> {
    let euid = nix::unistd::geteuid();
    if !euid.is_root() {
        // Rootless: both are the user's own, 0700 (nothing else may reach into them).
        secure_own_dir(root, euid.as_raw())?;
        secure_own_dir(state_dir, euid.as_raw())?;
        return Ok(Vec::new());
    }
    let mut repairs = Vec::new();
    repairs.extend(secure_dir(root, STORE_MODE, 0)?);
    repairs.extend(secure_dir(state_dir, STATE_DIR_MODE, UID_BASE)?);
    Ok(repairs)
}

/// Rootless: creates `dir` (mode 0700) or checks that an existing one is `uid`'s and brings
/// it to 0700.
fn secure_own_dir(dir: &Path, uid: u32) -> Result<(), RuntimeError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| RuntimeError::io("create", dir, e))?;
    let meta = fs::metadata(dir).map_err(|e| RuntimeError::io("stat", dir, e))?;
    if meta.uid() != uid {
        return Err(RuntimeError::InvalidInput(format!(
            "{} is owned by uid {}, not by you (uid {uid}): refusing to keep images or \
             sandboxes where another user can change them (choose another directory)",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o7777 != 0o700 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| RuntimeError::io("chmod", dir, e))?;
    }
    Ok(())
}

/// Creates `dir` (mode `mode`, owner root, group `gid`) or brings an existing one to that.
fn secure_dir(dir: &Path, mode: u32, gid: u32) -> Result<Option<String>, RuntimeError> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).map_err(|e| RuntimeError::io("create", parent, e))?;
    }
    let created = match fs::DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(RuntimeError::io("create", dir, e)),
    };
    let meta = fs::metadata(dir).map_err(|e| RuntimeError::io("stat", dir, e))?;
    if !meta.is_dir() {
        return Err(RuntimeError::InvalidInput(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    if meta.uid() != 0 {
        return Err(RuntimeError::InvalidInput(format!(
            "{} is owned by uid {}, not root: refusing to keep images or sandboxes where \
             another user can change them (chown root it, or choose another directory)",
            dir.display(),
            meta.uid()
        )));
    }
    let was_mode = meta.mode() & 0o7777;
    let was_gid = meta.gid();
    if was_mode == mode && was_gid == gid {
        return Ok(None);
    }
    // Group first: the mode then never grants a group that is about to go.
    std::os::unix::fs::chown(dir, None, Some(gid))
        .map_err(|e| RuntimeError::io("chown", dir, e))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))
        .map_err(|e| RuntimeError::io("chmod", dir, e))?;
    // Nothing to report for a directory that held nothing yet (made by the caller, say):
    // nothing under it was exposed.
    let empty = fs::read_dir(dir)
        .map(|mut entries| entries.next().is_none())
        .unwrap_or(false);
    if created || empty {
        return Ok(None);
    }
    Ok(Some(format!(
        "made {} private (mode {was_mode:o} group {was_gid} -> mode {mode:o} group {gid})",
        dir.display()
    )))
}

/// Whether a sandbox's root (host uid and gid [`UID_BASE`], no supplementary groups) may
/// search directory `meta`.
pub(crate) fn sandbox_root_can_search(meta: &fs::Metadata) -> bool {
    let mode = meta.mode();
    if meta.uid() == UID_BASE {
        mode & 0o100 != 0
    } else if meta.gid() == UID_BASE {
        mode & 0o010 != 0
    } else {
        mode & 0o001 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_gid(p: &Path) -> (u32, u32) {
        let m = fs::metadata(p).unwrap();
        (m.mode() & 0o7777, m.gid())
    }

    #[test]
    fn creates_and_repairs_private_dirs() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root (chown)");
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("lib/agentrun");
        let state = base.path().join("run/agentrun");
        // Fresh: created private, nothing to report.
        assert!(secure(&root, &state).unwrap().is_empty());
        assert_eq!(mode_gid(&root), (0o700, 0));
        assert_eq!(mode_gid(&state), (0o710, UID_BASE));
        assert!(sandbox_root_can_search(&fs::metadata(&state).unwrap()));
        // An empty world-readable directory (made by the user): repaired silently.
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        assert!(secure(&root, &state).unwrap().is_empty());
        assert_eq!(mode_gid(&root), (0o700, 0));
        // World-readable with contents, as older installs left them: repaired, and said so.
        fs::create_dir(root.join("layers")).unwrap();
        fs::create_dir(state.join("sandboxes")).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&state, None, Some(0)).unwrap();
        fs::set_permissions(&state, fs::Permissions::from_mode(0o755)).unwrap();
        let repairs = secure(&root, &state).unwrap();
        assert_eq!(repairs.len(), 2, "{repairs:?}");
        assert!(repairs[0].contains("mode 755"), "{repairs:?}");
        assert_eq!(mode_gid(&root), (0o700, 0));
        assert_eq!(mode_gid(&state), (0o710, UID_BASE));
        assert!(secure(&root, &state).unwrap().is_empty());
        // Someone else's directory is refused.
        std::os::unix::fs::chown(&root, Some(65534), None).unwrap();
        let e = secure(&root, &state).unwrap_err().to_string();
        assert!(e.contains("owned by uid 65534"), "{e}");
    }

    #[test]
    fn search_permission_for_the_sandbox_root() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let check = |mode: u32| {
            fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
            sandbox_root_can_search(&fs::metadata(p).unwrap())
        };
        // Owned by whoever runs the test (not UID_BASE): "others" bits decide, unless the
        // group is the sandbox's.
        let gid_is_sandbox = fs::metadata(p).unwrap().gid() == UID_BASE;
        assert!(check(0o711));
        assert!(!check(0o700));
        assert_eq!(check(0o710), gid_is_sandbox);
    }
}
