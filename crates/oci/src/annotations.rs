//! The annotations through which a container asks agentrun for hardening beyond its spec.
//!
//! | annotation | effect |
//! |---|---|
//! | `run.agentrun.profile=<name>` | applies the built-in profile `<name>` (`default`, `strict`, ...): Landlock (read and execute only under the profile's readable paths and the spec's mounts, write only under the profile's writable paths and the spec's read-write mounts), and the profile's seccomp baseline when the spec has no seccomp section. The profile's hidden paths and resources are not applied: the spec's `maskedPaths` and `linux.resources` (the orchestrator's) are |
//! | `run.agentrun.traceparent=<W3C traceparent>` | parent of the container's lifetime span (otherwise `TRACEPARENT` of `create`) |
//!
//! Only built-in profile names are accepted, never a path: annotations come from whoever
//! writes the pod spec. Without annotations the container runs exactly as its spec says.

use std::path::PathBuf;

use agentrun_policy::Profile;
use agentrun_runtime::landlock::LandlockRules;
use oci_spec::runtime::{LinuxSeccomp, Spec};

use crate::OciError;

/// Annotation naming the profile to apply.
pub const PROFILE: &str = "run.agentrun.profile";
/// Annotation carrying the lifetime span's parent.
pub const TRACEPARENT: &str = "run.agentrun.traceparent";

/// Mount types whose read-write mounts stay writable under a profile's Landlock rules.
const WRITABLE_MOUNT_TYPES: &[&str] = &["bind", "tmpfs", "none"];

/// What agentrun enforces on a container process, from its spec and annotations.
#[derive(Debug, Clone, Default)]
pub struct Hardening {
    /// The profile's name, when one was asked for.
    pub profile: Option<String>,
    /// The seccomp section to apply: the spec's, or the profile's baseline.
    pub seccomp: Option<LinuxSeccomp>,
    /// Landlock rules (a profile was asked for).
    pub landlock: Option<LandlockRules>,
}

impl Hardening {
    /// Reads the spec's seccomp section and agentrun's annotations.
    pub fn from_spec(spec: &Spec) -> Result<Self, OciError> {
        let spec_seccomp = spec.linux().as_ref().and_then(|l| l.seccomp().clone());
        let Some(name) = spec.annotations().as_ref().and_then(|a| a.get(PROFILE)) else {
            return Ok(Hardening {
                profile: None,
                seccomp: spec_seccomp,
                landlock: None,
            });
        };
        if name.contains('/') || name.ends_with(".toml") {
            return Err(OciError::Invalid(format!(
                "annotation {PROFILE}: {name:?} is not a built-in profile name"
            )));
        }
        let profile = Profile::builtin(name)
            .map_err(|e| OciError::Invalid(format!("annotation {PROFILE}: {e}")))?;
        let seccomp = match spec_seccomp {
            Some(s) => Some(s),
            None if profile.seccomp_baseline == "default" => Some(
                agentrun_runtime::seccomp::default_profile(
                    agentrun_policy::seccomp_denied_syscalls(),
                    &profile.seccomp_sockets,
                )
                .map_err(|e| OciError::Invalid(e.to_string()))?,
            ),
            None => None,
        };
        let writable = profile.landlock_writable(writable_mounts(spec));
        // Read: the profile's readable paths, and every mount the spec makes (volumes,
        // /etc/hosts, ...), as agentrun's own sandboxes do for their mounts.
        let mut readable = profile.landlock_readable();
        readable.extend(
            spec.mounts()
                .iter()
                .flatten()
                .map(|m| m.destination().clone()),
        );
        readable.sort();
        readable.dedup();
        Ok(Hardening {
            profile: Some(profile.name),
            seccomp,
            landlock: Some(LandlockRules { readable, writable }),
        })
    }
}

/// Destinations of the spec's read-write bind and tmpfs mounts (volumes, /dev/shm,
/// /etc/hosts, ...), but not `/dev` itself nor kernel filesystems.
fn writable_mounts(spec: &Spec) -> Vec<PathBuf> {
    spec.mounts()
        .iter()
        .flatten()
        .filter(|m| {
            let typ = m.typ().as_deref().unwrap_or("none");
            let ro = m.options().iter().flatten().any(|o| o == "ro");
            WRITABLE_MOUNT_TYPES.contains(&typ) && !ro && m.destination() != &PathBuf::from("/dev")
        })
        .map(|m| m.destination().clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn spec_with(annotations: &[(&str, &str)]) -> Spec {
        let mut spec = Spec::default();
        let map: HashMap<String, String> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        spec.set_annotations(Some(map));
        spec
    }

    #[test]
    fn no_annotation_means_the_spec_alone() {
        let h = Hardening::from_spec(&Spec::default()).unwrap();
        assert!(h.profile.is_none() && h.landlock.is_none());
        // runc's default spec has no seccomp section.
        assert!(h.seccomp.is_none());
    }

    #[test]
    fn profile_adds_landlock_and_default_seccomp() {
        let h = Hardening::from_spec(&spec_with(&[(PROFILE, "strict")])).unwrap();
        assert_eq!(h.profile.as_deref(), Some("strict"));
        let ll = h.landlock.unwrap();
        assert!(ll.writable.contains(&PathBuf::from("/tmp")));
        // The default spec's rw tmpfs /dev/shm stays writable; /dev and /proc do not.
        assert!(ll.writable.contains(&PathBuf::from("/dev/shm")));
        assert!(!ll.writable.contains(&PathBuf::from("/dev")));
        assert!(!ll.writable.contains(&PathBuf::from("/proc")));
        assert!(h.seccomp.is_some());
    }

    #[test]
    fn paths_and_unknown_profiles_are_refused() {
        for bad in ["/etc/evil.toml", "x.toml", "nope"] {
            let err = Hardening::from_spec(&spec_with(&[(PROFILE, bad)])).unwrap_err();
            assert!(err.to_string().contains(PROFILE), "{err}");
        }
    }
}
