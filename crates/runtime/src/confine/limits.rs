//! How a sandbox's resource limits are enforced, said exactly: by its cgroup (root), or, for a
//! rootless sandbox with no delegated cgroup, by the closest real thing: per-process rlimits
//! set in every cell (`RLIMIT_AS` for memory, `RLIMIT_NPROC` for tasks, `RLIMIT_CPU` for CPU
//! time when a run has a timeout) and the host-side watchdog for wall time.
//!
//! This module owns that choice and its words (for `agentrun info` and the run's span), and
//! the detection of a delegated cgroup v2 subtree (a systemd user slice): pure functions of
//! what was read from `/proc/self/cgroup` and `/proc/self/mountinfo`, unit-tested root-free.
//! It also owns [`Rlimits`], the file and process limits every sandboxed process gets
//! whatever enforces the rest.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentrun_policy::Resources;
use serde::{Deserialize, Serialize};

/// RLIMIT_NOFILE and RLIMIT_NPROC (soft = hard), with RLIMIT_CORE 0 beside them: decided on
/// the host from the profile, set by a cell's PID 1 (and the zygote's child it forks), by a
/// `--isolation landlock-only` command's child, and in a shell's OCI spec (its init's, the
/// most any of its cells may get: a cell lowers its own, raising needs a capability nobody in
/// it has).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimits {
    pub nofile: u64,
    pub nproc: u64,
}

impl Rlimits {
    /// This process's own hard limits: the most it may set, and what a shell's init gets.
    pub fn ours() -> Rlimits {
        use nix::sys::resource::{getrlimit, Resource};
        let hard = |r| getrlimit(r).map(|(_, hard)| hard).unwrap_or(1024);
        Rlimits {
            nofile: hard(Resource::RLIMIT_NOFILE),
            nproc: hard(Resource::RLIMIT_NPROC),
        }
    }

    /// The profile's (`nofile`, `pids` as nproc), no higher than [`Rlimits::ours`].
    pub fn for_resources(r: &Resources) -> Rlimits {
        Self::capped(r, Self::ours())
    }

    /// The profile's, no higher than `max`.
    fn capped(r: &Resources, max: Rlimits) -> Rlimits {
        Rlimits {
            nofile: r.nofile.min(max.nofile),
            nproc: u64::from(r.pids).min(max.nproc),
        }
    }

    /// What a process sets (soft = hard), in this order, with the name its error says.
    pub fn settings(&self) -> [(nix::sys::resource::Resource, u64, &'static str); 3] {
        use nix::sys::resource::Resource;
        [
            (Resource::RLIMIT_NOFILE, self.nofile, "nofile"),
            (Resource::RLIMIT_NPROC, self.nproc, "nproc"),
            (Resource::RLIMIT_CORE, 0, "core"),
        ]
    }
}

/// Per-process limits a cell sets when no cgroup enforces the profile's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RlimitFallback {
    /// RLIMIT_AS (bytes), for `memory`.
    pub address_space: Option<u64>,
    /// RLIMIT_CPU (seconds), from the timeout and `cpus`.
    pub cpu_seconds: Option<u64>,
}

impl RlimitFallback {
    /// The fallback for `r` (and the run's wall-clock `timeout`).
    pub fn for_resources(r: &Resources, timeout: Option<Duration>) -> RlimitFallback {
        RlimitFallback {
            address_space: (r.memory_bytes > 0).then_some(r.memory_bytes),
            cpu_seconds: timeout
                .map(|t| (t.as_secs_f64() * r.cpus.max(0.01)).ceil().max(1.0) as u64),
        }
    }
}

/// One line per limit: what enforces it. `cgroup` is the sandbox's cgroup layout (root),
/// `None` for a rootless sandbox.
pub fn describe(
    cgroup: Option<crate::host::cgroup::CgroupMode>,
    rl: &RlimitFallback,
    delegated: Option<&Path>,
) -> Vec<String> {
    if let Some(cg) = cgroup {
        let cg = cg.as_str();
        return vec![
            format!("memory: cgroup {cg} memory limit (whole sandbox)"),
            format!("pids: cgroup {cg} pids limit (whole sandbox)"),
            format!("cpu: cgroup {cg} cpu quota (rate)"),
            "wall: watchdog (timeout kills the cell)".into(),
        ];
    }
    let why = match delegated {
        Some(p) => format!(
            "rootless: delegated cgroup v2 subtree {} found but not used yet",
            p.display()
        ),
        None => "rootless: no delegated cgroup".into(),
    };
    vec![
        match rl.address_space {
            Some(b) => format!("memory: RLIMIT_AS {} MiB per process ({why})", b >> 20),
            None => format!("memory: not limited ({why})"),
        },
        format!("pids: RLIMIT_NPROC (per user in the sandbox's user namespace; {why})"),
        match rl.cpu_seconds {
            Some(s) => format!("cpu: RLIMIT_CPU {s} s per process, no rate limit ({why})"),
            None => format!("cpu: no limit but the wall-clock timeout ({why})"),
        },
        "wall: watchdog (timeout kills the cell)".into(),
    ]
}

/// A cgroup v2 subtree this user may manage (`systemd --user` delegates one): the process's
/// own v2 cgroup when the cgroup2 file system is mounted, that directory is owned by `uid`,
/// and its `cgroup.subtree_control` can enable `memory` and `pids`. `cgroup` is
/// `/proc/self/cgroup`, `mountinfo` `/proc/self/mountinfo`; `owner` and `controllers` read
/// the directory (injected for tests).
pub fn delegated_v2(
    cgroup: &str,
    mountinfo: &str,
    uid: u32,
    owner: &dyn Fn(&Path) -> Option<u32>,
    controllers: &dyn Fn(&Path) -> Option<String>,
) -> Option<PathBuf> {
    let rel = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim_start_matches('/');
    let mount = mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split(' ').next() == Some("cgroup2")).then(|| pre.split(' ').nth(4))?
    })?;
    let dir = Path::new(mount).join(rel);
    if owner(&dir)? != uid {
        return None;
    }
    let have = controllers(&dir)?;
    let have: Vec<&str> = have.split_whitespace().collect();
    ["memory", "pids"]
        .iter()
        .all(|c| have.contains(c))
        .then_some(dir)
}

/// [`delegated_v2`] on this host for `uid`.
pub fn probe_delegated_v2(uid: u32) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    delegated_v2(
        &read("/proc/self/cgroup"),
        &read("/proc/self/mountinfo"),
        uid,
        &|d| std::fs::metadata(d).ok().map(|m| m.uid()),
        &|d| std::fs::read_to_string(d.join("cgroup.controllers")).ok(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n0::/\n";
    const MOUNTS: &str = "30 25 0:26 / /sys/fs/cgroup/unified rw,relatime shared:6 - cgroup2 \
                          cgroup2 rw\n31 25 0:27 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
    const USER_CGROUP: &str = "0::/user.slice/user-1000.slice/user@1000.service/app.slice\n";
    const V2_MOUNTS: &str = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";

    /// [`delegated_v2`] for uid 1000, every cgroup owned by `owner` and offering `controllers`.
    fn delegated(cgroup: &str, mounts: &str, owner: u32, controllers: &str) -> Option<PathBuf> {
        let ctl = |_: &Path| Some(controllers.to_string());
        delegated_v2(cgroup, mounts, 1000, &|_| Some(owner), &ctl)
    }

    #[test]
    fn no_delegation_on_this_kind_of_host() {
        let all = "cpu memory pids";
        // Hybrid, the process in the root cgroup owned by root: nothing for uid 1000.
        assert_eq!(delegated(HYBRID_CGROUP, MOUNTS, 0, all), None);
        // No cgroup2 mount at all.
        let v1_only = "31 25 0:27 / /x rw - cgroup cgroup rw\n";
        assert_eq!(delegated(USER_CGROUP, v1_only, 0, all), None);
    }

    #[test]
    fn a_systemd_user_slice_is_found() {
        let all = "cpu memory pids";
        assert_eq!(
            delegated(USER_CGROUP, V2_MOUNTS, 1000, all),
            Some(PathBuf::from(
                "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice"
            ))
        );
        // Owned by the user but without the memory controller: not enough.
        assert_eq!(delegated(USER_CGROUP, V2_MOUNTS, 1000, "cpu pids"), None);
        // Someone else's.
        assert_eq!(delegated(USER_CGROUP, V2_MOUNTS, 1001, all), None);
    }

    /// 512 MiB, 64 tasks, one CPU, 1024 files.
    fn resources() -> Resources {
        Resources {
            memory_bytes: 512 << 20,
            pids: 64,
            cpus: 1.0,
            tmpfs_bytes: 1 << 20,
            nofile: 1024,
            timeout: None,
            output_cap: None,
        }
    }

    #[test]
    fn rlimits_are_the_profiles_capped_at_ours() {
        let r = resources();
        let high = Rlimits {
            nofile: 1 << 20,
            nproc: 1 << 20,
        };
        let low = Rlimits {
            nofile: 512,
            nproc: 32,
        };
        assert_eq!(
            Rlimits::capped(&r, high),
            Rlimits {
                nofile: 1024,
                nproc: 64
            }
        );
        assert_eq!(Rlimits::capped(&r, low), low);
        let ours = Rlimits::ours();
        assert!(ours.nofile > 0 && ours.nproc > 0);
        assert_eq!(Rlimits::for_resources(&r), Rlimits::capped(&r, ours));
        use nix::sys::resource::Resource;
        assert_eq!(
            low.settings(),
            [
                (Resource::RLIMIT_NOFILE, 512, "nofile"),
                (Resource::RLIMIT_NPROC, 32, "nproc"),
                (Resource::RLIMIT_CORE, 0, "core"),
            ]
        );
    }

    #[test]
    fn the_words_say_which_mechanism() {
        let r = resources();
        let rl = RlimitFallback::for_resources(&r, Some(Duration::from_secs(10)));
        assert_eq!(rl.address_space, Some(512 << 20));
        assert_eq!(rl.cpu_seconds, Some(10));
        let lines = describe(None, &rl, None);
        assert_eq!(
            lines[0],
            "memory: RLIMIT_AS 512 MiB per process (rootless: no delegated cgroup)"
        );
        assert!(lines[2].starts_with("cpu: RLIMIT_CPU 10 s"));
        let lines = describe(Some(crate::host::cgroup::CgroupMode::Hybrid), &rl, None);
        assert!(lines[0].contains("cgroup hybrid memory limit"));
        let none = RlimitFallback::for_resources(&r, None);
        assert!(describe(None, &none, None)[2].contains("no limit but the wall-clock timeout"));
    }
}
