//! The mounts wing: filesystems a sandbox sees and the host directories behind them: the
//! per-run rootfs and bind mounts, idmapped mounts, volumes, the host's private image and
//! state dirs, and safe file access inside a running sandbox from the host.

pub mod fsroot;
pub mod hostdirs;
pub mod idmap;
pub mod rootfs;
pub mod volume;

/// Mounts a new `fstype` file system (one with no source device: tmpfs, overlay, proc) at
/// `at` with `flags` and its options `data` (none if empty).
pub(crate) fn mount_fs(
    fstype: &str,
    at: &std::path::Path,
    flags: nix::mount::MsFlags,
    data: &str,
) -> nix::Result<()> {
    let data = (!data.is_empty()).then_some(data);
    nix::mount::mount(Some(fstype), at, Some(fstype), flags, data)
}

/// Changes the mount at `at` in place: its flags (`MS_BIND | MS_REMOUNT | ...`) or its
/// propagation (`MS_REC | MS_SLAVE`, `MS_PRIVATE`); no source, type or options.
pub(crate) fn remount<P: ?Sized + nix::NixPath>(
    at: &P,
    flags: nix::mount::MsFlags,
) -> nix::Result<()> {
    nix::mount::mount(None::<&str>, at, None::<&str>, flags, None::<&str>)
}

/// The flags of every file system a sandbox's rootfs is built from: no set-id, no devices.
pub(crate) const NOSUID_NODEV: nix::mount::MsFlags =
    nix::mount::MsFlags::MS_NOSUID.union(nix::mount::MsFlags::MS_NODEV);
