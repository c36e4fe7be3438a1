//! agentrun's runtime: everything that touches the kernel.
//!
//! A sandbox is an OCI bundle run by youki's libcontainer with agentrun's own [`executor`]:
//! an overlay rootfs on a size-capped tmpfs ([`rootfs`]), idmapped mounts ([`idmap`]), user,
//! mount, pid, ipc, uts, net and cgroup namespaces and cgroup limits ([`spec`], [`cgroup`]),
//! seccomp compiled with seccompiler ([`seccomp`]), Landlock ([`landlock`]), loopback-only
//! networking ([`net`]); [`fsroot`] reaches files inside a running sandbox from the host without
//! ever resolving a path outside it. [`sandbox`] ties a run together; [`gc`] cleans up after killed runs;
//! [`host`] says what this host enforces; [`hostdirs`] keeps the image store and the state
//! dir private; [`random`] makes every id and token (getrandom,
//! failing closed).

pub mod cgroup;
pub mod control;
mod error;
pub mod executor;
pub mod fsroot;
pub mod gc;
pub mod host;
pub mod hostdirs;
pub mod idmap;
pub mod kaudit;
pub mod landlock;
pub mod net;
pub mod netns;
pub mod random;
pub mod rootfs;
pub mod sandbox;
pub mod seccomp;
pub mod spawn;
pub mod spec;
pub mod user;

pub use error::RuntimeError;
pub use host::HostInfo;
pub use sandbox::{
    Enforcement, RunOutcome, RuntimePaths, Sandbox, SandboxConfig, SandboxConfigBuilder,
    SandboxStdio,
};
