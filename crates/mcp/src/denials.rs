//! What the policy refused, said so that a model can act on it: the rule, and a reason that
//! names what *is* allowed ("writes are allowed only under /workspace, /tmp"), not a bare
//! errno.
//!
//! Denials reach a tool's result three ways:
//! - the profile's own decision on a file tool's path ([`Denial::of`], decided before
//!   anything runs);
//! - the egress proxy's decisions during a run (exact: the proxy decides every connection);
//! - the kernel's refusals of a run's own accesses (Landlock, a network namespace without a
//!   route), which the kernel reports to the process as an errno only: [`explain_output`]
//!   finds them in the run's output and explains each from the profile that set them up.
//!   This is an explanation, not a record: a program that hides its errors shows none, and
//!   the kernel's enforcement does not depend on it.

use std::path::{Path, PathBuf};

use agentrun_policy::{Action, Decision, NetworkMode, Profile, RuleAction, WORKSPACE};
use serde::Serialize;

/// One refusal, as a tool result carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    /// `fs.read`, `fs.write`, `net.connect`.
    pub action: String,
    /// The path or `host:port`.
    pub resource: String,
    /// The profile's rule (`filesystem.writable`, `network.allow`, ...).
    pub rule_id: String,
    /// Why, and what is allowed instead.
    pub reason: String,
    /// Who refused: `policy` (decided before running), `egress-proxy`, or `kernel`.
    pub enforced_by: &'static str,
}

impl Denial {
    /// The denial of `action` by `d`, its reason completed with what the profile allows.
    pub fn of(profile: &Profile, action: &Action, d: &Decision, enforced_by: &'static str) -> Self {
        let advice = advice(profile, action);
        Denial {
            action: action.name().into(),
            resource: action.resource(),
            rule_id: d.rule_id.clone(),
            reason: if advice.is_empty() {
                d.reason.clone()
            } else {
                format!("{}; {advice}", d.reason)
            },
            enforced_by,
        }
    }

    /// One line for a model: `denied: fs.write /etc/x (rule ...): reason`.
    pub fn line(&self) -> String {
        format!(
            "denied: {} {} (rule {}): {}",
            self.action, self.resource, self.rule_id, self.reason
        )
    }
}

fn list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the profile allows of `action`'s kind, in words.
pub fn advice(profile: &Profile, action: &Action) -> String {
    let fs = &profile.filesystem;
    match action {
        Action::Write(_) => {
            let mut places = Vec::new();
            if fs.workspace_writable {
                places.push(PathBuf::from(WORKSPACE));
            }
            places.extend(fs.writable.iter().cloned());
            if places.is_empty() {
                "this sandbox may write nowhere".into()
            } else {
                format!("writes are allowed only under {}", list(&places))
            }
        }
        Action::Read(_) => {
            let mut places = vec![PathBuf::from(WORKSPACE)];
            places.extend(fs.readable.iter().cloned());
            places.extend(fs.writable.iter().cloned());
            let mut s = format!("reads are allowed only under {}", list(&places));
            if !fs.hidden.is_empty() {
                s.push_str(&format!(" (hidden: {})", list(&fs.hidden)));
            }
            s
        }
        Action::Connect { .. } => match profile.network.mode {
            NetworkMode::None => {
                "network access is off in this profile (network.mode = \"none\"): no host can be reached".into()
            }
            _ => {
                let allowed: Vec<String> = profile
                    .network
                    .rules
                    .iter()
                    .filter(|r| r.action == RuleAction::Allow)
                    .map(|r| match r.port {
                        Some(port) => format!("{}:{port}", r.host),
                        None => r.host.clone(),
                    })
                    .collect();
                if allowed.is_empty() {
                    "no host is allowed".into()
                } else {
                    format!(
                        "only these hosts are reachable (through HTTP(S)_PROXY): {}",
                        allowed.join(", ")
                    )
                }
            }
        },
        _ => String::new(),
    }
}

/// Error texts that mean the kernel refused a file access.
const FS_REFUSALS: &[&str] = &[
    "Permission denied",
    "Read-only file system",
    "Operation not permitted",
];

/// Error texts that mean no route out (a sandbox without network).
const NET_REFUSALS: &[&str] = &[
    "Network is unreachable",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Could not resolve host",
    "No address associated with hostname",
    "[Errno -3]",
    "[Errno -2]",
    "[Errno 101]",
];

/// The first absolute path in an error line (`'/etc/x'`, `/etc/x:`, ...).
fn path_in(line: &str) -> Option<PathBuf> {
    line.split(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`' | '(' | '['))
        .map(|t| t.trim_end_matches([':', ',', ')', ']', '.', '\'', '"']))
        .find(|t| t.starts_with('/') && t.len() > 1)
        .map(PathBuf::from)
}

/// The kernel refusals a run's output shows, each explained from `profile` (see the module
/// doc); at most one per (action, resource).
pub fn explain_output(profile: &Profile, outputs: &[&str]) -> Vec<Denial> {
    let mut out: Vec<Denial> = Vec::new();
    let mut push = |d: Denial| {
        if !out
            .iter()
            .any(|o| o.action == d.action && o.resource == d.resource)
        {
            out.push(d);
        }
    };
    for line in outputs.iter().flat_map(|o| o.lines()) {
        if FS_REFUSALS.iter().any(|r| line.contains(r)) {
            if let Some(path) = path_in(line) {
                if let Some(d) = explain_path(profile, &path) {
                    push(d);
                }
            }
        } else if profile.network.mode == NetworkMode::None
            && NET_REFUSALS.iter().any(|r| line.contains(r))
        {
            let action = Action::Connect {
                host: "*".into(),
                port: 0,
            };
            push(Denial {
                action: action.name().into(),
                resource: "network".into(),
                rule_id: "network.mode".into(),
                reason: advice(profile, &action),
                enforced_by: "kernel",
            });
        }
    }
    out
}

/// Why the profile refuses access to `path`: a read denial when it may not be read, else a
/// write denial when it may not be written; `None` when the profile allows both (the kernel
/// refused for another reason, e.g. the file's mode).
fn explain_path(profile: &Profile, path: &Path) -> Option<Denial> {
    [Action::Read(path.into()), Action::Write(path.into())]
        .into_iter()
        .find_map(|a| {
            let d = profile.check(&a);
            (!d.allow).then(|| Denial::of(profile, &a, &d, "kernel"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Profile {
        Profile::builtin("strict").unwrap()
    }

    #[test]
    fn paths_are_found_in_the_usual_error_lines() {
        for (line, path) in [
            (
                "PermissionError: [Errno 13] Permission denied: '/etc/x'",
                "/etc/x",
            ),
            ("sh: 1: cannot create /etc/x: Permission denied", "/etc/x"),
            (
                "touch: cannot touch '/usr/y': Read-only file system",
                "/usr/y",
            ),
            ("cat: /root/.ssh/id: Permission denied", "/root/.ssh/id"),
        ] {
            assert_eq!(path_in(line), Some(PathBuf::from(path)), "{line}");
        }
        assert_eq!(path_in("Permission denied"), None);
    }

    #[test]
    fn kernel_refusals_are_explained_from_the_profile() {
        let p = profile();
        let out = "Traceback...\nPermissionError: [Errno 13] Permission denied: '/etc/passwd'\n";
        let d = explain_output(&p, &[out]);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].action, "fs.read");
        assert_eq!(d[0].resource, "/etc/passwd");
        assert_eq!(d[0].enforced_by, "kernel");
        assert!(
            d[0].reason.contains("reads are allowed only under"),
            "{d:?}"
        );
        // Readable but not writable: a write denial naming where writes may go.
        let d = explain_output(&p, &["touch: cannot touch '/usr/x': Permission denied"]);
        assert_eq!(d[0].action, "fs.write");
        assert!(
            d[0].reason
                .contains("writes are allowed only under /workspace/out, /tmp"),
            "{d:?}"
        );
        // The same refusal twice is one denial; a refusal the profile does not explain, none.
        let twice = "cat: /etc/a: Permission denied\ncat: /etc/a: Permission denied";
        assert_eq!(explain_output(&p, &[twice]).len(), 1);
        assert!(explain_output(&p, &["cat: /tmp/a: Permission denied"]).is_empty());
    }

    #[test]
    fn no_network_is_explained() {
        let p = profile();
        assert_eq!(p.network.mode, NetworkMode::None);
        let d = explain_output(
            &p,
            &["urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name resolution>"],
        );
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].action, "net.connect");
        assert!(d[0].reason.contains("network access is off"), "{d:?}");
    }
}
