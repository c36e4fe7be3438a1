//! TEMPORARY: a local copy of the daemon's `observe` contract (crates/pool/src/observe.rs on
//! main), deleted once main's lands in this branch.

use agentrun_pool::protocol::{PoolStatus, SandboxInfo};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunningCommand {
    pub id: String,
    pub kind: String,
    pub sandbox: String,
    pub shell: String,
    pub image: String,
    pub profile: String,
    pub command: String,
    pub started_unix_ms: u64,
    pub elapsed_ms: u64,
    pub cpu_ms: Option<u64>,
    pub memory_bytes: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Window {
    pub seconds: u32,
    pub runs_per_second: Vec<u32>,
    pub p50_ms_per_second: Vec<Option<f64>>,
    pub runs: u64,
    pub runs_per_s: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub unix_ms: u64,
    pub status: PoolStatus,
    pub shells: Vec<SandboxInfo>,
    pub commands: Vec<RunningCommand>,
    pub window: Window,
    pub daemon_memory_bytes: Option<u64>,
}

/// TEMPORARY: the daemon's picture from `ps` and `pool status` until `DaemonClient::top` lands
/// (no running commands, no window).
pub fn snapshot(
    client: &agentrun_pool::client::DaemonClient,
    socket: &std::path::Path,
) -> Result<Snapshot, agentrun_pool::PoolError> {
    use agentrun_pool::client::DaemonClient;
    use agentrun_pool::protocol::{ClientMessage, DaemonReply};
    let unexpected = || agentrun_pool::PoolError::Invalid("unexpected reply".into());
    let DaemonReply::PoolStatus(status) = client.call(&ClientMessage::PoolStatus)? else {
        return Err(unexpected());
    };
    let again = DaemonClient::connect(socket)
        .ok_or_else(|| agentrun_pool::PoolError::Invalid("daemon gone".into()))?;
    let DaemonReply::Ps { sandboxes } = again.call(&ClientMessage::Ps)? else {
        return Err(unexpected());
    };
    Ok(Snapshot {
        unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        status,
        shells: sandboxes,
        commands: Vec::new(),
        window: Window {
            seconds: 60,
            ..Default::default()
        },
        daemon_memory_bytes: None,
    })
}
