//! Containers: each one is an agentrun long-lived sandbox
//! ([`LiveSandbox`](agentrun_pool::live::LiveSandbox)) whose main process
//! is the image's Entrypoint + Cmd (or the create request's), with the image's Env and
//! WorkingDir, live bind mounts (`HostConfig.Binds`), cgroup limits (`Memory`, `NanoCpus`,
//! `CpuQuota`, `PidsLimit`) and a real pty when `Tty` is set.
//!
//! Lifecycle as dockerd's: `created` (a record; its sandbox is made by the first start, or
//! by a `docker cp` before it) -> `running` (the main process runs in the sandbox) ->
//! `exited` (the main process ended: every other process in the sandbox is killed, as when
//! PID 1 of a container dies, but the sandbox's init stays and with it the container's
//! filesystem, its own overlay layer: `docker cp` works on it, and `start`/`restart` run the
//! main process again on the same files) -> removed (the sandbox is destroyed). Published
//! ports ([`crate::ports`]) are listened on while the main process runs. Output is kept per
//! container (`logs`) and fanned out to attached clients; `wait` watches the state.
//!
//! An exited container's sandbox is an ordinary sandbox of the daemon's factory: a daemon
//! that dies takes it with it like every other (the factory destroys what it made when the
//! daemon's channel closes; `gc` at the next start removes what a killed factory left).
//!
//! The files, one job each: [`config`] (what create asks for), [`model`] (the container and
//! its state, its output kept for `logs` in an [`agentrun_pool::output_log::OutputLog`]),
//! [`inspect`] (its JSON), [`lifecycle`] (start, stop, remove). The endpoints are in
//! [`crate::container_api`].

pub mod config;
pub mod inspect;
pub mod lifecycle;
pub mod model;

pub use config::ContainerConfig;
pub use inspect::rfc3339;
pub use lifecycle::{
    ensure_sandbox, is_user_error, remove, signal, start, stop, CONTAINER_PROFILE,
};
pub use model::{generated_name, new_id, Container, ContainerState, Containers, Status};
