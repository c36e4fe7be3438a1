//! Commands about the runtime rather than a container: `features` (what this runtime
//! supports, in the OCI features JSON runc prints) and `spec` (a starter `config.json`).

use std::path::PathBuf;

use liboci_cli::Spec as SpecArgs;
use oci_spec::runtime::Spec;
use serde::Serialize;
use serde_json::json;

use crate::OciError;

/// Seccomp actions agentrun's compiler implements (see `agentrun_runtime::seccomp`;
/// `SCMP_ACT_NOTIFY` with a `listenerPath`, see [`crate::seccomp_notify`]).
const SECCOMP_ACTIONS: &[&str] = &[
    "SCMP_ACT_ALLOW",
    "SCMP_ACT_ERRNO",
    "SCMP_ACT_KILL",
    "SCMP_ACT_KILL_PROCESS",
    "SCMP_ACT_KILL_THREAD",
    "SCMP_ACT_LOG",
    "SCMP_ACT_NOTIFY",
    "SCMP_ACT_TRACE",
    "SCMP_ACT_TRAP",
];

const SECCOMP_OPERATORS: &[&str] = &[
    "SCMP_CMP_EQ",
    "SCMP_CMP_GE",
    "SCMP_CMP_GT",
    "SCMP_CMP_LE",
    "SCMP_CMP_LT",
    "SCMP_CMP_MASKED_EQ",
    "SCMP_CMP_NE",
];

const HOOKS: &[&str] = &[
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

const MOUNT_OPTIONS: &[&str] = &[
    "async",
    "atime",
    "bind",
    "defaults",
    "dev",
    "diratime",
    "dirsync",
    "exec",
    "iversion",
    "lazytime",
    "loud",
    "mand",
    "noatime",
    "nodev",
    "nodiratime",
    "noexec",
    "noiversion",
    "nolazytime",
    "nomand",
    "norelatime",
    "nostrictatime",
    "nosuid",
    "private",
    "rbind",
    "relatime",
    "remount",
    "ro",
    "rprivate",
    "rro",
    "rshared",
    "rslave",
    "runbindable",
    "rw",
    "shared",
    "silent",
    "slave",
    "strictatime",
    "suid",
    "sync",
    "unbindable",
];

const NAMESPACES: &[&str] = &["cgroup", "ipc", "mount", "network", "pid", "user", "uts"];

/// `features`: indented with four spaces, as runc prints it.
pub fn features() -> Result<(), OciError> {
    let capabilities: Vec<String> = caps::all()
        .into_iter()
        .map(|c| c.to_string())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    #[cfg(target_arch = "x86_64")]
    let archs = ["SCMP_ARCH_X86_64"];
    #[cfg(target_arch = "aarch64")]
    let archs = ["SCMP_ARCH_AARCH64"];
    let value = json!({
        "ociVersionMin": "1.0.0",
        "ociVersionMax": oci_spec::runtime::VERSION,
        "hooks": HOOKS,
        "mountOptions": MOUNT_OPTIONS,
        "linux": {
            "namespaces": NAMESPACES,
            "capabilities": capabilities,
            "cgroup": {"v1": true, "v2": true, "systemd": false, "systemdUser": false},
            "seccomp": {
                "enabled": true,
                "actions": SECCOMP_ACTIONS,
                "operators": SECCOMP_OPERATORS,
                "archs": archs,
            },
            "apparmor": {"enabled": false},
            "selinux": {"enabled": false},
        },
        "annotations": {
            "run.agentrun.version": env!("CARGO_PKG_VERSION"),
            "run.agentrun.landlock.abi": agentrun_runtime::landlock::abi().to_string(),
        },
    });
    crate::output(&to_string_indent(&value, b"    ")?);
    Ok(())
}

/// `spec`: writes runc's starter `config.json` (or the rootless one) into the bundle (or the
/// current directory); refuses to overwrite one.
pub fn spec(args: SpecArgs) -> Result<(), OciError> {
    let dir = args.bundle.unwrap_or_else(|| PathBuf::from("."));
    let path = dir.join("config.json");
    if path.exists() {
        return Err(OciError::Invalid(
            "File config.json exists. Remove it first".into(),
        ));
    }
    let spec = if args.rootless {
        Spec::rootless(
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    } else {
        Spec::default()
    };
    let mut spec = spec;
    spec.set_hostname(Some("agentrun".into()));
    let mut value = serde_json::to_value(&spec)?;
    // runc's starter spec has no (empty) annotations.
    if let Some(obj) = value.as_object_mut() {
        if obj
            .get("annotations")
            .is_some_and(|a| a.is_null() || a.as_object().is_some_and(|m| m.is_empty()))
        {
            obj.remove("annotations");
        }
    }
    let text = to_string_indent(&value, b"\t")?;
    std::fs::write(&path, text).map_err(|e| OciError::io("writing", path, e))
}

fn to_string_indent(value: &impl Serialize, indent: &[u8]) -> Result<String, OciError> {
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(indent);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    value.serialize(&mut ser)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}
