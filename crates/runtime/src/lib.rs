//! agentrun's runtime: everything that touches the kernel.
//!
//! A sandbox is a **shell** plus one **cell** per run. The shell is an OCI bundle run by
//! youki's libcontainer with agentrun's own executor: an overlay rootfs on a size-capped tmpfs,
//! idmapped mounts, user, mount, pid, ipc, uts, net and cgroup namespaces and cgroup limits,
//! loopback-only networking, and agentrun's init as its PID 1, which makes a cell per request:
//! new pid, mount and ipc namespaces, a fresh writable layer, the run's mounts, then rlimits,
//! capabilities, Landlock and seccomp, and the cell's PID 1 runs the command.
//!
//! The modules live in wings by the process their code runs in (youki's
//! `libcontainer/src/process/` splits the same way); the host-side run machinery is at the top.
//! `hack/modgraph agentrun-runtime` prints the arrows between them (there is no circle).
//!
//! Top: agentrun's own process, running a sandbox
//! - `sandbox`: a shell's life, create to destroy, and `image build`'s one-command sandboxes.
//! - `cellrun`: one run in a cell from the host's side: its mounts, Landlock rules, request.
//! - `outcome`: how a run ended and the one rule turning that into agentrun's exit code.
//! - `exit`: the exit codes agentrun reports (124 timed out, 125 agentrun failed, ...).
//! - `control`: the protocol between the host, a shell's init and a cell's PID 1; fd passing.
//! - `spec`: the per-run OCI runtime spec (`config.json`).
//! - `rootless`: a rootless shell, made by agentrun itself in a user namespace of its own.
//! - `landlock_only`: `--isolation landlock-only`, a command confined with no namespaces.
//! - `random`: every id and token (getrandom, failing closed).
//! - `error`: the runtime's error type.
//!
//! `host/`: agentrun's own process, looking at the host
//! - `host::info`: what this host can enforce ([`HostInfo`]).
//! - `host::preflight`: host requirements checked before anything is created.
//! - `host::privilege`: root or an ordinary user ([`Privilege`]).
//! - `host::cgroup`: the host's cgroup layout and where a sandbox's cgroup lives.
//! - `host::cgroup_ops`: a sandbox's cgroup read and written (limits, freezer, stats).
//! - `host::gc`: removes what runs killed with SIGKILL left behind.
//! - `host::guard`: a cold run's mounts in a namespace of its own, and a janitor that
//!   collects its sandbox as soon as the run is killed.
//! - `host::kaudit`: Landlock denials as the kernel's audit subsystem reports them.
//! - `host::netns`: TCP sockets made from the host inside a sandbox's network namespace.
//!
//! `inside/`: processes inside a sandbox
//! - `inside::kernel`: the kernel calls the cell's and the shell's decisions depend on, as a
//!   trait, so they are unit-tested without root.
//! - `inside::executor`: libcontainer's `Executor`, what the container's init does first.
//! - `inside::shell`: a shell's init, PID 1 of a shell, making a cell per request.
//! - `inside::cell`: a cell, what one run sees, cloned by the shell's init.
//! - `inside::reaper`: PID-1 building blocks of a cell: start, forward signals, reap, report.
//! - `inside::live`: a long-lived cell's PID 1, serving many processes over time.
//! - `inside::zygote`: a Python zygote in a shell forking runs into their cells.
//! - `inside::spawn`: starting the sandboxed command with `posix_spawnp`.
//! - `inside::user`: a Docker-style user spec resolved against the sandbox's own `/etc`.
//! - `inside::net`: loopback up in the sandbox's network namespace, and the egress relay.
//!
//! `mounts/`: filesystems a sandbox sees
//! - `mounts::rootfs`: the per-run root filesystem and bind mounts.
//! - `mounts::idmap`: idmapped mounts and the user namespaces that carry a mapping.
//! - `mounts::volume`: host directories a long-lived sandbox mounts beyond its image.
//! - `mounts::fsroot`: file access inside a running sandbox from the host, never escaping it.
//! - `mounts::hostdirs`: the image store and state dir kept private.
//!
//! `confine/`: what the kernel enforces beyond namespaces
//! - `confine::landlock`: the sandboxed process's filesystem view.
//! - `confine::seccomp`: the default profile and its compilation into BPF.
//! - `confine::limits`: how resource limits are enforced (cgroup, or rlimits when rootless).
//!
//! Public, because another crate uses them: `cellrun`, `control`, `exit`, `landlock_only`, `random`,
//! `sandbox`, `cgroup` (both cgroup modules under one path), `gc`, `guard`, `kaudit`, `netns`,
//! `preflight`, `privilege`, `cell`, `zygote`, `fsroot`, `hostdirs`, `idmap`, `rootfs`,
//! `volume`, `landlock`, `limits`, `seccomp`, re-exported below under their old paths.
//! Everything else is private to this crate.

// Public items' docs name the private modules they work with (a shell's cells, the zygote):
// read them with `cargo doc --document-private-items`, where those links resolve.
#![allow(rustdoc::private_intra_doc_links)]

mod confine;
mod host;
mod inside;
mod mounts;

pub mod cellrun;
pub mod control;
mod error;
pub use agentrun_policy::exit;
pub mod landlock_only;
pub(crate) mod outcome;
pub mod random;
pub(crate) mod rootless;
pub mod sandbox;
pub(crate) mod spec;

// The modules other crates use, under the paths they have always used
// (`agentrun_runtime::fsroot`, ...), wherever their wing is.
pub use confine::{landlock, limits, seccomp};
pub use host::{gc, guard, kaudit, netns, preflight, privilege};

/// `agentrun_runtime::cgroup`: the host's cgroup layout ([`host::cgroup`]) and a sandbox's
/// cgroup read and written ([`host::cgroup_ops`]), under the one path other crates name.
pub mod cgroup {
    pub use crate::host::cgroup::*;
    pub use crate::host::cgroup_ops::{CgroupStats, CgroupUsage, RunMeter};
}
pub use inside::{cell, zygote};
pub use mounts::{fsroot, hostdirs, idmap, rootfs, volume};

pub use error::RuntimeError;
pub use host::info::HostInfo;
pub use outcome::{RunEnd, RunOutcome};
pub use privilege::Privilege;
pub use sandbox::{
    Enforcement, RunIo, RuntimePaths, Sandbox, SandboxConfig, SandboxConfigBuilder, SandboxStdio,
};
