//! agentrun's OCI runtime command line: the runc contract, so that containerd's runc shim
//! (`io.containerd.runc.v2` with `BinaryName` pointing at agentrun) and therefore Kubernetes
//! (a RuntimeClass whose handler is that runtime) run containers with agentrun.
//!
//! The commands (argument definitions from `liboci-cli`) run over youki's `libcontainer`;
//! state lives under the global `--root` (default [`DEFAULT_ROOT`]), one directory per
//! container, like runc's. Outputs (JSON of `state`, `list`, `ps`, `events`, `features`),
//! error messages the shim matches on ("container does not exist", "container not running")
//! and exit codes (0, or 1 on error; `run`/`exec` without `--detach`: the process's) follow
//! runc's.
//!
//! In this mode the container process is exactly what `config.json` says. agentrun's
//! [`executor`] applies the spec's seccomp section (libcontainer built without libseccomp
//! ignores it) and adds agentrun's own hardening only when an annotation asks for it
//! ([`annotations`]); `SCMP_ACT_NOTIFY` rules are handed to the spec's seccomp agent
//! ([`seccomp_notify`]). One span per container lifetime, created at `create` and exported at
//! `delete` ([`record`]).
//!
//! `checkpoint` and `restore` go through CRIU ([`checkpoint`]).
//!
//! [`invocation`] decides whether an `agentrun` command line is a runc-style one.

pub mod annotations;
mod checkpoint;
mod cli;
mod container;
mod describe;
mod error;
pub mod executor;
mod globals;
mod info;
pub mod invocation;
mod lifecycle;
mod log;
mod manage;
pub mod record;
pub mod seccomp_notify;

use std::ffi::OsString;

pub use error::OciError;

/// Where container state lives when `--root` is not given (runc: `/run/runc`).
pub const DEFAULT_ROOT: &str = "/run/agentrun-oci";

/// Runs a runc-style command line (`args[0]` is the program name) and returns the process
/// exit code: 0, 1 on error (the message on stderr and, with `--log`, in the log file), or the
/// container process's code for `run` and `exec` without `--detach`. `install_log` is called
/// once the command line is parsed, with runc's log as a `tracing` layer: the caller makes it
/// part of the process's subscriber.
pub fn main(args: Vec<OsString>, install_log: impl FnOnce(LogLayer)) -> i32 {
    cli::main(args, install_log)
}

/// runc's log (`--log`, `--log-format`, `--debug`; the `log` module) as a layer of the process's
/// `tracing` subscriber, which the binary sets up.
pub type LogLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// Prints `text` and a newline on stdout; a reader that went away is not an error.
pub(crate) fn output(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}
