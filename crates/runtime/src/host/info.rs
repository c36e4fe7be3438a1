//! What this host can enforce: probed once, reported by `agentrun info` and on every span.

use crate::confine::landlock;
use crate::host::cgroup::CgroupMode;
use crate::host::privilege::Privilege;

/// The host's sandboxing capabilities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    pub kernel: String,
    /// Landlock ABI version (0: unavailable).
    pub landlock_abi: u32,
    pub seccomp: bool,
    pub user_namespaces: bool,
    pub cgroup: Option<CgroupMode>,
    /// Memory+swap limits possible (so "no swap" is enforced).
    pub swap_limit: bool,
    /// Idmapped mounts work for the image store's filesystem (checked only by
    /// `probe_full`, which lives beside the probe in [`crate::mounts::idmap`]).
    pub idmapped_mounts: Option<bool>,
    /// Capabilities in this process's bounding set.
    pub bounding_caps: Vec<caps::Capability>,
    /// Root, or an ordinary user (rootless mode): detected here, once per process.
    pub privilege: Privilege,
}

impl HostInfo {
    /// The cheap probe done before every run (no forks, a few small reads).
    pub fn probe() -> Self {
        let kernel = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let seccomp = status.lines().any(|l| l.starts_with("Seccomp:"));
        let user_namespaces = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .is_some_and(|n| n > 0);
        let privilege = Privilege::detect();
        // A rootless sandbox has no cgroup of its own (no delegated subtree is used yet).
        let cgroup = CgroupMode::for_sandboxes(&privilege);
        let mut bounding_caps: Vec<caps::Capability> = caps::read(None, caps::CapSet::Bounding)
            .map(|s| s.into_iter().collect())
            .unwrap_or_default();
        bounding_caps.sort_by_key(|c| c.index());
        HostInfo {
            kernel,
            landlock_abi: landlock::abi(),
            seccomp,
            user_namespaces,
            swap_limit: cgroup.is_some_and(|c| c.swap_limit_supported()),
            cgroup,
            idmapped_mounts: None,
            bounding_caps,
            privilege,
        }
    }

    /// Landlock enforcement in words ("full", "partial (ABI n)", "none").
    pub fn landlock_enforcement(&self) -> String {
        landlock::describe(self.landlock_abi)
    }
}
