//! Helpers the fuzz targets share: a private scratch directory for the targets that write
//! files (the layer unpacker, the archive importer, `docker cp`'s extraction).
//!
//! Those parsers run as root here (they chown, set xattrs, make whiteout devices, as they do
//! in the daemon), so what they write is kept away from the host:
//! - the scratch directory is `$TMPDIR/agentrun-fuzz`, mode 0700: no other user can reach a
//!   set-id file or a capability-carrying file an input made;
//! - as root, the process first moves into a mount namespace of its own (private
//!   propagation) and mounts a tmpfs there (256 MiB, 64 Ki inodes, `nosuid,nodev,noexec`):
//!   a decompression bomb fills that, not the host's disk; set-id bits and file
//!   capabilities mean nothing on it; it disappears with the process, whatever way it ends;
//! - each input gets a fresh, empty `work/` directory, removed after the run, and a sibling
//!   `canary/` that must stay empty: an entry that lands outside `work/` is a finding (the
//!   target panics, so libFuzzer keeps the input).
//!
//! Not root (a developer's shell): no mount; the scratch directory is per process, and the
//! unpacker's chown calls fail for most inputs, so its coverage is lower. `hack/fuzz` runs
//! as root in CI.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Size of the scratch tmpfs.
pub const SCRATCH_SIZE: &str = "256m";

static BASE: OnceLock<PathBuf> = OnceLock::new();

/// The scratch base directory (made, and as root mounted, on first use).
pub fn scratch_base() -> &'static Path {
    BASE.get_or_init(|| {
        let top = std::env::temp_dir().join("agentrun-fuzz");
        let _ = fs::DirBuilder::new().mode(0o700).create(&top);
        let _ = fs::set_permissions(&top, fs::Permissions::from_mode(0o700));
        if nix::unistd::geteuid().is_root() {
            match private_tmpfs(&top) {
                Ok(()) => return top,
                Err(e) => eprintln!(
                    "agentrun-fuzz: WARNING: no private tmpfs at {} ({e}); using the disk",
                    top.display()
                ),
            }
        }
        let base = top.join(std::process::id().to_string());
        let _ = fs::DirBuilder::new().mode(0o700).create(&base);
        base
    })
}

/// A mount namespace of this process's own, and a size-capped tmpfs on `dir` in it.
fn private_tmpfs(dir: &Path) -> nix::Result<()> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(format!("size={SCRATCH_SIZE},nr_inodes=65536,mode=0700").as_str()),
    )
}

/// One input's scratch space: `work/` (empty) and `canary/` (must stay empty). Removed when
/// dropped.
pub struct Scratch {
    pub work: PathBuf,
    canary: PathBuf,
}

impl Scratch {
    pub fn new() -> Scratch {
        let base = scratch_base();
        let work = base.join("work");
        let canary = base.join("canary");
        remove_tree(&work);
        for d in [&work, &canary] {
            let _ = fs::DirBuilder::new().mode(0o700).create(d);
        }
        Scratch { work, canary }
    }

    /// Panics if anything was written next to `work/` (an escape from it).
    pub fn check_contained(&self) {
        let stray: Vec<_> = fs::read_dir(&self.canary)
            .map(|rd| rd.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            stray.is_empty(),
            "written outside the target directory: {stray:?}"
        );
        let siblings: Vec<_> = fs::read_dir(scratch_base())
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name())
                    .filter(|n| n != "work" && n != "canary")
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            siblings.is_empty(),
            "written outside the target directory: {siblings:?}"
        );
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        remove_tree(&self.work);
    }
}

/// Removes a tree whatever modes an input gave its directories (a 0000 directory cannot be
/// emptied by a non-root owner until it is made writable again).
fn remove_tree(p: &Path) {
    if fs::remove_dir_all(p).is_ok() || !p.exists() {
        return;
    }
    fn open_up(p: &Path) {
        let Ok(m) = fs::symlink_metadata(p) else {
            return;
        };
        if m.is_dir() {
            let _ = fs::set_permissions(p, fs::Permissions::from_mode(0o700));
            if let Ok(rd) = fs::read_dir(p) {
                for e in rd.filter_map(Result::ok) {
                    open_up(&e.path());
                }
            }
        }
    }
    open_up(p);
    let _ = fs::remove_dir_all(p);
}

/// Splits a selector byte off an input (which request kind a multi-request target feeds).
pub fn split_selector(data: &[u8]) -> Option<(u8, &[u8])> {
    let (&sel, rest) = data.split_first()?;
    Some((sel, rest))
}
