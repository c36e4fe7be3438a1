//! cgroups, detected: how this host mounts them ([`CgroupMode`]), where a sandbox's cgroup
//! lives, and whether memory+swap can be limited. Reading and writing a sandbox's cgroup
//! (limits, freezer, stats) is [`crate::host::cgroup_ops`]; this module only looks, so what
//! reports the host (`agentrun info`, preflight) does not depend on the runtime's errors.
//! Works on v1, v2 and hybrid hosts (hybrid = v1 controllers plus a cgroup2 mount, managed
//! as v1).

use std::fs;
use std::path::{Path, PathBuf};

use libcgroups::common::{get_cgroup_setup, CgroupSetup};

/// Root of the cgroup filesystem(s).
pub(crate) const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// Parent cgroup of every sandbox: `/agentrun/<sandbox-id>`.
pub const PARENT: &str = "agentrun";

/// Whether a cgroup hierarchy is mounted with `favordynmods` (Linux 6.0+). Without it, every
/// move of a process into a cgroup (each new sandbox's, through libcgroups) first waits an RCU
/// grace period for the kernel's global `cgroup_threadgroup_rwsem`: up to ~7 ms of a cold run
/// here when the CPUs are busy (nothing measurable when idle; `hack/bench` has a row). With it, forks and exits take that rwsem's slower path instead.
/// A host setting (`mount -o remount,favordynmods <cgroup2 mount>`): agentrun only reports it.
pub fn favordynmods() -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|line| {
        // "... - FSTYPE SOURCE SUPER_OPTIONS"
        let Some((_, fs_part)) = line.split_once(" - ") else {
            return false;
        };
        let mut f = fs_part.split(' ');
        let fstype = f.next().unwrap_or_default();
        let super_options = f.nth(1).unwrap_or_default();
        (fstype == "cgroup" || fstype == "cgroup2")
            && super_options.split(',').any(|o| o == "favordynmods")
    })
}

/// How this host mounts cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    V1,
    V2,
    Hybrid,
}

impl CgroupMode {
    /// The cgroup layout this process's sandboxes get: the host's for root, none for an
    /// ordinary user (a rootless sandbox has no cgroup; see [`crate::confine::limits`]).
    pub fn for_sandboxes(privilege: &crate::host::privilege::Privilege) -> Option<Self> {
        if privilege.is_root() {
            Self::detect()
        } else {
            None
        }
    }

    /// Detects the host's cgroup layout.
    pub fn detect() -> Option<Self> {
        match get_cgroup_setup().ok()? {
            CgroupSetup::Legacy => Some(CgroupMode::V1),
            CgroupSetup::Hybrid => Some(CgroupMode::Hybrid),
            CgroupSetup::Unified => Some(CgroupMode::V2),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CgroupMode::V1 => "v1",
            CgroupMode::V2 => "v2",
            CgroupMode::Hybrid => "hybrid",
        }
    }

    pub(crate) fn unified(self) -> bool {
        self == CgroupMode::V2
    }

    /// The directory of `controller` (ignored on v2) for the sandbox cgroup `id`.
    pub fn dir(self, controller: &str, id: &str) -> PathBuf {
        if self.unified() {
            Path::new(CGROUP_ROOT).join(PARENT).join(id)
        } else {
            Path::new(CGROUP_ROOT)
                .join(controller)
                .join(PARENT)
                .join(id)
        }
    }

    /// The `linux.cgroupsPath` of a sandbox (absolute, so libcontainer uses it as is).
    pub fn spec_path(id: &str) -> PathBuf {
        Path::new("/").join(PARENT).join(id)
    }

    /// Whether memory+swap can be limited (v1 needs swap accounting).
    pub fn swap_limit_supported(self) -> bool {
        if self.unified() {
            true
        } else {
            Path::new(CGROUP_ROOT)
                .join("memory/memory.memsw.limit_in_bytes")
                .exists()
        }
    }
}
