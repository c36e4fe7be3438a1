//! The MCP server's e2e harness: real MCP clients (`tests/mcp/*.py`: the official `mcp` SDK,
//! LangGraph with langchain-mcp-adapters, Google ADK, CrewAI) driving `agentrun mcp` on stdio
//! (the client starts it, as every MCP host does) or `agentrun serve --mcp` over Streamable
//! HTTP, in a private state dir, with a private audit dir and an OTLP receiver for the spans.
//! After each scenario: no `agentrun mcp` process of the state dir is left, and no sandbox
//! process, mount, cgroup or state dir.
//!
//! The clients live in venvs `hack/test` makes (missing is a failure, never a skip):
//! `.venv/mcp` (mcp, langgraph + langchain-mcp-adapters, google-adk) and `.venv/test`
//! (crewai-tools 1.13.0 with mcpadapt: crewai pins OpenTelemetry 1.34, google-adk needs a
//! newer one).

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::otlp::{OtlpReceiver, ReceivedSpan};
use crate::*;

/// Deadline of one scenario (debug build, 2 shared cores, frameworks that import a lot).
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(300);

/// Which venv's python runs a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Venv {
    /// `.venv/mcp`: mcp, langgraph, langchain-mcp-adapters, google-adk.
    Mcp,
    /// `.venv/test`: crewai-tools with its `mcp` extra (MCPServerAdapter, mcpadapt).
    CrewAi,
}

impl Venv {
    pub fn python(self) -> PathBuf {
        let dir = match self {
            Venv::Mcp => ".venv/mcp",
            Venv::CrewAi => ".venv/test",
        };
        let p = workspace_root().join(dir).join("bin/python");
        assert!(
            p.exists(),
            "{} is missing: run hack/test (it creates {dir} with the MCP clients)",
            p.display()
        );
        p
    }
}

/// A client script of `tests/mcp/` and its venv.
#[derive(Clone, Copy, Debug)]
pub struct Client {
    pub script: &'static str,
    pub venv: Venv,
}

pub const SDK: Client = Client {
    script: "sdk_client.py",
    venv: Venv::Mcp,
};
pub const LANGGRAPH: Client = Client {
    script: "langgraph_agent.py",
    venv: Venv::Mcp,
};
pub const ADK: Client = Client {
    script: "adk_agent.py",
    venv: Venv::Mcp,
};
pub const CREWAI: Client = Client {
    script: "crewai_agent.py",
    venv: Venv::CrewAi,
};

/// A workspace for the sandboxes: world-accessible (the sandbox's root is an unprivileged
/// host uid), with `secret.txt`, `host.txt` and a writable `out/`.
/// `.venv/mcp`'s site-packages: what a throwaway user's `/usr/bin/python3` puts on
/// PYTHONPATH to run the MCP clients (the venv's own interpreter is under root's private home).
pub fn venv_site_packages() -> PathBuf {
    let lib = workspace_root().join(".venv/mcp/lib");
    std::fs::read_dir(&lib)
        .unwrap_or_else(|e| panic!("{}: {e} (hack/test makes .venv/mcp)", lib.display()))
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .expect(".venv/mcp has a site-packages")
}

pub fn workspace() -> tempfile::TempDir {
    let ws = tempdir();
    std::fs::write(ws.path().join("secret.txt"), "s3cr3t-token\n").unwrap();
    std::fs::write(ws.path().join("host.txt"), "from the host\n").unwrap();
    std::fs::create_dir(ws.path().join("out")).unwrap();
    for p in [ws.path().to_path_buf(), ws.path().join("out")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    for f in ["secret.txt", "host.txt"] {
        std::fs::set_permissions(ws.path().join(f), std::fs::Permissions::from_mode(0o666))
            .unwrap();
    }
    ws
}

/// One test's world: a private state dir, audit dir and OTLP receiver.
pub struct McpEnv {
    root: Option<tempfile::TempDir>,
    state: PathBuf,
    pub audit: tempfile::TempDir,
    pub rx: OtlpReceiver,
    before: Leftovers,
}

impl Default for McpEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl McpEnv {
    pub fn new() -> McpEnv {
        let root = tempdir();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let state = root.path().join("state");
        let before = Leftovers::snapshot_own(&state);
        McpEnv {
            root: Some(root),
            state,
            audit: tempdir(),
            rx: OtlpReceiver::grpc(),
            before,
        }
    }

    pub fn state(&self) -> &Path {
        &self.state
    }

    /// The client command for `scenario` of `client`, against `agentrun mcp SERVER_ARGS...`
    /// (stdio) with this state dir, audit dir and OTLP endpoint.
    pub fn command(&self, client: Client, scenario: &str, server_args: &[&str]) -> Command {
        let mut cmd = Command::new(client.venv.python());
        cmd.arg(workspace_root().join("tests/mcp").join(client.script))
            .arg(scenario)
            .current_dir(workspace_root().join("tests/mcp"))
            .env("MCP_AGENTRUN", agentrun_bin())
            .env("MCP_ARGS", serde_json::to_string(server_args).unwrap())
            .env("AGENTRUN_STATE_DIR", &self.state)
            .env("AGENTRUN_AUDIT_DIR", self.audit.path())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("PYTHONUNBUFFERED", "1")
            // CrewAI's own telemetry and tracing go to the Internet: off.
            .env("CREWAI_DISABLE_TELEMETRY", "true")
            .env("CREWAI_TRACING_ENABLED", "false")
            .env("CREWAI_DISABLE_TRACKING", "true")
            .env_remove("AGENTRUN_NO_DAEMON")
            .env_remove("MCP_URL")
            .env_remove("MCP_API_KEY");
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("OTEL_") {
                cmd.env_remove(k);
            }
        }
        for (k, v) in self.rx.otel_env() {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs `scenario` of `client` against `agentrun mcp SERVER_ARGS...` (the client starts
    /// the server on stdio, as every MCP host does); panics with its output unless it
    /// printed `OK scenario` and exited 0. Then checks that nothing is left. Returns stdout.
    pub fn run(&self, client: Client, scenario: &str, server_args: &[&str]) -> String {
        self.run_with(client, scenario, server_args, &[])
    }

    /// [`McpEnv::run`] with more environment for the client.
    pub fn run_with(
        &self,
        client: Client,
        scenario: &str,
        server_args: &[&str],
        env: &[(&str, String)],
    ) -> String {
        let mut cmd = self.command(client, scenario, server_args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = run_with_timeout(cmd, None, SCENARIO_TIMEOUT);
        let ok = out.status.code() == Some(0) && out.stdout().contains(&format!("OK {scenario}"));
        if !ok {
            self.cleanup();
            panic!("{} {scenario} failed\n{out}", client.script);
        }
        self.assert_clean(&format!("{} {scenario}", client.script));
        out.stdout()
    }

    /// The `agentrun` processes running with this state dir: the servers (`agentrun mcp`,
    /// `serve`) and the helpers they start (a sandbox's own processes run the binary too).
    pub fn servers(&self) -> Vec<ProcInfo> {
        let want = format!("AGENTRUN_STATE_DIR={}", self.state.display());
        all_processes()
            .into_iter()
            .filter(|p| {
                p.cmdline
                    .first()
                    .is_some_and(|a| Path::new(a).file_name() == Some("agentrun".as_ref()))
            })
            .filter(|p| {
                std::fs::read(format!("/proc/{}/environ", p.pid))
                    .map(|env| env.split(|b| *b == 0).any(|kv| kv == want.as_bytes()))
                    .unwrap_or(false)
            })
            .collect()
    }

    /// No server process of this state dir, no sandbox process, mount, cgroup or state dir
    /// left (within a grace period for the teardown after the client closed stdin).
    pub fn assert_clean(&self, context: &str) {
        let mut left = String::new();
        let clean = wait_until(Duration::from_secs(20), || {
            let servers = self.servers();
            let new = Leftovers::snapshot_own(&self.state).new_since(&self.before);
            if servers.is_empty() && new.is_empty() {
                return Some(());
            }
            left = servers.iter().map(|p| format!("  server: {p}\n")).collect();
            left.push_str(&new.to_string());
            None
        });
        if clean.is_none() {
            self.cleanup();
            panic!("{context}: left behind:\n{left}");
        }
    }

    /// Removes by force what a failed scenario left.
    fn cleanup(&self) {
        for p in self.servers() {
            // SAFETY: kill(2) on a pid we just listed as our own agentrun process.
            unsafe { libc::kill(p.pid, libc::SIGKILL) };
        }
        force_cleanup_in(&self.state, &self.before);
    }

    /// Waits for spans until `done` says they are all there (or 20 s pass); returns them.
    pub fn spans_until(&self, done: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        wait_until(Duration::from_secs(20), || {
            let s = self.rx.spans();
            done(&s).then_some(s)
        })
        .unwrap_or_else(|| self.rx.spans())
    }

    /// Every audit record (`agentrun audit --json`).
    pub fn audit_records(&self) -> Vec<serde_json::Value> {
        let out = agentrun(["audit", "--json"])
            .env("AGENTRUN_AUDIT_DIR", self.audit.path())
            .run();
        out.success()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    }
}

impl Drop for McpEnv {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.cleanup();
        }
        if let Some(root) = self.root.take() {
            crate::remove_state_root(root, "its MCP clients and servers exited");
        }
    }
}

/// The `mcp.tool` spans of tool `name`.
pub fn tool_spans<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| {
            s.name == "mcp.tool" && s.attributes.get("tool.name").map(String::as_str) == Some(name)
        })
        .collect()
}

/// The children of `parent` named `name`.
pub fn children<'a>(
    spans: &'a [ReceivedSpan],
    parent: &ReceivedSpan,
    name: &str,
) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| {
            s.name == name && s.trace_id == parent.trace_id && s.parent_span_id == parent.span_id
        })
        .collect()
}

/// Asserts an `mcp.tool` span's attributes: a TOOL span of tool `name` in a sandbox.
pub fn assert_tool_span(s: &ReceivedSpan, name: &str) {
    assert_eq!(s.attr("openinference.span.kind"), "TOOL", "{s:#?}");
    assert_eq!(s.attr("tool.name"), name, "{s:#?}");
    let params = s.typed_attr("tool.parameters", "string");
    assert!(
        serde_json::from_str::<serde_json::Value>(params).is_ok() || params.len() >= 1024,
        "tool.parameters is JSON (or truncated at 1 KiB): {params}"
    );
    assert!(!s.attr("sandbox.id").is_empty(), "{s:#?}");
}

/// Asserts a `policy.check` span's decision.
pub fn assert_check(s: &ReceivedSpan, action: &str, resource: &str, decision: &str) {
    assert_eq!(s.typed_attr("sandbox.action", "string"), action, "{s:#?}");
    assert_eq!(
        s.typed_attr("sandbox.resource", "string"),
        resource,
        "{s:#?}"
    );
    assert_eq!(
        s.typed_attr("sandbox.decision", "string"),
        decision,
        "{s:#?}"
    );
    assert!(
        !s.typed_attr("sandbox.rule_id", "string").is_empty(),
        "{s:#?}"
    );
    assert!(
        !s.typed_attr("sandbox.reason", "string").is_empty(),
        "{s:#?}"
    );
}

/// The JSON of a `KEY {...}` line a scenario printed.
pub fn printed_json(stdout: &str, key: &str) -> serde_json::Value {
    let line = crate::osb::printed(stdout, key);
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{key} {line}: {e}"))
}

/// Sandbox ids named by the spans.
pub fn sandbox_ids(spans: &[&ReceivedSpan]) -> BTreeSet<String> {
    spans
        .iter()
        .filter_map(|s| s.attributes.get("sandbox.id").cloned())
        .collect()
}

/// `agentrun serve --mcp 127.0.0.1:PORT --api-key KEY EXTRA...` with this env's audit dir
/// and OTLP endpoint; returns the daemon and the MCP URL.
pub fn serve_http(env: &McpEnv, key: &str, extra: &[&str]) -> (Daemon, String) {
    serve_http_with(env, key, extra, &[])
}

/// [`serve_http`] with more environment for the daemon (`daemon_env`).
pub fn serve_http_with(
    env: &McpEnv,
    key: &str,
    extra: &[&str],
    daemon_env: &[(&str, &str)],
) -> (Daemon, String) {
    let mut d = Daemon::unstarted();
    for (k, v) in daemon_env {
        d.set_env(k, v);
    }
    for (k, v) in env.rx.otel_env() {
        d.set_env(k, v);
    }
    d.set_env("AGENTRUN_AUDIT_DIR", env.audit.path());
    let addr = format!("127.0.0.1:{}", crate::osb::free_port());
    let mut args = vec!["--pool-size", "1", "--mcp", addr.as_str(), "--api-key", key];
    args.extend_from_slice(extra);
    d.launch(args);
    (d, format!("http://{addr}/mcp"))
}
