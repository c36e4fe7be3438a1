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

pub mod cell;
pub mod cellrun;
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
pub mod landlock_only;
pub mod limits;
pub mod net;
pub mod netns;
pub mod outcome;
pub mod preflight;
pub mod privilege;
pub mod random;
pub mod reaper;
pub mod rootfs;
pub mod rootless;
pub mod sandbox;
pub mod seccomp;
pub mod shell;
pub mod spawn;
pub mod spec;
pub mod user;
pub mod volume;
pub mod zygote;

pub use error::RuntimeError;
pub use host::HostInfo;
pub use outcome::{RunEnd, RunOutcome};
pub use privilege::Privilege;
pub use sandbox::{
    Enforcement, RuntimePaths, Sandbox, SandboxConfig, SandboxConfigBuilder, SandboxStdio,
};
