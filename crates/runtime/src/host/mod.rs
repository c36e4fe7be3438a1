//! The host wing: code that runs in agentrun's own process and looks at the host, not at a
//! run: what the host can enforce and who runs agentrun, preflight checks, cgroup detection
//! and reports, garbage collection and a cold run's guard, the kernel's Landlock denial log, and sockets made in a
//! sandbox's network namespace.

pub mod cgroup;
pub(crate) mod cgroup_ops;
pub mod gc;
pub mod guard;
pub(crate) mod info;
pub mod kaudit;
pub mod netns;
pub mod preflight;
pub mod privilege;
