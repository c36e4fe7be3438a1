//! What a sandbox's [`Record`](crate::Record) holds for the APIs above it, the types only: a
//! code context and the code state ([`crate::code`]), a command and a session
//! ([`crate::execd`]), the egress proxy and its policy ([`crate::egress`]), a snapshot being
//! taken ([`crate::lifecycle::snapshots`]). What they do stays with the API that owns them;
//! here they sit below both it and the [`Server`](crate::Server)'s record of the sandbox.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agentrun_egress::{Proxy, Vault};
use agentrun_policy::OpenSandboxPolicy;
use agentrun_pool::lock;
use agentrun_pool::output_log::OutputLog;
use agentrun_pool::process::InteractiveProcess;
use agentrun_pool::python::PythonContext;
use agentrun_telemetry::AuditLog;
use chrono::{DateTime, Utc};

/// The code state of one sandbox.
#[derive(Default)]
pub struct CodeState {
    pub(crate) contexts: HashMap<String, Arc<CodeContext>>,
    /// The context used when a request names none, per language.
    pub(crate) defaults: HashMap<String, String>,
    /// Execution id -> context id (for interrupts).
    pub(crate) executions: HashMap<String, String>,
}

/// One code context: a persistent interpreter running agentrun's driver.
pub struct CodeContext {
    pub id: String,
    pub language: String,
    /// Its interpreter's working directory (expanded), where a restart starts the next.
    pub cwd: String,
    pub python: Arc<PythonContext>,
}

/// What execd knows about one command.
pub struct Command {
    pub id: String,
    pub content: String,
    /// Its process (and process group) in the sandbox.
    pub process: u64,
    pub started_at: DateTime<Utc>,
    pub state: Mutex<CommandState>,
}

pub struct CommandState {
    pub running: bool,
    pub exit_code: Option<i32>,
    pub error: String,
    pub finished_at: Option<DateTime<Utc>>,
    /// stdout and stderr lines, in arrival order (the newest `LOG_CAP_BYTES`, less when its
    /// sandbox's logs are over their budget).
    pub log: OutputLog,
}

/// A persistent shell and the marker that ends each run's output.
pub struct Session {
    pub id: String,
    pub(crate) shell: InteractiveProcess,
    pub(crate) marker: String,
}

/// The enforced network policy of one sandbox and the proxy enforcing it.
pub struct SandboxEgress {
    pub(crate) sandbox_id: String,
    /// The policy as the API shows and changes it.
    pub(crate) policy: Mutex<OpenSandboxPolicy>,
    pub(crate) proxy: Mutex<Option<Proxy>>,
    pub(crate) audit: AuditLog,
    /// `traceparent` of the sandbox's `sandbox.create` span.
    pub(crate) trace: String,
    /// The credential vault its proxy injects from.
    pub(crate) vault: Vault,
    /// Whether the proxy intercepts TLS (`credentialProxy.enabled`).
    pub(crate) credential_proxy: bool,
}

impl SandboxEgress {
    /// The proxy, to stop off the async threads (before the sandbox's state dir goes away);
    /// later changes only update the stored policy.
    pub fn take_proxy(&self) -> Option<Proxy> {
        lock(&self.proxy).take()
    }
}

/// A snapshot not (or not yet) in the store: being taken, or failed.
#[derive(Debug, Clone)]
pub struct PendingSnapshot {
    pub id: String,
    pub sandbox_id: String,
    pub name: Option<String>,
    pub owner: String,
    pub created_at: DateTime<Utc>,
    /// `Creating` or `Failed`, with the reason code, message and when.
    pub state: &'static str,
    pub reason: &'static str,
    pub message: String,
    pub since: DateTime<Utc>,
}
