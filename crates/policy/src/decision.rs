//! [`Profile::check`]: the one place where allow / deny / escalate decisions are made.
//!
//! Every decision names the rule that made it (`rule_id`, the profile field or flag it comes
//! from, e.g. `filesystem.writable[1]`, `network.allow[0]`, `cli.allow_host[0]`,
//! `network.escalate[0]`) and says why. The kernel mechanisms (Landlock rules, masked paths,
//! the egress proxy's allowlist) are derived from the same profile, so what `check` answers is
//! what the kernel enforces.
//!
//! An **escalate** decision ([`Decision::escalate`]) is a deny until a person approves it:
//! `allow` is false, so code that only looks at `allow` refuses it. A front end that can ask
//! someone ([`crate::approval`]) settles it ([`Decision::settle`]) into an allow or a deny that
//! still says `escalate` ([`Decision::verdict`]) and carries the outcome
//! ([`Decision::escalation`]).
//!
//! Precedence, filesystem writes: `hidden` > `writable` > the workspace (when `rw`) >
//! `escalate_write` > default deny. A `writable` path under an `escalate_write` one is writable
//! (Landlock grants it); an `escalate_write` path under a writable one is refused when the
//! profile is parsed (Landlock cannot take write access back below a writable path).
//! Network: `deny` rules > `allow` rules (and `--allow-host`) > `escalate` rules > the mode's
//! default; the first matching rule in that order decides.
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
    /// Send an HTTP request (`path` without the query) to `host:port`, seen by the egress
    /// proxy in a forwarded request or inside intercepted TLS ([`crate::HttpRule`]).
    Http {
        method: String,
        host: String,
        port: u16,
        path: String,
    },
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
            Action::Http { .. } => "net.http",
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
            Action::Http {
                method,
                host,
                port,
                path,
            } if host.contains(':') => format!("{method} [{host}]:{port}{path}"),
            Action::Http {
                method,
                host,
                port,
                path,
            } => format!("{method} {host}:{port}{path}"),
            Action::SetEnv(k) => k.clone(),
            Action::Kernel { right, target } => format!("{right} {target}"),
        }
    }
}

/// The answer to a [`Profile::check`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Whether the action may go ahead. False for an escalate decision until a person
    /// approved it ([`Decision::settle`]).
    pub allow: bool,
    /// The rule asks a person (verdict `escalate`): `allow` says whether they approved.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub escalate: bool,
    /// How the escalation ended, once it was settled (`None` while nobody was asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation: Option<EscalationOutcome>,
    pub rule_id: String,
    pub reason: String,
}

/// How an escalation ended (recorded as `sandbox.escalation.outcome` and the audit record's
/// `escalation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EscalationOutcome {
    /// A person approved it.
    Approved,
    /// A person (or the front end asking them) said no.
    Denied,
    /// Nobody answered within the bound.
    Timeout,
    /// Nobody could be asked (no terminal, an API without a person behind it, an MCP client
    /// without elicitation).
    NoApprover,
}

impl EscalationOutcome {
    /// `approved`, `denied`, `timeout` or `no_approver`.
    pub fn as_str(self) -> &'static str {
        match self {
            EscalationOutcome::Approved => "approved",
            EscalationOutcome::Denied => "denied",
            EscalationOutcome::Timeout => "timeout",
            EscalationOutcome::NoApprover => "no_approver",
        }
    }
}

/// The prefix of every escalate decision's reason.
pub const NEEDS_APPROVAL: &str = "needs approval";

impl Decision {
    pub fn allow(rule_id: impl Into<String>, reason: impl Into<String>) -> Self {
        Decision {
            allow: true,
            escalate: false,
            escalation: None,
            rule_id: rule_id.into(),
            reason: reason.into(),
        }
    }
    pub fn deny(rule_id: impl Into<String>, reason: impl Into<String>) -> Self {
        Decision {
            allow: false,
            escalate: false,
            escalation: None,
            rule_id: rule_id.into(),
            reason: reason.into(),
        }
    }
    /// An escalate decision on `what` (`connecting to api.github.com:443`): not allowed until
    /// a person approves it; its reason reads "needs approval: {what} is allowed only when a
    /// person approves it".
    pub fn escalate(rule_id: impl Into<String>, what: &str) -> Self {
        Decision {
            allow: false,
            escalate: true,
            escalation: None,
            rule_id: rule_id.into(),
            reason: format!("{NEEDS_APPROVAL}: {what} is allowed only when a person approves it"),
        }
    }
    /// `allow`, `deny` or `escalate` (whatever the escalation's outcome: see `escalation`).
    pub fn verdict(&self) -> &'static str {
        if self.escalate {
            "escalate"
        } else if self.allow {
            "allow"
        } else {
            "deny"
        }
    }
    /// An escalate decision nobody has been asked about yet.
    pub fn needs_approval(&self) -> bool {
        self.escalate && self.escalation.is_none()
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

/// The first entry of `list` that `path` is under or above (either contains the other).
fn first_overlapping<'a>(list: &'a [PathBuf], path: &Path) -> Option<(usize, &'a PathBuf)> {
    list.iter()
        .enumerate()
        .find(|(_, p)| path.starts_with(p) || p.starts_with(path))
}

impl Profile {
    /// Decides `action` under this profile.
    pub fn check(&self, action: &Action) -> Decision {
        match action {
            Action::Read(p) => self.check_read(p),
            Action::Write(p) => self.check_write(p),
            Action::Mount { target, writable } => self.check_mount(target, *writable),
            Action::Connect { host, port } => self.network.check(host, *port),
            Action::Http {
                method,
                host,
                port,
                path,
            } => self
                .network
                .check_http(&crate::request::HttpRequest {
                    method,
                    host,
                    port: *port,
                    path,
                    fields: &[],
                })
                .unwrap_or_else(|| {
                    Decision::allow("network.http_default", "no HTTP rule names the host")
                }),
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
        if let Some((i, _)) = first_under(&self.filesystem.escalate_write, &path) {
            return Decision::escalate(
                format!("filesystem.escalate_write[{i}]"),
                &format!("writing {}", path.display()),
            );
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
        // A process cannot be asked: a read-write mount over (or holding) a path whose writes
        // need approval would let processes write there without anyone asked.
        if let Some((i, e)) = writable
            .then(|| first_overlapping(&self.filesystem.escalate_write, &target))
            .flatten()
        {
            return Decision::deny(
                format!("filesystem.escalate_write[{i}]"),
                format!(
                    "a read-write mount at {} would let processes write {} without approval",
                    target.display(),
                    e.display()
                ),
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
    /// workspace when it is writable, and `extra` (read-write mount targets) except those over
    /// or under an `escalate_write` path: a process cannot be asked, so writes needing approval
    /// are denied by the kernel (parsing already keeps them out of the writable paths).
    pub fn landlock_writable(&self, extra: impl IntoIterator<Item = PathBuf>) -> Vec<PathBuf> {
        let mut v = self.filesystem.writable.clone();
        if self.filesystem.workspace_writable {
            v.push(WORKSPACE.into());
        }
        let escalate = &self.filesystem.escalate_write;
        v.extend(extra.into_iter().filter(|p| {
            let p = normalize(p).unwrap_or_else(|| p.clone());
            first_overlapping(escalate, &p).is_none()
        }));
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

    /// What `p` lets processes write, with read-write mounts at `mounts`.
    fn writable(p: &Profile, mounts: &[&str]) -> Vec<String> {
        let paths = p.landlock_writable(mounts.iter().map(PathBuf::from));
        paths.iter().map(|p| p.display().to_string()).collect()
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
            writable(&p, &["/data"]),
            ["/data", "/tmp", "/workspace/out"]
        );
    }

    /// Escalate next to allow, deny, writable and hidden: (action, verdict, rule).
    #[test]
    fn escalate_decisions_table() {
        let p = profile(
            r#"
[filesystem]
workspace = "ro"
writable = ["/tmp", "/etc/app/cache"]
hidden = ["/etc/app/secret"]
escalate_write = ["/etc/app", "/workspace/deploy"]
[network]
mode = "allowlist"
deny = ["evil.github.com"]
allow = ["api.github.com:443", "pypi.org:443"]
escalate = ["*.github.com:443", "127.0.0.1:8080", "10.0.0.0/8:5432"]
"#,
        );
        let w = |s: &str| Action::Write(s.into());
        let c = |h: &str, port: u16| Action::Connect {
            host: h.into(),
            port,
        };
        let m = |target: &str, writable: bool| Action::Mount {
            target: target.into(),
            writable,
        };
        let cases: Vec<(Action, &str, &str)> = vec![
            (
                w("/etc/app/config.toml"),
                "escalate",
                "filesystem.escalate_write[0]",
            ),
            (w("/etc/app"), "escalate", "filesystem.escalate_write[0]"),
            (
                w("/etc/app/../app/x"),
                "escalate",
                "filesystem.escalate_write[0]",
            ),
            (
                w("/workspace/deploy/run.sh"),
                "escalate",
                "filesystem.escalate_write[1]",
            ),
            // hidden > escalate_write; writable (under it) > escalate_write
            (w("/etc/app/secret/k"), "deny", "filesystem.hidden[0]"),
            (w("/etc/app/cache/x"), "allow", "filesystem.writable[1]"),
            (w("/etc/application"), "deny", "filesystem.default"),
            (w("/workspace/x"), "deny", "filesystem.default"),
            (w("/tmp/x"), "allow", "filesystem.writable[0]"),
            // reading is not escalated
            (
                Action::Read("/etc/app/config.toml".into()),
                "allow",
                "filesystem.readable[0]",
            ),
            // deny > allow > escalate > default
            (c("evil.github.com", 443), "deny", "network.deny[0]"),
            (c("api.github.com", 443), "allow", "network.allow[0]"),
            (
                c("uploads.github.com", 443),
                "escalate",
                "network.escalate[0]",
            ),
            (c("uploads.github.com", 80), "deny", "network.default"),
            (c("github.com", 443), "deny", "network.default"),
            (c("127.0.0.1", 8080), "escalate", "network.escalate[1]"),
            (c("10.1.2.3", 5432), "escalate", "network.escalate[2]"),
            (c("example.com", 443), "deny", "network.default"),
            // a read-write mount over or under an escalate_write path: no one could be asked
            (
                m("/etc/app/data", true),
                "deny",
                "filesystem.escalate_write[0]",
            ),
            (m("/etc", true), "deny", "filesystem.escalate_write[0]"),
            (m("/etc/app/data", false), "allow", "filesystem.mounts"),
        ];
        for (action, verdict, rule) in &cases {
            let d = p.check(action);
            assert_eq!(
                (d.verdict(), d.rule_id.as_str()),
                (*verdict, *rule),
                "{action:?}: {d:?}"
            );
            assert_eq!(
                d.allow,
                *verdict == "allow",
                "escalate is not allowed: {d:?}"
            );
            if *verdict == "escalate" {
                assert!(d.needs_approval());
                assert!(d.reason.starts_with("needs approval: "), "{d:?}");
                assert!(d
                    .reason
                    .ends_with("is allowed only when a person approves it"));
            }
        }
        let d = p.check(&c("uploads.github.com", 443));
        assert_eq!(
            d.reason,
            "needs approval: connecting to uploads.github.com:443 is allowed only when a person approves it"
        );
        // Processes are never given write access to an escalate_write path, not even through
        // a read-write mount over or under one.
        let mounts = ["/etc/app/data", "/etc", "/srv", "/etc/app/../app/x"];
        assert_eq!(writable(&p, &mounts), ["/etc/app/cache", "/srv", "/tmp"]);
    }

    /// An allowed name that resolves to an address an escalate rule names needs approval; a
    /// name that needs approval may reach a private address only if its escalate rule names it
    /// exactly.
    #[test]
    fn escalate_and_resolved_addresses() {
        let p = profile(
            r#"
[network]
mode = "allowlist"
allow = ["*.corp.example:443"]
escalate = ["10.9.0.0/16:443", "db.corp2.example:443", "*.corp3.example:443"]
"#,
        );
        let n = &p.network;
        let check = |host: &str, ip: &str| {
            let d = n.check(host, 443);
            n.check_address(host, 443, &d, ip.parse().unwrap())
        };
        let d = check("www.corp.example", "10.9.1.1");
        assert_eq!(
            (d.verdict(), d.rule_id.as_str()),
            ("escalate", "network.escalate[0]")
        );
        assert!(!d.allow);
        assert_eq!(
            check("www.corp.example", "93.184.216.34").verdict(),
            "allow"
        );
        let d = check("db.corp2.example", "10.1.1.1");
        assert_eq!(
            (d.verdict(), d.rule_id.as_str()),
            ("escalate", "network.escalate[1]")
        );
        let d = check("x.corp3.example", "10.1.1.1");
        assert_eq!(
            (d.verdict(), d.rule_id.as_str()),
            ("deny", "network.resolved_address")
        );
        let d = check("x.corp3.example", "127.0.0.1");
        assert_eq!(d.verdict(), "deny");
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
