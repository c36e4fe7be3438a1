//! The mounts wing: filesystems a sandbox sees and the host directories behind them: the
//! per-run rootfs and bind mounts, idmapped mounts, volumes, the host's private image and
//! state dirs, and safe file access inside a running sandbox from the host.

pub mod fsroot;
pub mod hostdirs;
pub mod idmap;
pub mod rootfs;
pub mod volume;
