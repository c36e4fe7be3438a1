//! The MCP server handler: `tools/list` and `tools/call` over a [`Session`].
//!
//! Each call is an `mcp.tool` span (`openinference.span.kind=TOOL`, `tool.name`,
//! `tool.parameters` cut to [`PARAMETERS_MAX`] bytes), continuing the caller's trace when
//! the request's `_meta` carries a `traceparent`; the run's `sandbox.exec` span and the
//! `policy.check` spans of its decisions are its children.
//!
//! The server speaks the MCP versions up to 2025-11-25. 2026-07-28 forbids requests from the
//! server to the client in the middle of a call, and an escalation is exactly that: the egress
//! proxy holds a connection of a running program while the user is asked. Clients that also
//! speak 2026-07-28 fall back to 2025-11-25 when the server offers no newer one.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrun_policy::{Action, Decision};
use agentrun_telemetry::decision::POLICY_CHECK;
use agentrun_telemetry::{
    trace_id_of, DecisionScope, ExecSpan, FrontEnd, RunFinish, RunSpan, Sinks,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::ErrorData;
use serde_json::{json, Value};

use crate::denials::{explain_output, Denial};
use crate::files::{self, FileError};
use crate::run::{self, RunOutput};
use crate::session::{Lease, Session, Shared};
use crate::tools::{self, ToolCall};

/// The most bytes of a call's arguments a span keeps.
pub const PARAMETERS_MAX: usize = 1024;

/// The name of a tool call's span.
pub const TOOL_SPAN: &str = "mcp.tool";

/// The MCP server of one session (stdio: the process; HTTP: one `Mcp-Session-Id`). Dropping
/// the last clone ends the session and tears its sandbox down.
#[derive(Clone)]
pub struct McpServer {
    session: Arc<Session>,
}

impl McpServer {
    /// A new session's server. Must be called on a tokio runtime (the idle reaper runs there).
    pub fn new(shared: Arc<Shared>) -> Self {
        McpServer {
            session: Session::new(shared),
        }
    }

    fn shared(&self) -> &Arc<Shared> {
        self.session.shared()
    }
}

fn run_result(
    out: RunOutput,
    denials: Vec<Denial>,
    sandbox_id: &str,
    note: Option<String>,
) -> CallToolResult {
    let mut notes = out.notes;
    notes.extend(note);
    let mut v = json!({
        "stdout": out.stdout,
        "stderr": out.stderr,
        "exit_code": out.exit_code,
        "timed_out": out.timed_out,
        "truncated": out.truncated,
        "denials": denials,
        "sandbox_id": sandbox_id,
    });
    if !notes.is_empty() {
        v["notes"] = json!(notes);
    }
    CallToolResult::structured(v)
}

fn error_result(kind: &str, message: impl Into<String>) -> CallToolResult {
    let message = message.into();
    let mut r = CallToolResult::structured_error(json!({"error": kind, "message": message}));
    r.content = vec![rmcp::model::ContentBlock::text(format!(
        "error ({kind}): {message}"
    ))];
    r
}

fn file_error(e: FileError) -> CallToolResult {
    let mut r = CallToolResult::structured_error(e.to_value());
    r.content = vec![rmcp::model::ContentBlock::text(e.text())];
    r
}

impl McpServer {
    /// The time limit of a run: asked for, else the server's default; never more than the
    /// profile's.
    fn run_timeout(&self, asked: Option<Duration>) -> Duration {
        let shared = self.shared();
        let t = asked.unwrap_or(shared.options.call_timeout);
        match shared.profile.resources.timeout {
            Some(max) => t.min(max),
            None => t,
        }
    }

    async fn call(
        &self,
        call: ToolCall,
        span: &mut RunSpan,
        peer: &rmcp::service::Peer<RoleServer>,
    ) -> CallToolResult {
        let shared = self.shared().clone();
        *agentrun_pool::lock(&self.session.peer) = Some(peer.clone());
        let lease = match self.session.lease().await {
            Ok(l) => l,
            Err(e) => return error_result("sandbox", e.to_string()),
        };
        span.set_attribute("sandbox.id", lease.sandbox.id().to_owned());
        span.set_attribute("sandbox.pool_hit", lease.sandbox.live.pool_hit());
        let trace = span.traceparent();
        lease.sandbox.watch.begin(trace.clone());
        match call {
            ToolCall::RunPython { code, timeout } => {
                let timeout = self.run_timeout(timeout);
                run_code(&shared, &lease, &trace, Code::Python(&code), timeout).await
            }
            ToolCall::RunShell { command, timeout } => {
                let timeout = self.run_timeout(timeout);
                run_code(&shared, &lease, &trace, Code::Shell(&command), timeout).await
            }
            ToolCall::WriteFile { path, content } => {
                let r = match files::absolute(shared.workdir(), &path) {
                    Ok(p) => {
                        let mut decide = decider(&shared, &lease, &trace);
                        files::write(
                            &shared,
                            &lease.sandbox,
                            &p,
                            content,
                            Some(peer),
                            &mut decide,
                        )
                        .await
                    }
                    Err(e) => Err(e),
                };
                file_result(r, lease.note.clone())
            }
            ToolCall::ReadFile {
                path,
                offset,
                limit,
            } => {
                let r = match files::absolute(shared.workdir(), &path) {
                    Ok(p) => {
                        let mut decide = decider(&shared, &lease, &trace);
                        files::read(&shared, &lease.sandbox, &p, offset, limit, &mut decide).await
                    }
                    Err(e) => Err(e),
                };
                file_result(r, lease.note.clone())
            }
            ToolCall::ListFiles { path } => {
                let r = match files::absolute(shared.workdir(), &path) {
                    Ok(p) => {
                        let mut decide = decider(&shared, &lease, &trace);
                        files::list(&shared, &lease.sandbox, &p, &mut decide).await
                    }
                    Err(e) => Err(e),
                };
                file_result(r, lease.note.clone())
            }
        }
    }
}

/// What a run runs.
enum Code<'a> {
    Python(&'a str),
    Shell(&'a str),
}

/// A run (`run_python`, `run_shell`) under its `sandbox.exec` span, its denials gathered.
async fn run_code(
    shared: &Shared,
    lease: &Lease,
    trace: &str,
    code: Code<'_>,
    timeout: Duration,
) -> CallToolResult {
    let (executable, line) = match code {
        Code::Python(c) => ("python3", c),
        Code::Shell(c) => (lease.sandbox.shell, c),
    };
    let mut exec = ExecSpan::new(Some(trace))
        .sandbox(lease.sandbox.id())
        .executable(executable)
        .command_line(line)
        .start();
    let env = vec![("TRACEPARENT".to_string(), exec.traceparent())];
    let started = Instant::now();
    let result = match code {
        Code::Python(c) => run::python(shared, &lease.sandbox, c, env, timeout).await,
        Code::Shell(c) => run::shell(shared, &lease.sandbox, c, env, timeout).await,
    };
    let elapsed = started.elapsed();
    let finish = match &result {
        Ok(out) => RunFinish::exited(FrontEnd::Mcp, out.exit_code, out.timed_out, elapsed),
        Err(agentrun_pool::PoolError::Spawn { message, .. }) => {
            RunFinish::failed(FrontEnd::Mcp, "spawn", message.as_str()).duration(elapsed)
        }
        Err(e) => RunFinish::failed(FrontEnd::Mcp, "sandbox", e.to_string()).duration(elapsed),
    };
    // The denials the sandbox reported during the run (not the ones explained from the
    // output below).
    let reported = match &result {
        Ok(_) => lease.sandbox.watch.take(),
        Err(_) => Vec::new(),
    };
    let finish = finish
        .profile(&shared.profile.name)
        .sandbox(lease.sandbox.id())
        .trace(trace)
        .command(&format!("{executable} {line}"))
        .denials(reported.iter().map(|d| d.rule_id.clone()).collect());
    // The daemon's metrics count it when served by `agentrun serve --mcp` (in `agentrun mcp`
    // nobody reads them); its audit record is a CLI run's: command line, exit code, outcome.
    let written = finish.write(Sinks {
        span: Some(&mut exec),
        audit: Some(&shared.audit),
        counter: Some(agentrun_pool::metrics::global()),
        ..Default::default()
    });
    if let Err(e) = written {
        tracing::error!(target: "agentrun::mcp", "audit log: {e}");
    }
    let r = match result {
        Ok(out) => {
            let mut denials = reported;
            for d in explain_output(&shared.profile, &[&out.stderr, &out.stdout]) {
                if !denials
                    .iter()
                    .any(|o| o.action == d.action && o.resource == d.resource)
                {
                    denials.push(d);
                }
            }
            exec.set_attribute("sandbox.denials", denials.len() as i64);
            run_result(out, denials, lease.sandbox.id(), lease.note.clone())
        }
        Err(agentrun_pool::PoolError::Spawn { message, .. }) => {
            error_result("cannot_start", format!("{executable}: {message}"))
        }
        Err(e) => error_result("sandbox", e.to_string()),
    };
    exec.finish_detached("mcp-span");
    r
}

fn file_result(r: Result<Value, FileError>, note: Option<String>) -> CallToolResult {
    match r {
        Ok(mut v) => {
            if let Some(n) = note {
                v["notes"] = json!([n]);
            }
            CallToolResult::structured(v)
        }
        Err(e) => file_error(e),
    }
}

/// Records a file tool's decision: a `policy.check` span in the call's trace and an audit
/// record.
fn decider<'a>(
    shared: &'a Shared,
    lease: &'a Lease,
    trace: &'a str,
) -> impl FnMut(&Action, &Decision) + Send + 'a {
    move |action, d| {
        let trace_id = trace_id_of(trace);
        let mut span = RunSpan::start(POLICY_CHECK, Some(trace));
        let scope = DecisionScope {
            profile: &shared.profile.name,
            sandbox_id: Some(lease.sandbox.id()),
            trace_id: &trace_id,
        };
        let record = scope.decision(&mut span, action, d, "agentrun");
        if !d.allow {
            agentrun_pool::metrics::global().denial(&d.rule_id);
        }
        if let Err(e) = shared.audit.append(&record) {
            tracing::error!(target: "agentrun::mcp", "audit log: {e}");
        }
        span.finish_detached("mcp-span");
    }
}

impl rmcp::ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_protocol_version(ProtocolVersion::V_2025_11_25)
            .with_server_info(Implementation::new("agentrun", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "agentrun runs code in kernel-enforced sandboxes. {} A tool result lists what the \
                 sandbox's policy refused (denials), with the rule and what is allowed instead.",
                self.shared().describe()
            ))
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(&[
            ProtocolVersion::V_2025_11_25,
            ProtocolVersion::V_2025_06_18,
            ProtocolVersion::V_2025_03_26,
            ProtocolVersion::V_2024_11_05,
        ])
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let about = self.shared().describe();
        let tools = tools::list(&about)
            .into_iter()
            .map(|t| {
                let schema = |v: Value| Arc::new(v.as_object().cloned().unwrap_or_default());
                Tool::new_with_raw(
                    t.name,
                    Some(Cow::Owned(t.description)),
                    schema(t.input_schema),
                )
                .with_title(t.title)
                .with_annotations(
                    ToolAnnotations::new()
                        .read_only(t.read_only)
                        .destructive(!t.read_only)
                        .open_world(false),
                )
            })
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let parent = request
            .meta
            .as_ref()
            .and_then(|m| m.get_traceparent())
            .or_else(|| context.meta.get_traceparent())
            .map(str::to_owned);
        let mut span = RunSpan::start(TOOL_SPAN, parent.as_deref());
        span.set_attribute("openinference.span.kind", "TOOL");
        span.set_attribute("tool.name", request.name.to_string());
        let args = request.arguments.clone().unwrap_or_default();
        span.set_attribute(
            "tool.parameters",
            agentrun_telemetry::cut(&Value::Object(args.clone()).to_string(), PARAMETERS_MAX),
        );
        span.set_attribute("sandbox.profile", self.shared().profile.name.clone());
        let result = match ToolCall::parse(&request.name, &args) {
            Ok(call) => self.call(call, &mut span, &context.peer).await,
            Err(e @ crate::tools::ToolError::UnknownTool(_)) => {
                let e = e.to_string();
                span.set_error("unknown_tool", &e);
                span.finish_detached("mcp-span");
                return Err(ErrorData::invalid_params(e, None));
            }
            Err(e) => error_result("invalid_arguments", e.to_string()),
        };
        if result.is_error == Some(true) {
            let kind = result
                .structured_content
                .as_ref()
                .and_then(|v| v["error"].as_str())
                .unwrap_or("error")
                .to_owned();
            span.set_error(&kind, &text_of(&result));
        }
        span.finish_detached("mcp-span");
        Ok(result.into())
    }
}

fn text_of(r: &CallToolResult) -> String {
    r.content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_default()
}
