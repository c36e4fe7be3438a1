//! The inside wing: code that runs inside a sandbox, in processes agentrun forks or
//! libcontainer starts: the container init ([`executor`]), a shell's init ([`shell`]), the
//! cell it makes per run ([`cell`]), a cell's PID 1 ([`reaper`]), the Python zygote
//! ([`zygote`]), and the pieces they share (spawning, users, loopback networking).

pub mod cell;
pub(crate) mod executor;
pub(crate) mod kernel;
pub(crate) mod live;
pub(crate) mod net;
pub(crate) mod reaper;
pub(crate) mod shell;
pub(crate) mod spawn;
pub(crate) mod user;
pub mod zygote;
