//! agentrun's MCP server driven by the official MCP Python SDK (`mcp`, in `.venv/mcp`):
//! `agentrun mcp` on stdio (started by the SDK's stdio client, as every MCP host starts it)
//! and `agentrun serve --mcp` over Streamable HTTP behind the API key.
//!
//! Each test runs one scenario of `tests/mcp/sdk_client.py` (which asserts what an MCP client
//! sees and exits non-zero on the first failed check), then checks that the server is gone
//! and left nothing on the host (processes, mounts, cgroups, state dirs). Scenarios: the tools
//! and their schemas, prints, a persistent interpreter per session and none shared between
//! sessions, `--one-shot`, the file tools round trip in /workspace (and on the host), ranges,
//! errors, a timeout, denials with their rule and reason, escalation answered yes, no,
//! declined and unasked, HTTP with and without the key, and the `mcp.tool` spans.

use std::time::Duration;

use agentrun_e2e::mcp::*;
use agentrun_e2e::*;

fn ci_with(ws: &tempfile::TempDir) -> Vec<String> {
    vec![
        "--profile".into(),
        "code-interpreter".into(),
        "--workspace".into(),
        ws.path().display().to_string(),
    ]
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn stdio_tools_run_python_and_shell() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    env.run(SDK, "basics", &[]);
}

#[test]
fn stdio_sessions_keep_globals_apart() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    env.run(SDK, "sessions", &[]);
}

#[test]
fn stdio_one_shot_is_a_fresh_sandbox_per_call() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    env.run(SDK, "one_shot", &["--one-shot"]);
}

#[test]
fn stdio_file_tools_round_trip_in_the_workspace() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    let ws = workspace();
    env.run(SDK, "files", &args(&ci_with(&ws)));
    // What the tools wrote is on the host.
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes/a.txt")).unwrap(),
        "one\ntwo\nthree\nfour\nfive\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("b.txt")).unwrap(),
        "bee"
    );
}

#[test]
fn stdio_timeout_is_reported() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    env.run(SDK, "timeout", &[]);
}

/// A write outside the workspace and a network call: refused, with the rule and a reason;
/// nothing written on the host.
#[test]
fn stdio_denials_carry_rule_and_reason() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    let ws = workspace();
    let out = env.run(SDK, "denials", &args(&ci_with(&ws)));
    let w = printed_json(&out, "WRITE_DENIAL");
    assert!(
        w["rule_id"].as_str().unwrap().starts_with("filesystem."),
        "{w}"
    );
    let n = printed_json(&out, "NET_DENIAL");
    assert_eq!(n["resource"], "example.com:80", "{n}");
    assert_eq!(n["rule_id"], "network.default", "{n}");
    assert!(!std::path::Path::new("/etc/agentrun-mcp-evil").exists());
    assert_eq!(
        std::fs::read_to_string(ws.path().join("ok.txt")).unwrap(),
        "fine"
    );
    // The network denial is an audit record and a policy.check span.
    let records = env.audit_records();
    assert!(
        records.iter().any(|r| r["action"] == "net.connect"
            && r["resource"] == "example.com:80"
            && r["decision"] == "deny"),
        "{records:#?}"
    );
}

#[test]
fn stdio_escalation_answered_yes_allows() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    let out = env.run(SDK, "escalate_yes", &[]);
    let up = osb::printed(&out, "UPSTREAM").to_string();
    let spans = env.spans_until(|s| {
        s.iter()
            .any(|x| x.name == "policy.check" && x.attributes.get("sandbox.resource") == Some(&up))
    });
    let checks: Vec<_> = spans
        .iter()
        .filter(|x| x.name == "policy.check" && x.attr("sandbox.resource") == up)
        .collect();
    assert!(!checks.is_empty(), "{spans:#?}");
    assert!(
        checks
            .iter()
            .any(|c| c.attr("sandbox.decision") == "escalate"),
        "the decision is escalate: {checks:#?}"
    );
    assert!(
        checks.iter().all(|c| c.attr("sandbox.blocked") == "false"),
        "approved: not blocked: {checks:#?}"
    );
}

#[test]
fn stdio_escalation_answered_no_denies() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    let out = env.run(SDK, "escalate_no", &[]);
    let up = osb::printed(&out, "UPSTREAM").to_string();
    let d = printed_json(&out, "DENIAL");
    assert_eq!(d["resource"], up.as_str(), "{d}");
    let spans = env.spans_until(|s| {
        s.iter()
            .any(|x| x.name == "policy.check" && x.attributes.get("sandbox.resource") == Some(&up))
    });
    let checks: Vec<_> = spans
        .iter()
        .filter(|x| x.name == "policy.check" && x.attr("sandbox.resource") == up)
        .collect();
    assert!(
        checks.iter().any(
            |c| c.attr("sandbox.decision") == "escalate" && c.attr("sandbox.blocked") == "true"
        ),
        "escalated and refused: {checks:#?}"
    );
}

#[test]
fn stdio_escalation_declined_denies() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    env.run(SDK, "escalate_decline", &[]);
}

#[test]
fn stdio_escalation_without_elicitation_capability_denies() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    env.run(SDK, "escalate_unasked", &[]);
}

/// Each call is an `mcp.tool` span (TOOL, its name and arguments, the sandbox), the parent of
/// its run's `sandbox.exec`; a call whose `_meta` carries a traceparent continues that trace;
/// the run sees its own TRACEPARENT; a file tool's decision is a `policy.check` child.
#[test]
fn stdio_tool_calls_are_spans_parenting_the_run() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    let ws = workspace();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    env.run_with(
        SDK,
        "traced",
        &args(&ci_with(&ws)),
        &[("MCP_TRACEPARENT", format!("00-{trace}-{parent}-01"))],
    );
    let spans = env.spans_until(|s| {
        tool_spans(s, "run_python").len() >= 2
            && tool_spans(s, "write_file").len() == 1
            && s.iter().filter(|x| x.name == "sandbox.exec").count() >= 2
    });
    let runs = tool_spans(&spans, "run_python");
    assert_eq!(runs.len(), 2, "{spans:#?}");
    for t in &runs {
        assert_tool_span(t, "run_python");
        let execs = children(&spans, t, "sandbox.exec");
        assert_eq!(execs.len(), 1, "one sandbox.exec under {t:#?}\n{spans:#?}");
        assert_eq!(execs[0].attr("sandbox.id"), t.attr("sandbox.id"));
    }
    let traced: Vec<_> = runs.iter().filter(|t| t.trace_id == trace).collect();
    assert_eq!(
        traced.len(),
        1,
        "the call with _meta.traceparent: {runs:#?}"
    );
    assert_eq!(traced[0].parent_span_id, parent);
    assert!(traced[0].attr("tool.parameters").contains("traced"));
    let other: Vec<_> = runs.iter().filter(|t| t.trace_id != trace).collect();
    assert_eq!(other.len(), 1);
    assert!(
        other[0].parent_span_id.is_empty(),
        "a root span: {:#?}",
        other[0]
    );
    // One session, one sandbox.
    assert_eq!(sandbox_ids(&runs).len(), 1, "{runs:#?}");
    let w = tool_spans(&spans, "write_file");
    assert_tool_span(w[0], "write_file");
    let checks = children(&spans, w[0], "policy.check");
    assert_eq!(checks.len(), 1, "{spans:#?}");
    assert_check(checks[0], "fs.write", "/workspace/t.txt", "allow");
}

/// Streamable HTTP behind the API key: the same tools and sessions; no key, a wrong key and
/// a non-bearer key are 401 with a JSON error.
#[test]
fn http_with_api_key() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    let key = "k-mcp-e2e";
    let (d, url) = serve_http(&env, key, &[]);
    let mut cmd = env.command(SDK, "http", &[]);
    cmd.env("MCP_URL", &url)
        .env("MCP_API_KEY", key)
        .env("AGENTRUN_STATE_DIR", d.state());
    let out = run_with_timeout(cmd, None, SCENARIO_TIMEOUT);
    assert!(
        out.status.code() == Some(0) && out.stdout().contains("OK http"),
        "http scenario failed\n{out}\n{}",
        d.log()
    );
    let spans = env.spans_until(|s| tool_spans(s, "run_python").len() >= 5);
    let runs = tool_spans(&spans, "run_python");
    assert!(runs.len() >= 5, "{spans:#?}");
    // basics (one session) + sessions (three sessions): at least four sandboxes.
    assert!(sandbox_ids(&runs).len() >= 4, "{runs:#?}");
    osb::stop_clean(d);
    env.assert_clean("serve --mcp");
}

/// Bad options: one line, a non-zero exit, nothing started.
#[test]
fn bad_options_fail_fast() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    for (args, says) in [
        (
            vec!["mcp", "--profile", "no-such-profile"],
            "no-such-profile",
        ),
        (vec!["mcp", "--workspace", "/no/such/dir"], "/no/such/dir"),
        (vec!["mcp", "--idle-timeout", "0s"], "idle-timeout"),
        (vec!["mcp", "--allow-host", "bad host"], "allow-host"),
    ] {
        let out = agentrun(&args)
            .env("AGENTRUN_STATE_DIR", env.state())
            .timeout(Duration::from_secs(30))
            .run();
        assert_ne!(out.code(), 0, "{out}");
        assert!(out.stdout().is_empty(), "stdout is the protocol's: {out}");
        let err = out.stderr();
        assert!(err.contains(says), "{args:?}: {out}");
        assert!(err.trim().lines().count() <= 3, "a short error: {out}");
    }
    env.assert_clean("bad options");
}

/// `escalate_write`: write_file to an escalated path asks; approved, the file is made (in the
/// workspace: on the host) though the code itself still cannot write there; a write
/// approved outside the workspace never reaches the host's own file.
#[test]
fn stdio_write_escalation_answered_yes() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    let ws = workspace();
    let ws_arg = ws.path().display().to_string();
    let out = env.run(SDK, "escalate_write_yes", &["--workspace", &ws_arg]);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("protected/ok.txt")).unwrap(),
        "approved\n"
    );
    assert!(!ws.path().join("other.txt").exists());
    assert!(!ws.path().join("protected/by-code.txt").exists());
    assert!(
        !std::path::Path::new("/etc/agentrun-esc-probe").exists(),
        "an approved write reached the host's /etc: {}",
        osb::printed(&out, "ETC_PROBE")
    );
}

#[test]
fn stdio_write_escalation_answered_no() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    let ws = workspace();
    let ws_arg = ws.path().display().to_string();
    env.run(SDK, "escalate_write_no", &["--workspace", &ws_arg]);
    assert!(!ws.path().join("protected").exists());
    assert!(!std::path::Path::new("/etc/agentrun-esc-probe").exists());
}

/// No answer within `--approval-timeout`: a deny, at the timeout.
#[test]
fn stdio_escalation_unanswered_denies_at_the_timeout() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    env.run(SDK, "escalate_timeout", &["--approval-timeout", "3s"]);
    // The client's callback answers after 20 s; the server answered the call at the timeout.
    let spans = env.spans_until(|s| tool_spans(s, "run_python").len() == 1);
    let t = tool_spans(&spans, "run_python");
    assert_eq!(t.len(), 1, "{spans:#?}");
    let took = t[0].duration();
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(15),
        "the call took {took:?}"
    );
}

/// The client dies (SIGKILL) with a session's sandbox up: the server sees its stdin close,
/// tears everything down and exits.
#[test]
fn stdio_client_killed_leaves_nothing() {
    let Some(_lock) = setup() else { return };
    let env = McpEnv::new();
    let mut client = Running::spawn(env.command(SDK, "hold", &[]), None);
    let ready = wait_until(SCENARIO_TIMEOUT, || {
        if client.exited() {
            return Some(false);
        }
        client.stdout_so_far().contains("READY").then_some(true)
    });
    assert_eq!(
        ready,
        Some(true),
        "the session came up: {}",
        client.stderr_so_far()
    );
    // The server is the client's child (the processes it forks show the same command line).
    let ppid = |pid: i32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after = stat
            .rsplit_once(')')
            .map(|(_, r)| r.to_string())
            .unwrap_or_default();
        after
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok())
    };
    let servers = env.servers();
    let mcp: Vec<_> = servers
        .iter()
        .filter(|p| ppid(p.pid) == Some(client.pid()))
        .collect();
    assert_eq!(
        mcp.len(),
        1,
        "agentrun mcp is the client's child: {servers:#?}"
    );
    assert_eq!(mcp[0].cmdline.get(1).map(String::as_str), Some("mcp"));
    client.kill9();
    env.assert_clean("agentrun mcp after its client was killed");
}
