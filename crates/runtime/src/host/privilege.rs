//! Who runs agentrun: root, or an ordinary user (rootless mode). Detected once
//! ([`Privilege::detect`]: the effective uid) and carried as one value, so the rest of the
//! runtime asks this type instead of calling `geteuid` itself.
//!
//! This module owns what differs between the two: the default image store and state dir
//! (`/var/lib/agentrun`, `/run/agentrun` for root; `$XDG_DATA_HOME/agentrun` and
//! `$XDG_RUNTIME_DIR/agentrun` for a user), the user namespace mapping of a rootless sandbox
//! (the caller is root inside; its subordinate ids from `/etc/subuid` and `/etc/subgid`
//! through `newuidmap`/`newgidmap` when it has a range and they are installed), and why user
//! namespaces are unavailable when they are (each cause named with the knob that enables it).
//! Pure functions of what was read, so every case is unit-testable as any user.

use std::path::{Path, PathBuf};

/// A range of subordinate ids (`/etc/subuid`, `/etc/subgid`): `count` ids from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub start: u32,
    pub count: u32,
}

/// The ids of an ordinary user, and the subordinate ids it may map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserIds {
    pub uid: u32,
    pub gid: u32,
    pub name: Option<String>,
    pub subuid: Option<IdRange>,
    pub subgid: Option<IdRange>,
}

/// How agentrun runs on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Privilege {
    /// Effective uid 0: everything (idmapped mounts, cgroups, the sandbox uid range).
    Root,
    /// An ordinary user: sandboxes in a user namespace of its own.
    Rootless(UserIds),
}

/// The setuid helpers that write a mapping with subordinate ids.
pub const NEWUIDMAP: &str = "newuidmap";
pub const NEWGIDMAP: &str = "newgidmap";

impl Privilege {
    /// The effective uid decides; a user's name and subordinate ranges are read from
    /// `/etc/passwd`, `/etc/subuid` and `/etc/subgid`.
    pub fn detect() -> Privilege {
        let uid = nix::unistd::geteuid().as_raw();
        if uid == 0 {
            return Privilege::Root;
        }
        let gid = nix::unistd::getegid().as_raw();
        let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name);
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let subuid = subordinate_range(&read("/etc/subuid"), name.as_deref(), uid);
        let subgid = subordinate_range(&read("/etc/subgid"), name.as_deref(), uid);
        Privilege::Rootless(UserIds {
            uid,
            gid,
            name,
            subuid,
            subgid,
        })
    }

    pub fn is_root(&self) -> bool {
        matches!(self, Privilege::Root)
    }

    /// `root` or `rootless` (for `agentrun info` and spans).
    pub fn as_str(&self) -> &'static str {
        match self {
            Privilege::Root => "root",
            Privilege::Rootless(_) => "rootless",
        }
    }

    /// The default image store: `/var/lib/agentrun`, or `$XDG_DATA_HOME/agentrun` (else
    /// `$HOME/.local/share/agentrun`) for a user.
    pub fn default_root(&self, env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
        match self {
            Privilege::Root => PathBuf::from("/var/lib/agentrun"),
            Privilege::Rootless(ids) => under(env, "XDG_DATA_HOME")
                .unwrap_or_else(|| home(env, ids.uid).join(".local/share/agentrun")),
        }
    }

    /// The default state dir: `/run/agentrun`, or `$XDG_RUNTIME_DIR/agentrun` for a user.
    /// Without one (`su`, `runuser`, cron): `/run/user/<uid>/agentrun` when that directory is
    /// the user's, else `/tmp/agentrun-<uid>` when /tmp is writable by all, else
    /// `~/.local/state/agentrun/run`. [`crate::mounts::hostdirs`] makes it private (0700).
    pub fn default_state_dir(&self, env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
        match self {
            Privilege::Root => PathBuf::from("/run/agentrun"),
            Privilege::Rootless(ids) => {
                if let Some(d) = under(env, "XDG_RUNTIME_DIR") {
                    return d;
                }
                use std::os::unix::fs::MetadataExt;
                let run_user = PathBuf::from(format!("/run/user/{}", ids.uid));
                if std::fs::metadata(&run_user).is_ok_and(|m| m.is_dir() && m.uid() == ids.uid) {
                    return run_user.join("agentrun");
                }
                if std::fs::metadata("/tmp").is_ok_and(|m| m.mode() & 0o1002 == 0o1002) {
                    return PathBuf::from(format!("/tmp/agentrun-{}", ids.uid));
                }
                home(env, ids.uid).join(".local/state/agentrun/run")
            }
        }
    }
}

fn home(env: &dyn Fn(&str) -> Option<String>, uid: u32) -> PathBuf {
    if let Some(h) = env("HOME").filter(|h| h.starts_with('/')) {
        return PathBuf::from(h);
    }
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.dir)
        .unwrap_or_else(|| PathBuf::from(format!("/tmp/agentrun-home-{uid}")))
}

/// The first `/etc/subuid`-style range (`name:start:count`, or `uid:start:count`) of the user.
pub fn subordinate_range(content: &str, name: Option<&str>, uid: u32) -> Option<IdRange> {
    let uid_s = uid.to_string();
    content.lines().find_map(|l| {
        let mut f = l.trim().split(':');
        let who = f.next()?;
        if who != uid_s && Some(who) != name {
            return None;
        }
        let start = f.next()?.parse().ok()?;
        let count: u32 = f.next()?.parse().ok()?;
        (count > 0).then_some(IdRange { start, count })
    })
}

/// The user namespace mapping of a rootless sandbox: the caller is root inside, and ids
/// 1..=count are its subordinate range when it has one. Each element is
/// `(inside, outside, count)`.
pub fn mapping(own: u32, sub: Option<IdRange>) -> Vec<(u32, u32, u32)> {
    let mut m = vec![(0, own, 1)];
    if let Some(r) = sub {
        m.push((1, r.start, r.count));
    }
    m
}

/// Why an ordinary user cannot create a user namespace here, from what the host says.
#[derive(Debug, Clone, Default)]
pub struct UsernsFacts {
    /// `/proc/sys/user/max_user_namespaces`.
    pub max_user_namespaces: Option<u64>,
    /// `/proc/sys/kernel/unprivileged_userns_clone` (Debian/Ubuntu kernels).
    pub unprivileged_userns_clone: Option<u64>,
    /// `/proc/sys/kernel/apparmor_restrict_unprivileged_userns` (Ubuntu 23.10+).
    pub apparmor_restrict: Option<u64>,
}

impl UsernsFacts {
    pub fn probe() -> UsernsFacts {
        let num = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.trim().parse().ok())
        };
        UsernsFacts {
            max_user_namespaces: num("/proc/sys/user/max_user_namespaces"),
            unprivileged_userns_clone: num("/proc/sys/kernel/unprivileged_userns_clone"),
            apparmor_restrict: num("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
        }
    }

    /// The knob that disables unprivileged user namespaces here, if one does.
    pub fn blocker(&self) -> Option<UsernsBlocker> {
        if self.max_user_namespaces == Some(0) {
            Some(UsernsBlocker::MaxUserNamespaces)
        } else if self.unprivileged_userns_clone == Some(0) {
            Some(UsernsBlocker::UnprivilegedUsernsClone)
        } else if self.apparmor_restrict == Some(1) {
            Some(UsernsBlocker::AppArmor)
        } else {
            None
        }
    }
}

/// What keeps an ordinary user from making a user namespace (each message names the fix,
/// and the weaker mode that needs none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UsernsBlocker {
    #[error(
        "user namespaces are disabled (user.max_user_namespaces is 0): enable them with \
         `sysctl -w user.max_user_namespaces=15000`, {LANDLOCK_ONLY_HINT}"
    )]
    MaxUserNamespaces,
    #[error(
        "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone is 0): \
         enable them with `sysctl -w kernel.unprivileged_userns_clone=1`, {LANDLOCK_ONLY_HINT}"
    )]
    UnprivilegedUsernsClone,
    #[error(
        "AppArmor restricts unprivileged user namespaces \
         (kernel.apparmor_restrict_unprivileged_userns is 1): allow them with `sysctl -w \
         kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile granting \
         `userns` to agentrun, {LANDLOCK_ONLY_HINT}"
    )]
    AppArmor,
}

/// The way out that needs no user namespace, said in every [`UsernsBlocker`].
pub const LANDLOCK_ONLY_HINT: &str = "or run with `--isolation landlock-only` (Landlock + \
                                      seccomp + rlimits, no namespaces: weaker)";

/// `agentrun` under the directory the variable `var` names, when it names an absolute path.
fn under(env: &dyn Fn(&str) -> Option<String>, var: &str) -> Option<PathBuf> {
    let dir = env(var).filter(|d| d.starts_with('/'))?;
    Some(Path::new(&dir).join("agentrun"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn user() -> Privilege {
        Privilege::Rootless(UserIds {
            uid: 1000,
            gid: 1000,
            name: Some("ada".into()),
            subuid: None,
            subgid: None,
        })
    }

    #[test]
    fn root_keeps_the_system_paths() {
        let e = env(&[("XDG_RUNTIME_DIR", "/run/user/0"), ("HOME", "/root")]);
        assert_eq!(
            Privilege::Root.default_root(&e),
            Path::new("/var/lib/agentrun")
        );
        assert_eq!(
            Privilege::Root.default_state_dir(&e),
            Path::new("/run/agentrun")
        );
    }

    #[test]
    fn a_user_gets_xdg_paths() {
        let e = env(&[
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
            ("XDG_DATA_HOME", "/d"),
            ("HOME", "/home/ada"),
        ]);
        assert_eq!(user().default_root(&e), Path::new("/d/agentrun"));
        assert_eq!(
            user().default_state_dir(&e),
            Path::new("/run/user/1000/agentrun")
        );
        let e = env(&[("HOME", "/home/ada"), ("XDG_DATA_HOME", "relative")]);
        assert_eq!(
            user().default_root(&e),
            Path::new("/home/ada/.local/share/agentrun")
        );
    }

    #[test]
    fn subordinate_ranges_by_name_or_uid() {
        let f = "bob:100000:65536\nada:165536:65536\n";
        assert_eq!(
            subordinate_range(f, Some("ada"), 1000),
            Some(IdRange {
                start: 165536,
                count: 65536
            })
        );
        assert_eq!(
            subordinate_range("1000:5:7\n", Some("ada"), 1000),
            Some(IdRange { start: 5, count: 7 })
        );
        assert_eq!(subordinate_range(f, Some("eve"), 1001), None);
        assert_eq!(
            subordinate_range("ada:1:0\nada:x:1\n", Some("ada"), 1),
            None
        );
    }

    #[test]
    fn the_mapping_puts_the_caller_at_root() {
        assert_eq!(mapping(1000, None), vec![(0, 1000, 1)]);
        assert_eq!(
            mapping(
                1000,
                Some(IdRange {
                    start: 165536,
                    count: 65536
                })
            ),
            vec![(0, 1000, 1), (1, 165536, 65536)]
        );
    }

    #[test]
    fn each_blocker_names_its_knob() {
        let f = |m, c, a| UsernsFacts {
            max_user_namespaces: m,
            unprivileged_userns_clone: c,
            apparmor_restrict: a,
        };
        assert_eq!(f(Some(96365), None, None).blocker(), None);
        assert_eq!(f(Some(96365), Some(1), Some(0)).blocker(), None);
        let b = f(Some(0), None, None).blocker().unwrap();
        assert!(b.to_string().contains("user.max_user_namespaces"));
        let b = f(Some(10), Some(0), None).blocker().unwrap();
        assert!(b.to_string().contains("kernel.unprivileged_userns_clone"));
        let b = f(Some(10), Some(1), Some(1)).blocker().unwrap();
        assert!(b
            .to_string()
            .contains("kernel.apparmor_restrict_unprivileged_userns"));
        assert!(b.to_string().contains("--isolation landlock-only"));
    }
}
