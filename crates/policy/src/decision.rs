//! [`Profile::check`]: the one place where allow/deny decisions are made.
//!
//! Every decision names the rule that made it (`rule_id`, the profile field or flag it comes
//! from, e.g. `filesystem.writable[1]`, `network.allow[0]`, `cli.allow_host[0]`) and says why.
//! The kernel mechanisms (Landlock rules, masked paths, the egress proxy's allowlist) are
//! derived from the same profile, so what `check` answers is what the kernel enforces.
//!
//! Paths are judged lexically (`..` and `.` resolved without touching the filesystem): a
//! symlink is resolved by the kernel when it is used, and Landlock judges its target.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::Profile;

/// Where a sandbox's workspace appears.
pub const WORKSPACE: &str = "/workspace";

/// Something a sandbox (or its caller) tries to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Read a file or list a directory.
    Read(PathBuf),
    /// Create, modify or delete under a path.
    Write(PathBuf),
    /// Mount a host path at `target` (read-only or read-write).
    Mount { target: PathBuf, writable: bool },
    /// Open a TCP connection to `host:port` (through the egress proxy).
    Connect { host: String, port: u16 },
    /// Set an environment variable for the sandboxed command.
    SetEnv(String),
    /// Something the kernel denied that is not a path (e.g. a Landlock scope: signalling or
    /// reaching an abstract socket outside the sandbox), as the kernel described it.
    Kernel { right: String, target: String },
}

impl Action {
    /// The action's name as recorded (`fs.read`, `fs.write`, `fs.mount`, `net.connect`,
    /// `env.set`).
    pub fn name(&self) -> &'static str {
        match self {
            Action::Read(_) => "fs.read",
            Action::Write(_) => "fs.write",
            Action::Mount { .. } => "fs.mount",
            Action::Connect { .. } => "net.connect",
            Action::SetEnv(_) => "env.set",
            Action::Kernel { .. } => "kernel.scope",
        }
    }

    /// The resource acted on, as recorded (`/etc/passwd`, `rw:/data`, `pypi.org:443`, `KEY`).
    pub fn resource(&self) -> String {
        match self {
            Action::Read(p) | Action::Write(p) => p.display().to_string(),
            Action::Mount { target, writable } => {
                format!(
                    "{}:{}",
                    if *writable { "rw" } else { "ro" },
                    target.display()
                )
            }
            Action::Connect { host, port } if host.contains(':') => format!("[{host}]:{port}"),
            Action::Connect { host, port } => format!("{host}:{port}"),
            Action::SetEnv(k) => k.clone(),
            Action::Kernel { right, target } => format!("{right} {target}"),
        }
    }
}

/// The answer to a [`Profile::check`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub allow: bool,
    pub rule_id: String,
    pub reason: String,
}

impl Decision {
    pub fn allow(rule_id: impl Into<String>, reason: impl Into<String>) -> Self {
        Decision {
            allow: true,
            rule_id: rule_id.into(),
            reason: reason.into(),
        }
    }
    pub fn deny(rule_id: impl Into<String>, reason: impl Into<String>) -> Self {
        Decision {
            allow: false,
            rule_id: rule_id.into(),
            reason: reason.into(),
        }
    }
    /// `allow` or `deny`.
    pub fn verdict(&self) -> &'static str {
        if self.allow {
            "allow"
        } else {
            "deny"
        }
    }
}

/// Resolves `.` and `..` lexically; `None` for a relative path.
pub fn normalize(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Some(out)
}

/// The first entry of `list` that `path` is under (or equal to), with its index.
fn first_under<'a>(list: &'a [PathBuf], path: &Path) -> Option<(usize, &'a PathBuf)> {
    list.iter().enumerate().find(|(_, p)| path.starts_with(p))
}

impl Profile {
    /// Decides `action` under this profile.
    pub fn check(&self, action: &Action) -> Decision {
        match action {
            Action::Read(p) => self.check_read(p),
            Action::Write(p) => self.check_write(p),
            Action::Mount { target, writable } => self.check_mount(target, *writable),
            Action::Connect { host, port } => self.network.check(host, *port),
            Action::SetEnv(key) => self.check_env(key),
            Action::Kernel { right, .. } => Decision::deny(
                "landlock.scope",
                format!("{right}: the sandbox may not reach processes or sockets outside it"),
            ),
        }
    }

    fn hidden(&self, path: &Path) -> Option<Decision> {
        first_under(&self.filesystem.hidden, path).map(|(i, h)| {
            Decision::deny(
                format!("filesystem.hidden[{i}]"),
                format!("{} is hidden ({} is masked)", path.display(), h.display()),
            )
        })
    }

    fn check_read(&self, path: &Path) -> Decision {
        let Some(path) = normalize(path) else {
            return Decision::deny("filesystem.path", "relative paths are not decided");
        };
        if let Some(d) = self.hidden(&path) {
            return d;
        }
        if path.starts_with(WORKSPACE) {
            return Decision::allow("filesystem.workspace", "the workspace is readable");
        }
        if let Some((i, p)) = first_under(&self.filesystem.writable, &path) {
            return Decision::allow(
                format!("filesystem.writable[{i}]"),
                format!("under writable {}", p.display()),
            );
        }
        if let Some((i, p)) = first_under(&self.filesystem.readable, &path) {
            return Decision::allow(
                format!("filesystem.readable[{i}]"),
                format!("under readable {}", p.display()),
            );
        }
        Decision::deny(
            "filesystem.default",
            format!("{} is not under a readable path", path.display()),
        )
    }

    fn check_write(&self, path: &Path) -> Decision {
        let Some(path) = normalize(path) else {
            return Decision::deny("filesystem.path", "relative paths are not decided");
        };
        if let Some(d) = self.hidden(&path) {
            return d;
        }
        if let Some((i, p)) = first_under(&self.filesystem.writable, &path) {
            return Decision::allow(
                format!("filesystem.writable[{i}]"),
                format!("under writable {}", p.display()),
            );
        }
        if path.starts_with(WORKSPACE) && self.filesystem.workspace_writable {
            return Decision::allow("filesystem.workspace", "the workspace is writable");
        }
        Decision::deny(
            "filesystem.default",
            format!("{} is not under a writable path", path.display()),
        )
    }

    fn check_mount(&self, target: &Path, writable: bool) -> Decision {
        let Some(target) = normalize(target) else {
            return Decision::deny("filesystem.path", "mount targets must be absolute");
        };
        if let Some(d) = self.hidden(&target) {
            return d;
        }
        if writable && !self.filesystem.rw_mounts {
            return Decision::deny(
                "filesystem.rw_mounts",
                "the profile allows no read-write mounts (rw_mounts = false)",
            );
        }
        Decision::allow(
            "filesystem.mounts",
            format!(
                "{} mount at {} allowed",
                if writable { "read-write" } else { "read-only" },
                target.display()
            ),
        )
    }

    fn check_env(&self, key: &str) -> Decision {
        match &self.env_allow {
            None => Decision::allow("env.allow", "the profile allows any variable"),
            Some(list) => match list.iter().position(|k| k == key) {
                Some(i) => Decision::allow(format!("env.allow[{i}]"), format!("{key} is allowed")),
                None => Decision::deny("env.allow", format!("{key} is not in env.allow")),
            },
        }
    }

    /// Paths the sandboxed process may read (Landlock read rules): the readable paths plus the
    /// workspace.
    pub fn landlock_readable(&self) -> Vec<PathBuf> {
        let mut v = self.filesystem.readable.clone();
        v.push(WORKSPACE.into());
        v
    }

    /// Paths the sandboxed process may write (Landlock write rules): the writable paths, the
    /// workspace when it is writable, and `extra` (read-write mount targets).
    pub fn landlock_writable(&self, extra: impl IntoIterator<Item = PathBuf>) -> Vec<PathBuf> {
        let mut v = self.filesystem.writable.clone();
        if self.filesystem.workspace_writable {
            v.push(WORKSPACE.into());
        }
        v.extend(extra);
        v.sort();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(text: &str) -> Profile {
        Profile::parse(text, "t.toml").unwrap()
    }

    #[test]
    fn normalize_resolves_dots() {
        assert_eq!(
            normalize(Path::new("/workspace/../etc/./passwd")),
            Some("/etc/passwd".into())
        );
        assert_eq!(normalize(Path::new("/../..")), Some("/".into()));
        assert_eq!(normalize(Path::new("rel")), None);
    }

    #[test]
    fn filesystem_decisions() {
        let p = profile(
            r#"
[filesystem]
workspace = "ro"
readable = ["/usr", "/bin"]
writable = ["/workspace/out", "/tmp"]
hidden = ["/usr/secret"]
"#,
        );
        let read = |s: &str| p.check(&Action::Read(s.into()));
        let write = |s: &str| p.check(&Action::Write(s.into()));
        assert_eq!(read("/workspace/a").rule_id, "filesystem.workspace");
        assert!(read("/workspace/a").allow);
        let d = read("/workspace/../etc/passwd");
        assert!(!d.allow);
        assert_eq!(d.rule_id, "filesystem.default");
        assert!(d.reason.contains("/etc/passwd"), "{d:?}");
        assert_eq!(read("/usr/lib/x").rule_id, "filesystem.readable[0]");
        let d = read("/usr/secret/key");
        assert!(!d.allow);
        assert_eq!(d.rule_id, "filesystem.hidden[0]");
        assert!(!write("/workspace/a").allow, "workspace is read-only");
        let d = write("/workspace/out/r.txt");
        assert!(d.allow);
        assert_eq!(d.rule_id, "filesystem.writable[0]");
        assert!(!write("/usr/bin/x").allow);
        assert!(!write("relative").allow);
        assert_eq!(
            p.landlock_writable(["/data".into()]),
            vec![
                PathBuf::from("/data"),
                "/tmp".into(),
                "/workspace/out".into()
            ]
        );
    }

    #[test]
    fn mount_env_and_network_decisions() {
        let p = profile(
            r#"
[filesystem]
hidden = ["/secrets"]
rw_mounts = false
[env]
allow = ["API_URL"]
[network]
mode = "allowlist"
allow = ["pypi.org:443"]
"#,
        );
        let m = |t: &str, w| {
            p.check(&Action::Mount {
                target: t.into(),
                writable: w,
            })
        };
        assert!(m("/data", false).allow);
        assert_eq!(m("/data", true).rule_id, "filesystem.rw_mounts");
        assert_eq!(m("/secrets/x", false).rule_id, "filesystem.hidden[0]");
        assert!(p.check(&Action::SetEnv("API_URL".into())).allow);
        let d = p.check(&Action::SetEnv("AWS_SECRET".into()));
        assert!(!d.allow);
        assert_eq!(d.rule_id, "env.allow");
        let c = Action::Connect {
            host: "pypi.org".into(),
            port: 443,
        };
        assert_eq!(c.name(), "net.connect");
        assert_eq!(c.resource(), "pypi.org:443");
        assert_eq!(p.check(&c).rule_id, "network.allow[0]");
    }
}
