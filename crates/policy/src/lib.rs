//! Sandbox profiles: policy as code.
//!
//! A [`Profile`] says what a sandbox may do: which paths it may read, write or never see,
//! which hosts it may reach, which resources it gets, which environment variables it may be
//! given and which seccomp baseline applies. Profiles are TOML files (`bundles/*.toml` ships
//! the built-in ones). [`Profile::check`] ([`decision`]) is the single place where allow /
//! deny / escalate decisions are made; [`approval`] is the hook through which a front end asks
//! a person about an escalate decision. This crate is pure: it parses, validates and decides,
//! and the runtime and the egress proxy translate the same profile into kernel mechanisms.

pub mod approval;
pub mod decision;
pub mod exit;
mod host;
pub mod http;
pub mod network;
mod request;
pub mod seccomp;
mod units;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use approval::{
    ask_blocking, no_answer_within, Answer, Approval, ApprovalFuture, Approvals, Approver,
    EscalationRequest, DEFAULT_APPROVAL_TIMEOUT,
};
pub use decision::{normalize, Action, Decision, EscalationOutcome, NEEDS_APPROVAL, WORKSPACE};
pub use http::{check_http, HttpRule, HttpRuleError};
pub use network::{
    AddressScope, CredentialSpecError, HostRule, HostRuleError, IpNet, NetworkMode, NetworkPolicy,
    NetworkPolicyError, OpenSandboxPolicy, OpenSandboxRule, RuleAction, MAX_OPENSANDBOX_RULES,
};
pub use request::HttpRequest;
pub use seccomp::{
    seccomp_denied_syscalls, SocketPolicy, UnknownSocketFamily, PERSONALITY_ALLOWED,
    SOCKET_FAMILIES,
};
pub use units::{format_bytes, parse_bytes, parse_duration, UnitError};

/// Errors from loading or validating a profile.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("unknown profile {0:?} (built-in profiles: {1})")]
    UnknownProfile(String, String),
    #[error("cannot read profile {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid profile {origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("invalid profile {origin}: {}field `{field}`: {message}", line.map(|l| format!("line {l}: ")).unwrap_or_default())]
    Invalid {
        origin: String,
        /// 1-based line of the field in the file, when it can be found.
        line: Option<usize>,
        field: &'static str,
        message: String,
    },
}

/// Built-in profiles, embedded from `bundles/`.
const BUILTIN: &[(&str, &str)] = &[
    ("default", include_str!("../../../bundles/default.toml")),
    ("strict", include_str!("../../../bundles/strict.toml")),
    ("build", include_str!("../../../bundles/build.toml")),
    ("container", include_str!("../../../bundles/container.toml")),
    (
        "code-interpreter",
        include_str!("../../../bundles/code-interpreter.toml"),
    ),
];

/// Resource limits, all enforced by cgroups or rlimits.
#[derive(Debug, Clone, PartialEq)]
pub struct Resources {
    /// Memory limit in bytes (swap is not allowed on top of it).
    pub memory_bytes: u64,
    /// Maximum number of tasks (processes + threads).
    pub pids: u32,
    /// CPU quota in cores (1.5 = 150 ms per 100 ms period).
    pub cpus: f64,
    /// Size cap of the tmpfs that holds the rootfs's writable layer.
    pub tmpfs_bytes: u64,
    /// RLIMIT_NOFILE.
    pub nofile: u64,
    /// Wall-clock limit of a run.
    pub timeout: Option<Duration>,
    /// Bytes of stdout and of stderr passed on per run; the rest is dropped (and reported).
    pub output_cap: Option<u64>,
}

/// The filesystem view of a sandbox (enforced by Landlock and masked mounts).
#[derive(Debug, Clone, PartialEq)]
pub struct FsPolicy {
    /// Whether `/workspace` may be written (`workspace = "rw"`, the default) or only read.
    pub workspace_writable: bool,
    /// Paths that may be read and executed (besides the workspace and writable paths).
    pub readable: Vec<PathBuf>,
    /// Paths (besides the workspace and read-write mounts) that may be written.
    pub writable: Vec<PathBuf>,
    /// Paths masked inside the sandbox (empty tmpfs or /dev/null over them).
    pub hidden: Vec<PathBuf>,
    /// Paths whose writes need a person's approval (`escalate_write`): never writable by
    /// processes in the sandbox (Landlock cannot pause to ask), and [`Profile::check`] answers
    /// escalate for a write there (a front end that can ask, e.g. an MCP `write_file`, asks).
    pub escalate_write: Vec<PathBuf>,
    /// Whether `--rw` mounts are allowed.
    pub rw_mounts: bool,
}

/// A validated profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub filesystem: FsPolicy,
    pub network: NetworkPolicy,
    pub resources: Resources,
    /// Environment every sandboxed process starts with (the host's is never inherited).
    pub env_defaults: BTreeMap<String, String>,
    /// Variables a caller may set (`-e`); `None`: any.
    pub env_allow: Option<Vec<String>>,
    /// Seccomp baseline name; `default` is the Docker-like deny list in [`seccomp_denied_syscalls`].
    pub seccomp_baseline: String,
    /// The sockets the seccomp baseline lets the sandbox open (`[seccomp]
    /// allow_socket_families` on top of the baseline's; see [`seccomp`]).
    pub seccomp_sockets: SocketPolicy,
    /// `[python]`: a zygote per pooled shell (see [`PythonSettings`]).
    pub python: PythonSettings,
}

/// `[python]` of a profile: whether each pooled shell keeps a Python zygote (a python3 started
/// ahead, with `preload` imported, that forks the process of each `python3` run instead of an
/// exec), and what it imports. A module that cannot be imported is reported and skipped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PythonSettings {
    pub zygote: bool,
    pub preload: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    name: Option<String>,
    #[serde(default)]
    filesystem: RawFilesystem,
    #[serde(default)]
    network: RawNetwork,
    #[serde(default)]
    resources: RawResources,
    #[serde(default)]
    env: RawEnv,
    #[serde(default)]
    seccomp: RawSeccomp,
    #[serde(default)]
    python: RawPython,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPython {
    #[serde(default)]
    zygote: bool,
    #[serde(default)]
    preload: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFilesystem {
    workspace: Option<String>,
    readable: Option<Vec<PathBuf>>,
    #[serde(default)]
    writable: Vec<PathBuf>,
    #[serde(default)]
    hidden: Vec<PathBuf>,
    #[serde(default)]
    escalate_write: Vec<PathBuf>,
    rw_mounts: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNetwork {
    #[serde(default)]
    mode: NetworkMode,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    escalate: Vec<String>,
    #[serde(default)]
    http_deny: Vec<String>,
    #[serde(default)]
    http_allow: Vec<String>,
    #[serde(default)]
    http_escalate: Vec<String>,
    #[serde(default)]
    credentials: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawResources {
    memory: Option<String>,
    pids: Option<u32>,
    cpus: Option<f64>,
    tmpfs_size: Option<String>,
    nofile: Option<u64>,
    timeout: Option<String>,
    output_cap: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawEnv {
    #[serde(default)]
    defaults: BTreeMap<String, String>,
    allow: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSeccomp {
    baseline: Option<String>,
    #[serde(default)]
    allow_socket_families: Vec<String>,
}

impl Profile {
    /// Loads a built-in profile by name, or a profile file if `name_or_path` contains a `/` or
    /// ends in `.toml`.
    pub fn load(name_or_path: &str) -> Result<Self, PolicyError> {
        if Self::is_file_name(name_or_path) {
            let path = Path::new(name_or_path);
            let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
                path: path.to_owned(),
                source,
            })?;
            return Self::parse(&text, &path.display().to_string());
        }
        Self::builtin(name_or_path)
    }

    /// Whether [`Profile::load`] takes `name_or_path` as a file (it has a `/` or ends in `.toml`).
    pub fn is_file_name(name_or_path: &str) -> bool {
        name_or_path.contains('/') || name_or_path.ends_with(".toml")
    }

    /// A built-in profile by name, parsed the first time this process asks for it (the
    /// daemon asks for one per run; a client process, for the one its run uses: not the
    /// others).
    pub fn builtin(name: &str) -> Result<Self, PolicyError> {
        static PARSED: [std::sync::OnceLock<Profile>; BUILTIN.len()] =
            [const { std::sync::OnceLock::new() }; BUILTIN.len()];
        BUILTIN
            .iter()
            .zip(&PARSED)
            .find(|((n, _), _)| *n == name)
            .map(|((n, text), parsed)| {
                parsed
                    .get_or_init(|| {
                        Self::parse(text, n).expect("built-in profiles are valid (tested)")
                    })
                    .clone()
            })
            .ok_or_else(|| {
                let names: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
                PolicyError::UnknownProfile(name.to_owned(), names.join(", "))
            })
    }

    /// Names of the built-in profiles.
    pub fn builtin_names() -> impl Iterator<Item = &'static str> {
        BUILTIN.iter().map(|(n, _)| *n)
    }

    /// Parses and validates profile TOML; `origin` names the source in error messages, which
    /// give the line and field of the problem when they can.
    pub fn parse(text: &str, origin: &str) -> Result<Self, PolicyError> {
        let raw: RawProfile = toml::from_str(text).map_err(|e| PolicyError::Parse {
            origin: origin.to_owned(),
            message: parse_message(text, &e),
        })?;
        let invalid = |field: &'static str, message: String| PolicyError::Invalid {
            origin: origin.to_owned(),
            line: field_line(text, field),
            field,
            message,
        };
        let bytes = |field: &'static str, v: Option<String>, default: u64| match v {
            Some(s) => parse_bytes(&s).map_err(|e| invalid(field, e.to_string())),
            None => Ok(default),
        };
        let r = raw.resources;
        let resources = Resources {
            memory_bytes: bytes("resources.memory", r.memory, 1 << 30)?,
            pids: r.pids.unwrap_or(512),
            cpus: r.cpus.unwrap_or(2.0),
            tmpfs_bytes: bytes("resources.tmpfs_size", r.tmpfs_size, 256 << 20)?,
            nofile: r.nofile.unwrap_or(1024),
            timeout: r
                .timeout
                .map(|s| {
                    parse_duration(&s).map_err(|e| invalid("resources.timeout", e.to_string()))
                })
                .transpose()?,
            output_cap: r
                .output_cap
                .map(|s| {
                    parse_bytes(&s).map_err(|e| invalid("resources.output_cap", e.to_string()))
                })
                .transpose()?,
        };
        validate_resources(&resources).map_err(|(f, m)| invalid(f, m))?;

        let fs = raw.filesystem;
        let workspace_writable = match fs.workspace.as_deref() {
            None | Some("rw") => true,
            Some("ro") => false,
            Some(other) => {
                return Err(invalid(
                    "filesystem.workspace",
                    format!("{other:?}: expected \"rw\" or \"ro\""),
                ))
            }
        };
        let readable = fs.readable.unwrap_or_else(|| vec![PathBuf::from("/")]);
        for (field, list) in [
            ("filesystem.readable", &readable),
            ("filesystem.writable", &fs.writable),
            ("filesystem.hidden", &fs.hidden),
            ("filesystem.escalate_write", &fs.escalate_write),
        ] {
            for p in list {
                if !p.is_absolute() {
                    return Err(invalid(
                        field,
                        format!("{} is not an absolute path", p.display()),
                    ));
                }
                if p.components().any(|c| c.as_os_str() == "..") {
                    return Err(invalid(field, format!("{} contains '..'", p.display())));
                }
            }
        }
        if let Some(h) = fs.hidden.iter().find(|h| h.as_os_str() == "/") {
            return Err(invalid(
                "filesystem.hidden",
                format!("{} would hide everything", h.display()),
            ));
        }
        validate_escalate_write(
            &fs.escalate_write,
            &fs.writable,
            &fs.hidden,
            workspace_writable,
        )
        .map_err(|m| invalid("filesystem.escalate_write", m.to_string()))?;

        let net = raw.network;
        let mut rules = Vec::new();
        // The order is the precedence (first match wins): deny, allow, escalate.
        for (field, action, list) in [
            ("network.deny", RuleAction::Deny, &net.deny),
            ("network.allow", RuleAction::Allow, &net.allow),
            ("network.escalate", RuleAction::Escalate, &net.escalate),
        ] {
            for (i, spec) in list.iter().enumerate() {
                rules.push(
                    HostRule::parse(format!("{field}[{i}]"), action, spec)
                        .map_err(|m| invalid(field, m.to_string()))?,
                );
            }
        }
        // Each credential's host is allowed (after the allow rules: a deny still wins).
        for (i, spec) in net.credentials.iter().enumerate() {
            let bad = |m: String| invalid("network.credentials", format!("[{i}]: {m}"));
            let target = network::credential_target(spec).map_err(|e| bad(e.to_string()))?;
            rules.push(
                HostRule::parse(
                    format!("network.credentials[{i}]"),
                    RuleAction::Allow,
                    &target,
                )
                .map_err(|e| bad(e.to_string()))?,
            );
        }
        let mut http = Vec::new();
        for (field, action, list) in [
            ("network.http_deny", RuleAction::Deny, &net.http_deny),
            ("network.http_allow", RuleAction::Allow, &net.http_allow),
            (
                "network.http_escalate",
                RuleAction::Escalate,
                &net.http_escalate,
            ),
        ] {
            for (i, spec) in list.iter().enumerate() {
                http.push(
                    HttpRule::parse(format!("{field}[{i}]"), action, spec)
                        .map_err(|m| invalid(field, m.to_string()))?,
                );
            }
        }
        if net.mode == NetworkMode::None && !http.is_empty() {
            return Err(invalid(
                "network.mode",
                "\"none\" cannot have http rules (use mode = \"allowlist\")".into(),
            ));
        }
        if net.mode == NetworkMode::None && !rules.is_empty() {
            return Err(invalid(
                "network.mode",
                "\"none\" cannot have allow/deny/escalate rules or credentials (use mode = \"allowlist\")".into(),
            ));
        }
        if net.mode == NetworkMode::Allowlist
            && net.allow.is_empty()
            && net.escalate.is_empty()
            && net.credentials.is_empty()
        {
            return Err(invalid(
                "network.allow",
                "mode = \"allowlist\" needs at least one HOST[:PORT] entry (in allow, escalate or credentials)"
                    .into(),
            ));
        }

        let baseline = raw.seccomp.baseline.unwrap_or_else(|| "default".into());
        if baseline != "default" {
            return Err(invalid(
                "seccomp.baseline",
                format!("unknown baseline {baseline:?} (known: default)"),
            ));
        }
        let seccomp_sockets = SocketPolicy::with_families(&raw.seccomp.allow_socket_families)
            .map_err(|m| invalid("seccomp.allow_socket_families", m.to_string()))?;
        for key in raw.env.defaults.keys() {
            validate_env_key(key).map_err(|m| invalid("env.defaults", m.to_string()))?;
        }
        for key in raw.env.allow.iter().flatten() {
            validate_env_key(key).map_err(|m| invalid("env.allow", m.to_string()))?;
        }
        for module in &raw.python.preload {
            let valid = module.split('.').all(|part| {
                let mut chars = part.chars();
                chars
                    .next()
                    .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                    && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
            });
            if !valid {
                return Err(invalid(
                    "python.preload",
                    format!("{module:?} is not a module name (dotted Python identifiers)"),
                ));
            }
        }
        Ok(Profile {
            name: raw.name.unwrap_or_else(|| origin.to_owned()),
            filesystem: FsPolicy {
                workspace_writable,
                readable,
                writable: fs.writable,
                hidden: fs.hidden,
                escalate_write: fs.escalate_write,
                rw_mounts: fs.rw_mounts.unwrap_or(true),
            },
            network: NetworkPolicy {
                mode: net.mode,
                rules,
                http,
                credentials: net.credentials,
            },
            resources,
            env_defaults: raw.env.defaults,
            env_allow: raw.env.allow,
            seccomp_baseline: baseline,
            seccomp_sockets,
            python: PythonSettings {
                zygote: raw.python.zygote,
                preload: raw.python.preload,
            },
        })
    }
}

/// Why an `escalate_write` path cannot be kept from processes.
#[derive(Debug, thiserror::Error)]
enum EscalateWriteError {
    #[error(
        "{} is under writable {}: Landlock cannot take write access back below a \
         writable path (remove one of them)",
        path.display(),
        writable.display()
    )]
    UnderWritable { path: PathBuf, writable: PathBuf },
    #[error(
        "{} is in the workspace, which is writable (workspace = \"rw\"): Landlock \
         cannot take write access back below it (set workspace = \"ro\")",
        path.display()
    )]
    InWritableWorkspace { path: PathBuf },
    #[error("{} is under hidden {}: it can never be written", path.display(), hidden.display())]
    UnderHidden { path: PathBuf, hidden: PathBuf },
}

/// Checks that every `escalate_write` path can be kept from processes by Landlock (whose rules
/// only add access: nothing below a writable path can be taken back) and means something.
fn validate_escalate_write(
    escalate: &[PathBuf],
    writable: &[PathBuf],
    hidden: &[PathBuf],
    workspace_writable: bool,
) -> Result<(), EscalateWriteError> {
    for e in escalate {
        if let Some(w) = writable.iter().find(|w| e.starts_with(w)) {
            return Err(EscalateWriteError::UnderWritable {
                path: e.clone(),
                writable: w.clone(),
            });
        }
        if workspace_writable && e.starts_with(decision::WORKSPACE) {
            return Err(EscalateWriteError::InWritableWorkspace { path: e.clone() });
        }
        if let Some(h) = hidden.iter().find(|h| e.starts_with(h)) {
            return Err(EscalateWriteError::UnderHidden {
                path: e.clone(),
                hidden: h.clone(),
            });
        }
    }
    Ok(())
}

/// A TOML error as one line, prefixed with its line number.
fn parse_message(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("line {line}: {msg}")
        }
        None => msg,
    }
}

/// The 1-based line where `section.key` is set, found by scanning for the `[section]` header
/// and then a `key =` line (or an inline `section = { key = ... }`).
fn field_line(text: &str, field: &str) -> Option<usize> {
    let (section, key) = field.split_once('.')?;
    let mut in_section = false;
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.starts_with('[') {
            in_section = t.trim_start_matches('[').trim_end_matches(']').trim() == section;
            continue;
        }
        let starts_key = |k: &str| {
            t.strip_prefix(k)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        };
        if (in_section && starts_key(key)) || starts_key(field) {
            return Some(n + 1);
        }
    }
    None
}

/// Per-run changes to a profile's resources (command-line flags, API fields).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceOverrides {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u32>,
    pub cpus: Option<f64>,
    pub tmpfs_bytes: Option<u64>,
    pub timeout_ms: Option<u64>,
}

impl ResourceOverrides {
    /// True when nothing that shapes the sandbox itself is overridden (a timeout is enforced
    /// from outside, so it does not count).
    pub fn shapes_nothing(&self) -> bool {
        self.memory_bytes.is_none()
            && self.pids.is_none()
            && self.cpus.is_none()
            && self.tmpfs_bytes.is_none()
    }
}

impl Profile {
    /// A process's whole environment (`KEY=VALUE`): the profile's defaults, then `extra`
    /// (later entries win). Nothing comes from the host.
    pub fn environment(&self, extra: &[(String, String)]) -> Vec<String> {
        let mut env = self.env_defaults.clone();
        for (k, v) in extra {
            env.insert(k.clone(), v.clone());
        }
        env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    /// The profile with `o` applied, validated; errors name the field (`resources.memory`).
    pub fn with_overrides(mut self, o: &ResourceOverrides) -> Result<Self, (&'static str, String)> {
        let r = &mut self.resources;
        if let Some(v) = o.memory_bytes {
            r.memory_bytes = v;
        }
        if let Some(v) = o.pids {
            r.pids = v;
        }
        if let Some(v) = o.cpus {
            r.cpus = v;
        }
        if let Some(v) = o.tmpfs_bytes {
            r.tmpfs_bytes = v;
        }
        if let Some(v) = o.timeout_ms {
            r.timeout = Some(Duration::from_millis(v));
        }
        validate_resources(r)?;
        Ok(self)
    }
}

/// Checks that resource values are usable; returns the offending field and why.
pub fn validate_resources(r: &Resources) -> Result<(), (&'static str, String)> {
    if r.memory_bytes < 4 << 20 {
        return Err(("resources.memory", "must be at least 4M".into()));
    }
    if r.pids < 8 {
        return Err(("resources.pids", "must be at least 8".into()));
    }
    if !(r.cpus > 0.0 && r.cpus <= 1024.0) {
        return Err(("resources.cpus", "must be > 0 and <= 1024".into()));
    }
    if r.tmpfs_bytes < 1 << 20 {
        return Err(("resources.tmpfs_size", "must be at least 1M".into()));
    }
    if r.nofile < 16 {
        return Err(("resources.nofile", "must be at least 16".into()));
    }
    Ok(())
}

/// An environment variable name that is not `[A-Za-z_][A-Za-z0-9_]*`.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("invalid environment variable name {0:?}")]
pub struct InvalidEnvKey(pub String);

/// Validates an environment variable name (`[A-Za-z_][A-Za-z0-9_]*`).
pub fn validate_env_key(key: &str) -> Result<(), InvalidEnvKey> {
    let mut chars = key.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(InvalidEnvKey(key.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_zygote_settings_parse_and_preload_names_are_checked() {
        let ci = Profile::builtin("code-interpreter").unwrap();
        assert!(ci.python.zygote);
        assert!(ci.python.preload.iter().any(|m| m == "numpy"));
        assert_eq!(
            Profile::builtin("default").unwrap().python,
            PythonSettings::default()
        );
        let p = Profile::parse(
            "[python]\nzygote = true\npreload = [\"numpy\", \"xml.etree.ElementTree\", \"_x1\"]\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.python.preload.len(), 3);
        for bad in ["os; import x", "1abc", "a..b", "", "a.b-c"] {
            let text = format!("[python]\npreload = [{bad:?}]\n");
            let err = Profile::parse(&text, "t").unwrap_err().to_string();
            assert!(err.contains("python.preload"), "{bad:?}: {err}");
        }
        let err = Profile::parse("[python]\nzygot = true\n", "t").unwrap_err();
        assert!(err.to_string().contains("zygot"), "{err}");
    }

    #[test]
    fn builtin_profiles_parse() {
        for name in Profile::builtin_names() {
            let p = Profile::builtin(name).unwrap();
            assert_eq!(p.name, name);
            assert!(p.env_defaults.contains_key("PATH"));
        }
        assert_eq!(
            Profile::builtin("default").unwrap().network.mode,
            NetworkMode::None
        );
        let ci = Profile::builtin("code-interpreter").unwrap();
        assert_eq!(ci.network.mode, NetworkMode::Allowlist);
        assert!(
            ci.check(&Action::Connect {
                host: "pypi.org".into(),
                port: 443
            })
            .allow
        );
        assert!(
            !ci.check(&Action::Connect {
                host: "evil.example".into(),
                port: 443
            })
            .allow
        );
        assert!(ci.check(&Action::Write("/workspace/out/x".into())).allow);
        let s = Profile::builtin("strict").unwrap();
        assert!(!s.check(&Action::Read("/etc/passwd".into())).allow);
        assert!(!s.check(&Action::Write("/workspace/x".into())).allow);
        assert!(s.check(&Action::Write("/workspace/out/x".into())).allow);
        let d = Profile::builtin("default").unwrap();
        assert_eq!(d.resources.memory_bytes, 1 << 30);
        assert_eq!(d.resources.timeout, None);
        let s = Profile::builtin("strict").unwrap();
        assert_eq!(s.resources.timeout, Some(Duration::from_secs(60)));
    }

    #[test]
    fn unknown_profile_names_the_known_ones() {
        let e = Profile::load("nope").unwrap_err().to_string();
        assert!(e.contains("default") && e.contains("strict"), "{e}");
    }

    #[test]
    fn bad_fields_are_named() {
        // Each profile's error names all of `says` (separated by `|`).
        for (text, says) in [
            ("[resources]\nmemory = \"lots\"\n", "resources.memory"),
            ("[resources]\nmemry = \"1G\"\n", "memry"),
            ("[filesystem]\nwritable = [\"tmp\"]\n", "absolute"),
            ("[env]\ndefaults = { \"A-B\" = \"x\" }\n", "A-B"),
            ("[network]\nmode = \"some\"\n", "line 2"),
            ("[network]\nmode = \"allowlist\"\n", "network.allow"),
            (
                "name = \"x\"\n\n[network]\nmode = \"allowlist\"\nallow = [\"a b\"]\n",
                "line 5|network.allow|a b",
            ),
            (
                "[filesystem]\nworkspace = \"wo\"\n",
                "line 2: field `filesystem.workspace`",
            ),
            ("[filesystem]\nhidden = [\"/a/../b\"]\n", "'..'"),
            (
                "[seccomp]\nallow_socket_families = [\"vsok\"]\n",
                "line 2: field `seccomp.allow_socket_families`|vsok",
            ),
        ] {
            let e = Profile::parse(text, "t.toml").unwrap_err().to_string();
            assert!(says.split('|').all(|s| e.contains(s)), "{text}: {e}");
        }
    }

    /// Escalate fields: parsed, and refused with line, field and why when Landlock could not
    /// keep processes from writing there or the entry is not valid.
    #[test]
    fn escalate_fields_are_validated() {
        let p = Profile::parse(
            "[filesystem]\nescalate_write = [\"/etc/app\"]\n[network]\nmode = \"allowlist\"\nescalate = [\"*.github.com:443\"]\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.filesystem.escalate_write, [PathBuf::from("/etc/app")]);
        assert_eq!(p.network.rules[0].id, "network.escalate[0]");
        assert_eq!(p.network.rules[0].action, RuleAction::Escalate);
        let cases: &[(&str, &str)] = &[
            (
                "[filesystem]\nwritable = [\"/tmp\"]\nescalate_write = [\"/tmp/app\"]\n",
                "line 3: field `filesystem.escalate_write`: /tmp/app is under writable /tmp",
            ),
            (
                "[filesystem]\nescalate_write = [\"/workspace/deploy\"]\n",
                "line 2: field `filesystem.escalate_write`: /workspace/deploy is in the workspace, which is writable",
            ),
            (
                "[filesystem]\nhidden = [\"/etc/app\"]\nescalate_write = [\"/etc/app/x\"]\n",
                "field `filesystem.escalate_write`: /etc/app/x is under hidden /etc/app",
            ),
            (
                "[filesystem]\nescalate_write = [\"etc/app\"]\n",
                "line 2: field `filesystem.escalate_write`: etc/app is not an absolute path",
            ),
            (
                "[filesystem]\nescalate_write = [\"/a/../b\"]\n",
                "field `filesystem.escalate_write`: /a/../b contains '..'",
            ),
            (
                "\n[network]\nmode = \"allowlist\"\nescalate = [\"a b:443\"]\n",
                "line 4: field `network.escalate`: \"a b\" is not a host name",
            ),
            (
                "[network]\nescalate = [\"a.com\"]\n",
                "\"none\" cannot have allow/deny/escalate rules",
            ),
            ("[network]\nescalat = [\"a.com\"]\n", "escalat"),
            (
                "[network]\nmode = \"allowlist\"\ncredentials = [\"k@api.example.com=sk-live-123\"]\n",
                "field `network.credentials`: [0]: credential \"k\": a profile names where the value comes from",
            ),
            (
                "[network]\nmode = \"allowlist\"\ncredentials = [\"k@a.example:0=env:K\"]\n",
                "[0]: credential \"k\": bad port",
            ),
            (
                "[network]\ncredentials = [\"k@a.example=env:K\"]\n",
                "\"none\" cannot have allow/deny/escalate rules or credentials",
            ),
        ];
        for (text, want) in cases {
            let e = Profile::parse(text, "t").unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}:\n  got  {e}\n  want {want}");
        }
        // The workspace read-only: an escalate_write path inside it is fine.
        assert!(Profile::parse(
            "[filesystem]\nworkspace = \"ro\"\nescalate_write = [\"/workspace/deploy\"]\n",
            "t"
        )
        .is_ok());
        // --allow-host goes before the escalate rules: an explicit allow needs no approval.
        let mut p = p;
        p.network
            .allow_hosts("cli.allow_host", &["api.github.com:443".into()])
            .unwrap();
        let d = p.check(&Action::Connect {
            host: "api.github.com".into(),
            port: 443,
        });
        assert_eq!(
            (d.verdict(), d.rule_id.as_str()),
            ("allow", "cli.allow_host[0]")
        );
        // OpenSandbox policies never carry escalate.
        assert!(NetworkPolicy::from_opensandbox(
            r#"{"defaultAction":"deny","egress":[{"action":"escalate","target":"a.com"}]}"#
        )
        .is_err());
        assert!(NetworkPolicy::from_opensandbox(r#"{"defaultAction":"escalate"}"#).is_err());
    }

    /// The shipped example of escalate rules parses and decides as its comments say.
    #[test]
    fn supervised_example_profile() {
        let p = Profile::parse(
            include_str!("../../../bundles/supervised.toml"),
            "supervised.toml",
        )
        .unwrap();
        let verdict = |a: Action| p.check(&a).verdict();
        let c = |h: &str| Action::Connect {
            host: h.into(),
            port: 443,
        };
        assert_eq!(verdict(c("api.github.com")), "escalate");
        assert_eq!(verdict(c("github.com")), "escalate");
        assert_eq!(verdict(c("pypi.org")), "allow");
        assert_eq!(verdict(c("example.com")), "deny");
        assert_eq!(
            verdict(Action::Write("/workspace/src/a.py".into())),
            "escalate"
        );
        assert_eq!(
            verdict(Action::Write("/workspace/out/a.txt".into())),
            "allow"
        );
        assert_eq!(verdict(Action::Write("/etc/passwd".into())), "deny");
        assert!(!p
            .landlock_writable([])
            .iter()
            .any(|w| w == Path::new("/workspace")));
    }

    #[test]
    fn socket_families_default_to_the_baseline() {
        let d = Profile::builtin("default").unwrap();
        assert_eq!(d.seccomp_sockets, SocketPolicy::default());
        let p = Profile::parse("[seccomp]\nallow_socket_families = [\"alg\"]\n", "t").unwrap();
        assert!(p.seccomp_sockets.allows(38, 0));
    }

    #[test]
    fn credentials_name_sources_and_allow_their_hosts() {
        let p = Profile::parse(
            "[network]\nmode = \"allowlist\"\nallow = [\"pypi.org\"]\ndeny = [\"evil.example\"]\n\
             credentials = [\"openai@API.openai.com/v1=env:OPENAI_API_KEY\", \
             \"header=X-Key:k@10.0.0.5:8443=file:/run/keys/k\"]\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.network.credentials.len(), 2);
        assert_eq!(
            p.network.check("api.openai.com", 443).rule_id,
            "network.credentials[0]"
        );
        assert!(p.network.check("api.openai.com", 443).allow);
        assert_eq!(
            p.network.check("10.0.0.5", 8443).rule_id,
            "network.credentials[1]"
        );
        assert!(!p.network.check("api.openai.com", 80).allow);
        // A value written in the profile is refused, and the error never quotes it.
        let e = Profile::parse(
            "[network]\nmode = \"allowlist\"\ncredentials = [\"k@h.example=sk-live-123\"]\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(!e.contains("sk-live-123"), "{e}");
    }
}
