//! agentrun's MCP server: five tools a model calls to run code and touch files in a
//! sandbox, served with the official Rust SDK (`rmcp`) over stdio (`agentrun mcp`,
//! [`StdioFrontend`]) and Streamable HTTP behind the API key (`agentrun serve --mcp ADDR`,
//! [`HttpFrontend`]). Both run inside the daemon (its warm pool, its [`LiveManager`]).
//!
//! - [`tools`]: the tools' names, JSON schemas, descriptions written for a model, and their
//!   arguments parsed.
//! - [`handler`]: the MCP `ServerHandler`: lists and calls the tools, one `mcp.tool` span a
//!   call (continuing the caller's `_meta.traceparent`), the parent of its run's spans.
//! - [`session`]: the sandbox of an MCP session (made on the first call, torn down with the
//!   session, after an idle timeout, or after each call with `--one-shot`), its Python
//!   context and its egress proxy.
//! - [`run`]: `run_python` and `run_shell` in a session's sandbox, bounded in time and
//!   output.
//! - [`files`]: `write_file`, `read_file`, `list_files`, decided by the profile first and then
//!   done by a process inside the sandbox, so the kernel (Landlock) judges the final path
//!   exactly as it judges the model's own code.
//! - [`denials`]: what the policy refused, in words a model can act on: the profile's
//!   decisions, the egress proxy's, and kernel refusals explained from the profile.
//! - [`escalation`]: an `escalate` decision asked of the user through an MCP elicitation.
//! - [`http`]: the Streamable HTTP service and its API-key check.
//!
//! [`LiveManager`]: agentrun_pool::live::LiveManager

pub mod denials;
pub mod escalation;
pub mod files;
pub mod handler;
pub mod http;
pub mod run;
pub mod session;
pub mod stdio;
pub mod tools;

use std::path::PathBuf;
use std::time::Duration;

use agentrun_pool::recipe::SandboxRecipe;

pub use handler::McpServer;
pub use http::HttpFrontend;
pub use stdio::StdioFrontend;

/// Default of [`McpOptions::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Default of [`McpOptions::call_timeout`].
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Default of [`McpOptions::approval_timeout`].
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(60);

/// What every sandbox of the server is made from and how calls are served. Build with
/// [`McpOptions::new`] and the setters.
#[derive(Debug, Clone)]
pub struct McpOptions {
    /// What every sandbox is made from, as an `agentrun exec` run's: its image, profile
    /// (built-in name or file), host directory mounted at `/workspace` (read-write unless the
    /// profile says `ro`) and hosts allowed besides the profile's (`--allow-host`);
    /// [`SandboxRecipe::profile`] is the profile every decision is made by.
    pub recipe: SandboxRecipe,
    /// A fresh sandbox for every call (else one per MCP session).
    pub one_shot: bool,
    /// A session's sandbox idle this long is torn down (the next call makes a new one).
    pub idle_timeout: Duration,
    /// A call's time limit when it names none; a call may ask for less or more, up to the
    /// profile's `resources.timeout`.
    pub call_timeout: Duration,
    /// How long an escalation waits for the user's answer before it is a deny.
    pub approval_timeout: Duration,
    /// The audit log's directory.
    pub audit_dir: PathBuf,
    /// Credentials the sandboxes' proxies add to requests (`--credential`); TLS to their
    /// hosts (and to hosts the profile has HTTP rules for) is intercepted.
    pub credentials: Option<agentrun_egress::Vault>,
    /// Roots also trusted for upstream certificates when TLS is intercepted.
    pub upstream_roots: Vec<PathBuf>,
}

impl McpOptions {
    pub fn new(recipe: SandboxRecipe, audit_dir: PathBuf) -> Self {
        McpOptions {
            recipe,
            one_shot: false,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            approval_timeout: DEFAULT_APPROVAL_TIMEOUT,
            audit_dir,
            credentials: None,
            upstream_roots: Vec::new(),
        }
    }
    pub fn credentials(
        mut self,
        vault: Option<agentrun_egress::Vault>,
        roots: Vec<PathBuf>,
    ) -> Self {
        self.credentials = vault;
        self.upstream_roots = roots;
        self
    }
    pub fn one_shot(mut self, yes: bool) -> Self {
        self.one_shot = yes;
        self
    }
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d;
        self
    }
    pub fn call_timeout(mut self, d: Duration) -> Self {
        self.call_timeout = d;
        self
    }
    pub fn approval_timeout(mut self, d: Duration) -> Self {
        self.approval_timeout = d;
        self
    }
}
