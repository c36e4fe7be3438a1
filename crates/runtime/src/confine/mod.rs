//! The confinement wing: what the kernel enforces on a sandboxed process beyond namespaces,
//! built on the host and applied inside: Landlock rules, the seccomp profile, and how
//! resource limits are enforced (cgroup or rlimits).

pub mod landlock;
pub mod limits;
pub mod seccomp;
