//! The warm pool and the daemon around it.
//!
//! - [`factory`]: the single-threaded processes that make and destroy shells (the only place
//!   libcontainer is called in the daemon), and a shell's cgroup limits.
//! - [`pool`]: ready shells per (image, profile), reused run after run (a fresh cell each),
//!   discarded when in doubt, refilled in the background.
//! - [`run`]: one run in a pooled shell's cell (stdio fds passed, not copied; the shell
//!   judged after it: its [`run::Verdict`]).
//! - [`live`]: long-lived sandboxes (one shell, one long-lived cell: many processes over
//!   time, pause/resume, limits), the core of the HTTP front ends.
//! - [`daemon`] / [`protocol`] / [`client`]: `agentrun serve` and its local socket.
//! - [`egress_route`]: a sandbox routed through its egress proxy (and trusting its CA when
//!   TLS is intercepted): the environment every front end gives its processes, and
//!   [`live::LiveSpec::through_egress_proxy`].
//! - [`recipe`]: what a sandbox is made from, shared with the CLI's cold path.
//! - [`snapshot`]: a live sandbox's writable layer kept as an image layer (snapshots, commit),
//!   or as a fork's frozen layer (`frozen`: the [`snapshot::FrozenLayer`] and
//!   [`snapshot::PendingLayer`] types, below both [`live`] and [`snapshot`]).
//! - [`stdio`] / [`output_log`] / [`lines`] / [`process`] / [`python`]: what the front ends
//!   share about a live sandbox's processes: their pipes or pty (our ends read and written on
//!   the front ends' tokio runtimes, output pumped), their newest output kept in bounded
//!   memory, their output as lines, the processes started with pipes and the interactive
//!   ones, and the persistent Python contexts (OpenSandbox code contexts, MCP `run_python`).

pub mod activation;
pub mod board;
pub mod client;
pub mod daemon;
pub mod egress_route;
pub mod factory;
mod frozen;
pub mod lines;
pub mod live;
pub mod metrics;
pub mod observe;
pub mod output_log;
pub mod pool;
pub mod process;
pub mod protocol;
pub mod python;
pub mod recipe;
pub mod run;
mod sigstop;
pub mod snapshot;
pub mod stdio;

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, also when a thread panicked holding it: what it guards stays usable (every
/// user of the pool's and the API front ends' mutexes keeps its data consistent between
/// statements, so a panic leaves nothing half-made behind).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits on `cv` with `guard` until notified or `timeout` has passed (a poisoned lock is
/// taken as it is, as [`lock`] does).
pub(crate) fn wait<'a, T>(
    cv: &std::sync::Condvar,
    guard: MutexGuard<'a, T>,
    timeout: std::time::Duration,
) -> MutexGuard<'a, T> {
    cv.wait_timeout(guard, timeout)
        .unwrap_or_else(|p| p.into_inner())
        .0
}

/// The host's cgroup mode, detected once (what the operators' views read usage with).
pub(crate) fn cgroup_mode() -> Option<agentrun_runtime::cgroup::CgroupMode> {
    static MODE: std::sync::OnceLock<Option<agentrun_runtime::cgroup::CgroupMode>> =
        std::sync::OnceLock::new();
    *MODE.get_or_init(agentrun_runtime::cgroup::CgroupMode::detect)
}

/// Compares secrets (API keys, tokens) without an early exit: what every front end checks a
/// credential with.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether an `Authorization` header value carries `key` as a bearer token (the scheme is
/// case-insensitive, RFC 7235), compared in constant time: how the HTTP front ends that take
/// `Authorization: Bearer KEY` (MCP, metrics) check it.
pub fn bearer_authorized(authorization: Option<&str>, key: &str) -> bool {
    authorization
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then_some(token.trim())
        })
        .is_some_and(|t| constant_time_eq(t.as_bytes(), key.as_bytes()))
}

/// Errors of the pool and daemon.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Runtime(#[from] agentrun_runtime::RuntimeError),
    #[error(transparent)]
    Image(#[from] agentrun_image::ImageError),
    #[error(transparent)]
    Policy(#[from] agentrun_policy::PolicyError),
    #[error("{0}")]
    Invalid(String),
    #[error("sandbox factory: {0}")]
    Factory(String),
    #[error("{0}: {1}")]
    Sys(&'static str, nix::Error),
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error("too many sandboxes (max {0}); try again later")]
    Busy(usize),
    #[error("no sandbox {0}")]
    NotFound(String),
    /// A process could not start: the code a shell would give, and why.
    #[error("{message}")]
    Spawn { exit_code: i32, message: String },
}

#[cfg(test)]
mod tests {
    use super::bearer_authorized;

    #[test]
    fn only_the_bearer_key_is_let_in() {
        assert!(bearer_authorized(Some("Bearer k3y"), "k3y"));
        assert!(bearer_authorized(Some("bearer  k3y "), "k3y"));
        for bad in [
            None,
            Some("k3y"),
            Some("Bearer k3"),
            Some("Basic k3y"),
            Some("Bearer "),
        ] {
            assert!(!bearer_authorized(bad, "k3y"), "{bad:?}");
        }
    }
}
