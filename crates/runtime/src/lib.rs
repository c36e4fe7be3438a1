//! agentrun's runtime: everything that touches the kernel.
//!
//! A sandbox is a **shell** plus one **cell** per run. The shell is an OCI bundle run by
//! youki's libcontainer with agentrun's own [`executor`]: an overlay rootfs on a size-capped
//! tmpfs ([`rootfs`]), idmapped mounts ([`idmap`]), user, mount, pid, ipc, uts, net and cgroup
//! namespaces and cgroup limits ([`spec`], [`cgroup`]), loopback-only networking ([`net`]), and
//! agentrun's init as its PID 1 ([`shell`]), which makes a cell per request ([`cell`]): new
//! pid, mount and ipc namespaces, a fresh writable layer, the run's mounts, then rlimits,
//! capabilities, Landlock ([`landlock`]) and seccomp compiled with seccompiler ([`seccomp`]),
//! and the cell's PID 1 ([`reaper`]) runs the command. [`cellrun`] is a run's host side, [`outcome`] how it ended (the exit code rules);
//! [`control`] the protocol; [`sandbox`] ties a shell's life together (and `image build`'s
//! one-command sandboxes); [`fsroot`] reaches files inside a running sandbox from the host
//! without ever resolving a path outside it; [`gc`] cleans up after killed runs; [`host`]
//! says what this host enforces; [`hostdirs`] keeps the image store and the state dir
//! private; [`random`] makes every id and token (getrandom, failing closed).

pub mod confine;
pub mod host;
pub mod inside;
pub mod mounts;

pub mod cellrun;
pub mod control;
mod error;
pub mod landlock_only;
pub mod outcome;
pub mod random;
pub mod rootless;
pub mod sandbox;
pub mod spec;

// The paths other crates have always used (`agentrun_runtime::fsroot`, ...), kept while the
// modules live in their wings.
pub use confine::{landlock, limits, seccomp};
pub use host::{gc, kaudit, netns, preflight, privilege};

/// `agentrun_runtime::cgroup`: the host's cgroup layout ([`host::cgroup`]) and a sandbox's
/// cgroup read and written ([`host::cgroup_ops`]), under the one path other crates name.
pub mod cgroup {
    pub use crate::host::cgroup::*;
    pub use crate::host::cgroup_ops::{CgroupStats, CgroupUsage, RunMeter};
}
pub use inside::{cell, executor, net, reaper, shell, spawn, user, zygote};
pub use mounts::{fsroot, hostdirs, idmap, rootfs, volume};

pub use error::RuntimeError;
pub use host::info::HostInfo;
pub use outcome::{RunEnd, RunOutcome};
pub use privilege::Privilege;
pub use sandbox::{
    Enforcement, RuntimePaths, Sandbox, SandboxConfig, SandboxConfigBuilder, SandboxStdio,
};
