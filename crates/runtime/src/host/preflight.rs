//! Preflight: the host requirements people miss first, checked before anything is created,
//! each failure a one-line error saying what to do.
//!
//! This module owns the checks (root, user namespaces, a cgroup filesystem and the cgroup
//! controllers a sandbox's limits need) and the warning for a kernel without Landlock, which
//! is not an error: a sandbox still runs, with what Landlock would enforce left out (said in
//! [`LANDLOCK_ABSENT`]). The checks are pure functions of what [`HostFacts`] gathered, so
//! every case is unit-testable without changing the host.

use std::path::Path;

use crate::host::cgroup::CgroupMode;
use crate::host::info::HostInfo;

/// The cgroup controllers a sandbox's limits are written to (cpu quota, memory, task limit).
pub const REQUIRED_CONTROLLERS: &[&str] = &["cpu", "memory", "pids"];

/// Root of the cgroup filesystem(s).
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// What [`check`] found missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreflightError {
    #[error(
        "needs root (it creates namespaces, mounts and cgroups; this is uid {uid}): run it \
         with sudo"
    )]
    NotRoot { uid: u32 },
    #[error(
        "user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0): enable them \
         with `sysctl -w user.max_user_namespaces=15000` (and set it in /etc/sysctl.d/ to keep it)"
    )]
    NoUserNamespaces,
    #[error(
        "no cgroup filesystem is mounted at /sys/fs/cgroup: mount cgroup2 there \
         (`mount -t cgroup2 none /sys/fs/cgroup`) or boot with systemd"
    )]
    NoCgroups,
    #[error("{}", controller_message(.controller, *.mode))]
    ControllerMissing {
        controller: String,
        mode: CgroupMode,
    },
}

fn controller_message(controller: &str, mode: CgroupMode) -> String {
    let limit = match controller {
        "cpu" => "CPU",
        "memory" => "memory",
        "pids" => "process-count",
        _ => "resource",
    };
    let fix = match mode {
        CgroupMode::V2 => format!(
            "enable it (`echo +{controller} > /sys/fs/cgroup/cgroup.subtree_control`; if it is \
             not in /sys/fs/cgroup/cgroup.controllers, it is bound to a v1 hierarchy or disabled \
             by cgroup_disable= on the kernel command line)"
        ),
        CgroupMode::V1 | CgroupMode::Hybrid => format!(
            "mount it (`mkdir -p /sys/fs/cgroup/{controller} && mount -t cgroup -o {controller} \
             {controller} /sys/fs/cgroup/{controller}`), or remove cgroup_disable={controller} \
             from the kernel command line"
        ),
    };
    format!(
        "the cgroup controller '{controller}' is missing ({} cgroups): agentrun needs it for \
         sandboxes' {limit} limits; {fix}",
        mode.as_str()
    )
}

/// What Landlock would have enforced, said when the kernel has none (`agentrun info`, and a
/// warning before each sandbox).
pub const LANDLOCK_ABSENT: &str = "Landlock is not available on this kernel (Linux 5.13+ with \
     landlock in the lsm= boot list): sandboxes still run, but the profile's file access rules \
     (read-only and writable paths) and its IPC scoping (abstract unix sockets, signals to \
     processes outside the sandbox) are NOT enforced; only namespaces, mounts, seccomp, \
     capabilities and cgroups confine them";

/// The host facts the checks read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    pub euid: u32,
    pub user_namespaces: bool,
    pub cgroup: Option<CgroupMode>,
    /// The controllers usable for a sandbox's cgroup.
    pub controllers: Vec<String>,
    pub landlock_abi: u32,
}

impl HostFacts {
    /// Gathers the facts of this host (a few small reads and stats).
    pub fn probe(host: &HostInfo) -> Self {
        HostFacts {
            euid: nix::unistd::geteuid().as_raw(),
            user_namespaces: host.user_namespaces,
            cgroup: host.cgroup,
            controllers: host.cgroup.map(controllers).unwrap_or_default(),
            landlock_abi: host.landlock_abi,
        }
    }
}

/// The controllers available for sandboxes: v2, those in the root's `cgroup.controllers`;
/// v1/hybrid, those with a mounted hierarchy (its `cgroup.procs` exists) in
/// `/sys/fs/cgroup/<controller>`.
pub fn controllers(mode: CgroupMode) -> Vec<String> {
    controllers_under(Path::new(CGROUP_ROOT), mode)
}

fn controllers_under(root: &Path, mode: CgroupMode) -> Vec<String> {
    match mode {
        CgroupMode::V2 => std::fs::read_to_string(root.join("cgroup.controllers"))
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
        CgroupMode::V1 | CgroupMode::Hybrid => REQUIRED_CONTROLLERS
            .iter()
            .filter(|c| root.join(c).join("cgroup.procs").exists())
            .map(|c| (*c).to_owned())
            .collect(),
    }
}

/// Root is required (the first check: nothing else is worth reporting without it).
pub fn check_root(euid: u32) -> Result<(), PreflightError> {
    if euid == 0 {
        Ok(())
    } else {
        Err(PreflightError::NotRoot { uid: euid })
    }
}

/// Everything a sandbox needs from the host; `Ok` carries the warnings to print (one line
/// each), today only [`LANDLOCK_ABSENT`].
pub fn check(facts: &HostFacts) -> Result<Vec<&'static str>, PreflightError> {
    check_root(facts.euid)?;
    if !facts.user_namespaces {
        return Err(PreflightError::NoUserNamespaces);
    }
    let mode = facts.cgroup.ok_or(PreflightError::NoCgroups)?;
    if let Some(missing) = REQUIRED_CONTROLLERS
        .iter()
        .find(|c| !facts.controllers.iter().any(|have| have == *c))
    {
        return Err(PreflightError::ControllerMissing {
            controller: (*missing).to_owned(),
            mode,
        });
    }
    let mut warnings = Vec::new();
    if facts.landlock_abi == 0 {
        warnings.push(LANDLOCK_ABSENT);
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> HostFacts {
        HostFacts {
            euid: 0,
            user_namespaces: true,
            cgroup: Some(CgroupMode::Hybrid),
            controllers: vec!["cpu".into(), "memory".into(), "pids".into()],
            landlock_abi: 7,
        }
    }

    fn one_line(e: &PreflightError) -> String {
        let s = e.to_string();
        assert!(!s.contains('\n'), "{s}");
        s
    }

    /// The error a host like [`good`] but for `change` is refused with, and its one line.
    fn refused(change: impl FnOnce(&mut HostFacts)) -> (PreflightError, String) {
        let mut facts = good();
        change(&mut facts);
        let e = check(&facts).unwrap_err();
        let s = one_line(&e);
        (e, s)
    }

    #[test]
    fn a_good_host_passes_without_warnings() {
        assert_eq!(check(&good()), Ok(vec![]));
    }

    #[test]
    fn not_root_says_to_use_sudo() {
        let (e, s) = refused(|f| f.euid = 1000);
        assert_eq!(e, PreflightError::NotRoot { uid: 1000 });
        assert!(s.starts_with("needs root") && s.contains("sudo"), "{s}");
    }

    #[test]
    fn no_user_namespaces_says_which_sysctl() {
        let (e, s) = refused(|f| f.user_namespaces = false);
        assert_eq!(e, PreflightError::NoUserNamespaces);
        assert!(s.contains("sysctl -w user.max_user_namespaces="));
    }

    #[test]
    fn no_cgroups_says_how_to_mount() {
        let (e, s) = refused(|f| {
            f.cgroup = None;
            f.controllers = vec![];
        });
        assert_eq!(e, PreflightError::NoCgroups);
        assert!(s.contains("mount -t cgroup2"));
    }

    #[test]
    fn a_missing_controller_is_named_with_its_fix() {
        for mode in [CgroupMode::V1, CgroupMode::Hybrid, CgroupMode::V2] {
            for missing in REQUIRED_CONTROLLERS {
                let (_, s) = refused(|f| {
                    f.cgroup = Some(mode);
                    f.controllers = REQUIRED_CONTROLLERS
                        .iter()
                        .filter(|c| *c != missing)
                        .map(|c| (*c).to_owned())
                        .collect();
                });
                assert!(
                    s.contains(&format!("cgroup controller '{missing}' is missing")),
                    "{s}"
                );
                if mode == CgroupMode::V2 {
                    assert!(s.contains(&format!("echo +{missing} >")), "{s}");
                } else {
                    assert!(s.contains(&format!("mount -t cgroup -o {missing}")), "{s}");
                }
            }
        }
    }

    #[test]
    fn landlock_absent_is_a_warning_saying_what_is_not_enforced() {
        let facts = HostFacts {
            landlock_abi: 0,
            ..good()
        };
        let warnings = check(&facts).unwrap();
        assert_eq!(warnings, vec![LANDLOCK_ABSENT]);
        assert!(LANDLOCK_ABSENT.contains("NOT enforced"));
        assert!(LANDLOCK_ABSENT.contains("file access rules"));
    }

    #[test]
    fn controllers_are_read_from_the_hierarchy() {
        let dir = tempfile::tempdir().unwrap();
        // v1/hybrid: a controller counts when its hierarchy is mounted (cgroup.procs exists);
        // an empty directory (an unmounted hierarchy's mount point) does not.
        for c in ["cpu", "memory"] {
            std::fs::create_dir(dir.path().join(c)).unwrap();
            std::fs::write(dir.path().join(c).join("cgroup.procs"), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("pids")).unwrap();
        assert_eq!(
            controllers_under(dir.path(), CgroupMode::Hybrid),
            vec!["cpu".to_owned(), "memory".to_owned()]
        );
        // v2: the root's cgroup.controllers.
        std::fs::write(
            dir.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        assert_eq!(
            controllers_under(dir.path(), CgroupMode::V2),
            vec!["cpuset", "cpu", "io", "memory", "pids"]
        );
    }
}
