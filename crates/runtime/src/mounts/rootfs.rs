//! The per-run root filesystem and bind mounts, prepared on the host before the container.
//!
//! Layout under a sandbox's state dir:
//! ```text
//! rw/            tmpfs, size-capped: rw/upper + rw/work (the overlay's writable layer)
//! lower/<n>/     the image's layers (0 = topmost), each idmapped to the sandbox range,
//!                read-only
//! bundle/rootfs  overlay(lower/0:lower/1:..., rw/upper): the container's root
//! mnt/<n>/       host directories (image binds, workspace, --ro/--rw), idmapped, staged here
//!                and bind-mounted into the container by libcontainer
//! ```
//! The image is never written: writes land in the tmpfs and vanish with it. All mounts are
//! made by syscalls (a `mount` binary costs ~10 ms each) and torn down by scanning
//! `/proc/self/mountinfo`, so teardown also works for what a killed run left.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use agentrun_image::Image;
use nix::mount::{umount2, MntFlags};

use crate::error::RuntimeError;
use crate::mounts::idmap::{attach_tree, detached_clone_idmapped, MappingNamespace, UID_BASE};
use crate::mounts::{mount_fs, NOSUID_NODEV};
use crate::spec::BindMount;

/// A host path the user asked to mount into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct UserMount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub writable: bool,
}

impl UserMount {
    /// Refuses a target that is not an absolute path, or that climbs with `..`.
    pub fn check_target(&self) -> Result<(), RuntimeError> {
        let t = &self.target;
        if !t.is_absolute() || t.components().any(|c| c.as_os_str() == "..") {
            return Err(RuntimeError::InvalidInput(format!(
                "mount target {} must be an absolute path without '..'",
                t.display()
            )));
        }
        Ok(())
    }
}

/// What [`prepare`] produced.
#[derive(Debug)]
pub struct PreparedRootfs {
    /// Bind mounts for the spec (staged sources under `mnt/`).
    pub binds: Vec<BindMount>,
    /// Whether every mount could be idmapped (false: some ownership shows as nobody inside, and
    /// workspace writes are owned by the sandbox uid on the host).
    pub idmapped: bool,
}

fn mkdir(p: &Path) -> Result<(), RuntimeError> {
    fs::create_dir_all(p).map_err(|e| RuntimeError::io("create", p, e))
}

/// The overlay's upper (writable) directory of the sandbox whose state dir is `state`.
pub fn upper_dir(state: &Path) -> PathBuf {
    state.join("rw").join("upper")
}

/// Mounts the rootfs and stages the binds for a sandbox whose state dir is `state`.
pub fn prepare(
    state: &Path,
    image: &Image,
    tmpfs_bytes: u64,
    user_mounts: &[UserMount],
    for_commit: bool,
) -> Result<PreparedRootfs, RuntimeError> {
    let rw = state.join("rw");
    let lower = state.join("lower");
    let rootfs = state.join("bundle").join("rootfs");
    for d in [&rw, &lower, &rootfs] {
        mkdir(d)?;
    }
    mount_fs(
        "tmpfs",
        &rw,
        NOSUID_NODEV,
        &format!("size={tmpfs_bytes},mode=0700"),
    )
    .map_err(|e| RuntimeError::sys("mount tmpfs for the writable layer", e))?;
    let upper = upper_dir(state);
    let work = rw.join("work");
    for d in [&upper, &work] {
        mkdir(d)?;
    }
    // The overlay's root directory takes the upper dir's owner: the sandbox's root.
    chown(&upper, Some(UID_BASE), Some(UID_BASE))
        .map_err(|e| RuntimeError::io("chown", &upper, e))?;
    fs::set_permissions(&upper, fs::Permissions::from_mode(0o755))
        .map_err(|e| RuntimeError::io("chmod", &upper, e))?;

    let range = MappingNamespace::sandbox_range()?;
    let mut idmapped = true;
    // A file system that cannot be idmapped gets a plain bind.
    let mut attach = |src: &Path, dst: &Path, ns: &MappingNamespace, ro: bool| {
        let (tree, mapped) = detached_clone_idmapped(src, ns, ro)?;
        idmapped &= mapped;
        attach_tree(&tree, dst)
    };
    let mut lowerdirs = Vec::with_capacity(image.layers.len());
    for (n, layer) in image.layers.iter().enumerate() {
        let dst = lower.join(n.to_string());
        mkdir(&dst)?;
        attach(layer, &dst, &range, true)?;
        lowerdirs.push(dst.display().to_string());
    }
    if lowerdirs.is_empty() {
        return Err(RuntimeError::InvalidInput(format!(
            "image {} has no layers",
            image.name
        )));
    }
    let mut opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lowerdirs.join(":"),
        upper.display(),
        work.display()
    );
    if for_commit {
        // A layer tar has no way to say "this dir was renamed" or "only metadata changed".
        opts.push_str(",redirect_dir=off,metacopy=off,index=off");
    }
    // The kernel takes at most a page of mount options.
    if opts.len() >= 4096 {
        return Err(RuntimeError::InvalidInput(format!(
            "image {} has too many layers ({}) for one overlay mount",
            image.name,
            image.layers.len()
        )));
    }
    mount_fs("overlay", &rootfs, NOSUID_NODEV, &opts)
        .map_err(|e| RuntimeError::sys("mount overlay rootfs", e))?;
    // /workspace is the default working directory: every image has one (in the upper layer
    // when the image lacks it), owned by the sandbox's root.
    let ws = rootfs.join("workspace");
    if !for_commit && fs::symlink_metadata(&ws).is_err() {
        mkdir(&ws)?;
        chown(&ws, Some(UID_BASE), Some(UID_BASE))
            .map_err(|e| RuntimeError::io("chown", &ws, e))?;
    }

    let mut binds = Vec::new();
    let mut owners: HashMap<(u32, u32), MappingNamespace> = HashMap::new();
    let staged = |n: usize| state.join("mnt").join(n.to_string());
    let host = image.host_binds.iter().map(|b| UserMount {
        source: b.source.clone(),
        target: b.target.clone(),
        writable: false,
    });
    for (n, m) in host.chain(user_mounts.iter().cloned()).enumerate() {
        let meta =
            fs::metadata(&m.source).map_err(|e| RuntimeError::io("cannot mount", &m.source, e))?;
        let dst = staged(n);
        if meta.is_dir() {
            mkdir(&dst)?;
        } else {
            mkdir(dst.parent().expect("staged path has a parent"))?;
            fs::write(&dst, b"").map_err(|e| RuntimeError::io("create", &dst, e))?;
        }
        let is_image_bind = n < image.host_binds.len();
        let owner = (meta.uid(), meta.gid());
        if is_image_bind || owner == (0, 0) {
            attach(&m.source, &dst, &range, !m.writable)?;
        } else {
            let ns = match owners.entry(owner) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(MappingNamespace::owner(owner.0, owner.1)?)
                }
            };
            attach(&m.source, &dst, ns, !m.writable)?;
        }
        binds.push(BindMount {
            source: dst,
            target: m.target.clone(),
            writable: m.writable,
        });
    }
    Ok(PreparedRootfs { binds, idmapped })
}

/// Every mount point at or below `dir`, deepest first (from /proc/self/mountinfo).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// mountinfo escapes space, tab, newline and backslash as octal.
pub(crate) fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmounts everything at or below `dir` (lazily: a busy mount goes once unused).
pub fn unmount_all(dir: &Path) -> Result<(), RuntimeError> {
    // Stacked mounts on one point need several passes.
    for _ in 0..8 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return Ok(());
        }
        for m in mounts {
            // Dropped: teardown of mounts that may already be gone (EINVAL/ENOENT); the state dir's
            // removal, next, reports what matters.
            let _ = umount2(&m, MntFlags::MNT_DETACH);
        }
    }
    if mounts_under(dir).is_empty() {
        Ok(())
    } else {
        Err(RuntimeError::Container(format!(
            "mounts under {} could not be removed",
            dir.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo("/a\\040b"), "/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/x\\134y"), "/x\\y");
    }
}
