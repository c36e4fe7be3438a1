//! The per-run OCI runtime spec (`config.json`), generated with `oci-spec` from the profile and
//! the run's options.

use std::collections::HashMap;
use std::path::PathBuf;

use agentrun_policy::Resources;
use caps::Capability;
use oci_spec::runtime::{
    get_default_maskedpaths, get_default_mounts, get_default_readonly_paths, Capability as OciCap,
    LinuxBuilder, LinuxCpuBuilder, LinuxIdMappingBuilder, LinuxMemoryBuilder,
    LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder, LinuxResourcesBuilder,
    LinuxSeccomp, Mount, MountBuilder, PosixRlimitBuilder, PosixRlimitType, ProcessBuilder,
    RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use crate::error::RuntimeError;
use crate::host::cgroup::CgroupMode;
use crate::mounts::idmap::{UID_BASE, UID_COUNT};

/// CPU quota period (µs).
const CPU_PERIOD: u64 = 100_000;

/// A bind mount into the sandbox, from a host path agentrun prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub writable: bool,
}

/// Everything the spec is generated from.
#[derive(Debug, Clone)]
pub struct SpecInput {
    pub sandbox_id: String,
    pub image_name: String,
    pub args: Vec<String>,
    /// `KEY=VALUE` entries: the whole environment of the process.
    pub env: Vec<String>,
    pub cwd: PathBuf,
    pub resources: Resources,
    pub binds: Vec<BindMount>,
    pub seccomp: LinuxSeccomp,
    /// Capabilities of the init (the command's set is narrowed from these by the executor).
    pub init_caps: Vec<Capability>,
    /// RLIMIT_NOFILE and RLIMIT_NPROC of the init. A shell's are the most any cell may get.
    pub limits: crate::confine::limits::Rlimits,
    pub swap_limit: bool,
    /// Paths masked on top of the OCI defaults (the profile's hidden paths).
    pub masked: Vec<PathBuf>,
}

/// The OCI name of a capability (`CAP_CHOWN`); oci-spec's serde names are the OCI ones.
fn oci_cap(c: Capability) -> Result<OciCap, RuntimeError> {
    serde_json::from_value(serde_json::Value::String(c.to_string()))
        .map_err(|_| RuntimeError::InvalidInput(format!("unknown capability {c}")))
}

/// Builds the spec. The rootfs is `<bundle>/rootfs`.
pub fn build(input: &SpecInput) -> Result<Spec, RuntimeError> {
    let caps = input
        .init_caps
        .iter()
        .map(|c| oci_cap(*c))
        .collect::<Result<std::collections::HashSet<OciCap>, _>>()?;
    let rlimits = vec![
        PosixRlimitBuilder::default()
            .typ(PosixRlimitType::RlimitNofile)
            .soft(input.limits.nofile)
            .hard(input.limits.nofile)
            .build()?,
        PosixRlimitBuilder::default()
            .typ(PosixRlimitType::RlimitNproc)
            .soft(input.limits.nproc)
            .hard(input.limits.nproc)
            .build()?,
        PosixRlimitBuilder::default()
            .typ(PosixRlimitType::RlimitCore)
            .soft(0u64)
            .hard(0u64)
            .build()?,
    ];
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(UserBuilder::default().uid(0u32).gid(0u32).build()?)
        .args(input.args.clone())
        .env(input.env.clone())
        .cwd(input.cwd.clone())
        .no_new_privileges(true)
        .capabilities(
            oci_spec::runtime::LinuxCapabilitiesBuilder::default()
                .bounding(caps.clone())
                .effective(caps.clone())
                .permitted(caps.clone())
                .inheritable(std::collections::HashSet::new())
                .ambient(std::collections::HashSet::new())
                .build()?,
        )
        .rlimits(rlimits)
        .build()?;

    let mut mounts: Vec<Mount> = get_default_mounts()
        .into_iter()
        .filter(|m| m.destination() != &PathBuf::from("/sys/fs/cgroup"))
        .collect();
    for b in &input.binds {
        let mut options = vec!["rbind".to_string(), "nosuid".into(), "nodev".into()];
        options.push(if b.writable { "rw" } else { "ro" }.into());
        mounts.push(
            MountBuilder::default()
                .destination(b.target.clone())
                .typ("bind")
                .source(b.source.clone())
                .options(options)
                .build()?,
        );
    }

    let namespaces = [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Cgroup,
        LinuxNamespaceType::User,
    ]
    .into_iter()
    .map(|t| LinuxNamespaceBuilder::default().typ(t).build())
    .collect::<Result<Vec<_>, _>>()?;
    let mapping = LinuxIdMappingBuilder::default()
        .container_id(0u32)
        .host_id(UID_BASE)
        .size(UID_COUNT)
        .build()?;

    let r = &input.resources;
    let memory = r.memory_bytes as i64;
    let mut mem = LinuxMemoryBuilder::default();
    mem = mem.limit(memory);
    if input.swap_limit {
        // OCI's swap is memory+swap: equal to the limit means no swap at all.
        mem = mem.swap(memory);
    }
    let resources = LinuxResourcesBuilder::default()
        .memory(mem.build()?)
        .pids(
            LinuxPidsBuilder::default()
                .limit(i64::from(r.pids))
                .build()?,
        )
        .cpu(
            LinuxCpuBuilder::default()
                .quota((r.cpus * CPU_PERIOD as f64).round() as i64)
                .period(CPU_PERIOD)
                .build()?,
        )
        .build()?;

    let linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .uid_mappings(vec![mapping])
        .gid_mappings(vec![mapping])
        .cgroups_path(CgroupMode::spec_path(&input.sandbox_id))
        .resources(resources)
        .seccomp(input.seccomp.clone())
        .masked_paths({
            let mut m = get_default_maskedpaths();
            m.extend(
                input
                    .masked
                    .iter()
                    .map(|p| p.to_string_lossy().into_owned()),
            );
            m
        })
        .readonly_paths(get_default_readonly_paths())
        .build()?;

    let annotations: HashMap<String, String> = [
        ("run.agentrun.sandbox.id", input.sandbox_id.clone()),
        ("run.agentrun.image", input.image_name.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();

    Ok(SpecBuilder::default()
        .version("1.0.2")
        .root(
            RootBuilder::default()
                .path("rootfs")
                .readonly(false)
                .build()?,
        )
        .hostname("sandbox")
        .process(process)
        .mounts(mounts)
        .linux(linux)
        .annotations(annotations)
        .build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> SpecInput {
        let profile = agentrun_policy::Profile::builtin("default").unwrap();
        SpecInput {
            sandbox_id: "ar-test".into(),
            image_name: "host".into(),
            args: vec!["true".into()],
            env: vec!["PATH=/usr/bin".into()],
            cwd: "/workspace".into(),
            resources: agentrun_policy::Resources {
                memory_bytes: 64 << 20,
                ..profile.resources
            },
            binds: vec![BindMount {
                source: "/run/agentrun/sandboxes/ar-test/mnt/0".into(),
                target: "/usr".into(),
                writable: false,
            }],
            seccomp: crate::confine::seccomp::default_profile(
                agentrun_policy::seccomp_denied_syscalls(),
                &Default::default(),
            )
            .unwrap(),
            init_caps: vec![Capability::CAP_KILL, Capability::CAP_NET_ADMIN],
            limits: crate::confine::limits::Rlimits {
                nofile: 512,
                nproc: 64,
            },
            swap_limit: true,
            masked: vec!["/secret".into()],
        }
    }

    #[test]
    fn spec_isolates_and_limits() {
        let spec = build(&input()).unwrap();
        let linux = spec.linux().as_ref().unwrap();
        let ns: Vec<_> = linux
            .namespaces()
            .as_ref()
            .unwrap()
            .iter()
            .map(|n| n.typ())
            .collect();
        for t in [
            LinuxNamespaceType::User,
            LinuxNamespaceType::Network,
            LinuxNamespaceType::Pid,
            LinuxNamespaceType::Mount,
            LinuxNamespaceType::Cgroup,
        ] {
            assert!(ns.contains(&t), "{t:?}");
        }
        let map = &linux.uid_mappings().as_ref().unwrap()[0];
        assert_eq!((map.container_id(), map.host_id()), (0, UID_BASE));
        assert_eq!(
            linux.cgroups_path().as_deref(),
            Some(std::path::Path::new("/agentrun/ar-test"))
        );
        let mem = linux
            .resources()
            .as_ref()
            .unwrap()
            .memory()
            .as_ref()
            .unwrap();
        assert_eq!(mem.limit(), Some(64 << 20));
        assert_eq!(mem.swap(), Some(64 << 20), "memory+swap == memory: no swap");
        assert!(linux.seccomp().is_some());
        let process = spec.process().as_ref().unwrap();
        assert_eq!(process.no_new_privileges(), Some(true));
        let rl = process.rlimits().as_ref().unwrap();
        assert!(rl
            .iter()
            .any(|r| r.typ() == PosixRlimitType::RlimitNofile && r.hard() == 512));
        assert!(rl
            .iter()
            .any(|r| r.typ() == PosixRlimitType::RlimitCore && r.hard() == 0));
        let bounding = process
            .capabilities()
            .as_ref()
            .unwrap()
            .bounding()
            .as_ref()
            .unwrap();
        assert_eq!(bounding.len(), 2);
        let mounts = spec.mounts().as_ref().unwrap();
        assert!(!mounts
            .iter()
            .any(|m| m.destination() == std::path::Path::new("/sys/fs/cgroup")));
        let usr = mounts
            .iter()
            .find(|m| m.destination() == std::path::Path::new("/usr"))
            .unwrap();
        assert!(usr.options().as_ref().unwrap().contains(&"ro".to_string()));
    }
}
