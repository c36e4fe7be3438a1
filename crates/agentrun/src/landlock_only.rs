//! `agentrun exec --isolation landlock-only`: the run confined by Landlock, seccomp and
//! rlimits with no namespaces ([`agentrun_runtime::landlock_only`]), for hosts where user
//! namespaces are not allowed. The profile's rules apply by host path: a mount's target
//! (`/workspace`, `--ro`/`--rw`) stands for its source; of its other readable paths only the
//! host's system directories are kept, and nothing outside the run's read-write mounts is
//! writable. The image is not used.

use std::path::{Path, PathBuf};

use agentrun_runtime::landlock::LandlockRules;
use agentrun_runtime::landlock_only::{self, LandlockOnly};
use agentrun_runtime::limits::{describe, RlimitFallback, Rlimits};
use agentrun_runtime::{Enforcement, HostInfo};

use crate::plan::Plan;
use crate::run::RunRecord;
use crate::trace::Recorder;

/// The host's system directories, the most a profile path opens in this mode.
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc", "/sys",
];

/// What of the profile path `p` is a system directory (all of `p` when it lies in one; the
/// system directories under it otherwise).
fn system_part(p: &Path) -> Vec<PathBuf> {
    if SYSTEM_DIRS.iter().any(|d| p.starts_with(d)) {
        return vec![p.to_path_buf()];
    }
    SYSTEM_DIRS
        .iter()
        .map(Path::new)
        .filter(|d| d.starts_with(p))
        .map(Path::to_path_buf)
        .collect()
}

/// Runs `plan` confined in place.
pub(crate) fn execute(plan: &Plan, _recorder: &Recorder) -> RunRecord {
    let run = RunRecord::default();
    let req = &plan.request;
    let profile = match req.recipe.profile() {
        Ok(p) => p,
        Err(e) => return run.fail("invalid_input", &e.into()),
    };
    if plan.network.needs_proxy() {
        return run.fail(
            "invalid_input",
            &anyhow::anyhow!("--isolation landlock-only has no egress proxy: no --allow-host"),
        );
    }
    let host = HostInfo::probe();
    let mounts = req.recipe.user_mounts();
    let rules = agentrun_runtime::cellrun::cell_rules(&profile, &mounts);
    let to_host = |p: &PathBuf| -> PathBuf {
        for m in &mounts {
            if let Ok(rest) = p.strip_prefix(&m.target) {
                return m.source.join(rest);
            }
        }
        p.clone()
    };
    // A read-only mount's source is readable only, whatever the rules say of its target.
    let ro: Vec<&Path> = mounts
        .iter()
        .filter(|m| !m.writable)
        .map(|m| m.source.as_path())
        .collect();
    let in_mount = |p: &PathBuf| mounts.iter().any(|m| p.starts_with(&m.target));
    // Writable: only inside the run's read-write mounts (never the host's shared /tmp).
    let writable: Vec<PathBuf> = rules
        .writable
        .iter()
        .filter(|p| in_mount(p))
        .map(to_host)
        .filter(|p| !ro.iter().any(|r| p.starts_with(r)))
        .collect();
    // Readable: the run's mounts, and of the profile's paths (meant for an image) only the
    // host's system directories: a profile's "/" must not open everyone's home.
    let mut readable: Vec<PathBuf> = Vec::new();
    for p in &rules.readable {
        if in_mount(p) {
            readable.push(to_host(p));
        } else {
            readable.extend(system_part(p));
        }
    }
    let filters = match agentrun_runtime::seccomp::default_profile(
        agentrun_policy::seccomp_denied_syscalls(),
        &profile.seccomp_sockets,
    )
    .and_then(|s| agentrun_runtime::seccomp::compile(&s))
    {
        Ok(f) => f,
        Err(e) => return run.fail("seccomp", &e.into()),
    };
    let rlimits = RlimitFallback::for_resources(&profile.resources, plan.timeout);
    let env = agentrun_runtime::cellrun::environment(&profile, &Default::default(), &req.env);
    let cwd = req
        .cwd
        .clone()
        .map(|c| to_host(&c))
        .or_else(|| req.recipe.workspace.clone())
        .unwrap_or_else(|| PathBuf::from("/"));
    let confined = LandlockOnly {
        argv: &req.args,
        env: &env,
        cwd: &cwd,
        rules: LandlockRules { readable, writable },
        landlock_abi: host.landlock_abi,
        filters,
        rlimits,
        limits: Rlimits::for_resources(&profile.resources),
    };
    let mut limits = describe(None, &rlimits, None);
    for l in &mut limits {
        *l = l.replace(
            "rootless: no delegated cgroup",
            "landlock-only: no namespaces, no cgroup",
        );
    }
    let mut run = run;
    run.enforcement = Some(Enforcement {
        landlock: host.landlock_enforcement(),
        landlock_abi: host.landlock_abi,
        seccomp: host.seccomp,
        user_namespace: false,
        idmapped_mounts: false,
        cgroup: "none (landlock-only: no namespaces)".into(),
        swap_limited: false,
        loopback: false,
        limits,
    });
    match landlock_only::run(&confined, plan.timeout) {
        Ok(outcome) => run.ran(outcome, false),
        Err(e) => {
            let kind = e.kind();
            run.fail(
                kind,
                &anyhow::Error::new(e).context("--isolation landlock-only"),
            )
        }
    }
}
