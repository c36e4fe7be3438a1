//! The eight scenarios of the policy seed, through MCP (the official `mcp` SDK client on
//! stdio, tests/mcp/sdk_client.py), each with what the tool returned (a denial with its rule
//! and reason) and its spans: the call's `mcp.tool` span (`openinference.span.kind=TOOL`), the
//! run's `sandbox.exec` under it, the `policy.check` spans of its decisions with their
//! `sandbox.decision`; and the audit records.
//!
//! Filesystem scenarios run under `--profile strict --workspace WS` (reads only in the
//! workspace and the system's programs, writes only under /workspace/out and /tmp, no
//! network); network ones under `--profile code-interpreter --workspace WS` (an allowlist
//! enforced by the egress proxy, so every connection is a decision).

use std::path::Path;

use agentrun_e2e::mcp::*;
use agentrun_e2e::otlp::ReceivedSpan;
use agentrun_e2e::*;

fn profile_args(profile: &str, ws: &tempfile::TempDir) -> [String; 4] {
    [
        "--profile".into(),
        profile.into(),
        "--workspace".into(),
        ws.path().display().to_string(),
    ]
}

/// Runs `scenario` under `profile` with a fresh workspace; returns (env, workspace, stdout).
fn scenario(profile: &str, name: &str) -> (McpEnv, tempfile::TempDir, String) {
    let env = McpEnv::new();
    let ws = workspace();
    let a = profile_args(profile, &ws);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let out = env.run(SDK, name, &a);
    (env, ws, out)
}

/// `policy.check` spans in `tool`'s trace under it (its child, or its `sandbox.exec`'s).
fn checks_under<'a>(spans: &'a [ReceivedSpan], tool: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    let execs: Vec<&ReceivedSpan> = children(spans, tool, "sandbox.exec");
    spans
        .iter()
        .filter(|s| s.name == "policy.check" && s.trace_id == tool.trace_id)
        .filter(|s| {
            s.parent_span_id == tool.span_id || execs.iter().any(|e| e.span_id == s.parent_span_id)
        })
        .collect()
}

/// Waits for `n` `mcp.tool` spans of `tool` and for `checks` policy.check spans.
fn wait_spans(env: &McpEnv, tool: &str, n: usize, checks: usize) -> Vec<ReceivedSpan> {
    env.spans_until(|s| {
        tool_spans(s, tool).len() >= n
            && s.iter().filter(|x| x.name == "policy.check").count() >= checks
    })
}

/// The audit has a decision `decision` on `action resource`.
fn assert_audited(env: &McpEnv, action: &str, resource: &str, decision: &str) {
    let records = env.audit_records();
    assert!(
        records.iter().any(|r| r["kind"] == "decision"
            && r["action"] == action
            && r["resource"] == resource
            && r["decision"] == decision
            && r["rule"].as_str().is_some_and(|s| !s.is_empty())),
        "no {decision} {action} {resource} in the audit: {records:#?}"
    );
}

/// 1. A read in the workspace is allowed.
#[test]
fn allowed_read_in_the_workspace() {
    let Some(_lock) = setup() else { return };
    let (env, _ws, _) = scenario("strict", "allowed_read");
    let spans = wait_spans(&env, "read_file", 1, 1);
    let t = tool_spans(&spans, "read_file");
    assert_eq!(t.len(), 1, "{spans:#?}");
    assert_tool_span(t[0], "read_file");
    let c = checks_under(&spans, t[0]);
    assert_eq!(c.len(), 1, "{spans:#?}");
    assert_check(c[0], "fs.read", "/workspace/secret.txt", "allow");
    assert_eq!(c[0].attr("sandbox.rule_id"), "filesystem.workspace");
}

/// 2. A read outside the workspace is denied: by the profile for the file tool, by the
///    kernel for the code.
#[test]
fn read_outside_the_workspace_denied() {
    let Some(_lock) = setup() else { return };
    let (env, _ws, out) = scenario("strict", "read_outside");
    let d = printed_json(&out, "DENIAL");
    assert_eq!(d["rule_id"], "filesystem.default", "{d}");
    let spans = env.spans_until(|s| {
        tool_spans(s, "read_file").len() == 1
            && tool_spans(s, "run_python").len() == 1
            && s.iter().any(|x| x.name == "sandbox.exec")
            && s.iter().any(|x| x.name == "policy.check")
    });
    let t = tool_spans(&spans, "read_file");
    let c = checks_under(&spans, t[0]);
    assert_eq!(c.len(), 1, "{spans:#?}");
    assert_check(c[0], "fs.read", "/etc/passwd", "deny");
    assert_eq!(c[0].attr("sandbox.blocked"), "true");
    let r = tool_spans(&spans, "run_python");
    let execs = children(&spans, r[0], "sandbox.exec");
    assert_eq!(execs.len(), 1, "{spans:#?}");
    assert_eq!(execs[0].attr("process.exit.code"), "1");
    assert_audited(&env, "fs.read", "/etc/passwd", "deny");
}

/// 3. A write outside the write area is denied; nothing reaches the host.
#[test]
fn write_outside_denied() {
    let Some(_lock) = setup() else { return };
    let (env, ws, _) = scenario("strict", "write_outside");
    assert!(!Path::new("/usr/local/agentrun-mcp-evil").exists());
    assert!(!ws.path().join("evil.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.path().join("out/result.txt")).unwrap(),
        "fine\n"
    );
    let spans = wait_spans(&env, "write_file", 3, 3);
    let w = tool_spans(&spans, "write_file");
    assert_eq!(w.len(), 3, "{spans:#?}");
    let mut decisions: Vec<(String, String)> = w
        .iter()
        .flat_map(|t| checks_under(&spans, t))
        .map(|c| {
            (
                c.attr("sandbox.resource").to_string(),
                c.attr("sandbox.decision").to_string(),
            )
        })
        .collect();
    decisions.sort();
    assert_eq!(
        decisions,
        [
            ("/usr/local/agentrun-mcp-evil".into(), "deny".into()),
            ("/workspace/evil.txt".into(), "deny".into()),
            ("/workspace/out/result.txt".into(), "allow".into()),
        ],
        "{spans:#?}"
    );
    assert_audited(&env, "fs.write", "/usr/local/agentrun-mcp-evil", "deny");
}

/// 4. The network is blocked: the egress proxy refuses a host not in the allowlist.
#[test]
fn network_blocked() {
    let Some(_lock) = setup() else { return };
    let (env, _ws, out) = scenario("code-interpreter", "network");
    let d = printed_json(&out, "DENIAL");
    assert_eq!(d["rule_id"], "network.default", "{d}");
    assert!(d["reason"].as_str().unwrap().contains("allowlist"), "{d}");
    let spans = wait_spans(&env, "run_python", 1, 1);
    let r = tool_spans(&spans, "run_python");
    assert_tool_span(r[0], "run_python");
    assert_eq!(
        children(&spans, r[0], "sandbox.exec").len(),
        1,
        "{spans:#?}"
    );
    let c = checks_under(&spans, r[0]);
    assert!(
        c.iter().any(|c| c.attr("sandbox.action") == "net.connect"
            && c.attr("sandbox.resource") == "example.com:80"
            && c.attr("sandbox.decision") == "deny"),
        "{spans:#?}"
    );
    assert_audited(&env, "net.connect", "example.com:80", "deny");
}

/// 5. A prompt injection in the arguments: commands smuggled into `code` run, and the kernel
///    refuses what they try (reading /etc/passwd, writing /usr/local, copying out).
#[test]
fn prompt_injection_in_code_denied_by_the_kernel() {
    let Some(_lock) = setup() else { return };
    let (env, ws, out) = scenario("strict", "injection");
    let d = printed_json(&out, "DENIAL");
    assert_eq!(d["action"], "fs.read", "{d}");
    assert!(!Path::new("/usr/local/agentrun-pwned").exists());
    let copied = std::fs::read_to_string(ws.path().join("out/p")).unwrap_or_default();
    assert!(!copied.contains("root:"), "{copied}");
    let spans = env.spans_until(|s| {
        tool_spans(s, "run_python").len() == 1 && s.iter().any(|x| x.name == "sandbox.exec")
    });
    let r = tool_spans(&spans, "run_python");
    assert_tool_span(r[0], "run_python");
    assert!(
        r[0].attr("tool.parameters").contains("IGNORE ALL PREVIOUS"),
        "the arguments are on the span: {:#?}",
        r[0]
    );
    let execs = children(&spans, r[0], "sandbox.exec");
    assert_eq!(execs.len(), 1, "{spans:#?}");
    assert_eq!(execs[0].attr("sandbox.id"), r[0].attr("sandbox.id"));
}

/// 6. `../` traversal is resolved before the decision, and a planted symlink leads nowhere.
#[test]
fn dotdot_traversal_denied() {
    let Some(_lock) = setup() else { return };
    let (env, _ws, _) = scenario("strict", "traversal");
    let spans = wait_spans(&env, "read_file", 4, 5);
    let reads = tool_spans(&spans, "read_file");
    let denied: Vec<&ReceivedSpan> = reads
        .iter()
        .flat_map(|t| checks_under(&spans, t))
        .filter(|c| c.attr("sandbox.decision") == "deny")
        .collect();
    assert!(denied.len() >= 3, "{spans:#?}");
    for c in &denied[..3] {
        assert_check(c, "fs.read", "/etc/passwd", "deny");
    }
    assert_audited(&env, "fs.write", "/usr/local/x", "deny");
}

/// 7. Listing outside the workspace is denied.
#[test]
fn listing_outside_the_workspace_denied() {
    let Some(_lock) = setup() else { return };
    let (env, _ws, _) = scenario("strict", "listing");
    let spans = wait_spans(&env, "list_files", 4, 4);
    let l = tool_spans(&spans, "list_files");
    assert_eq!(l.len(), 4, "{spans:#?}");
    let mut decisions: Vec<(String, String)> = l
        .iter()
        .flat_map(|t| checks_under(&spans, t))
        .map(|c| {
            (
                c.attr("sandbox.resource").to_string(),
                c.attr("sandbox.decision").to_string(),
            )
        })
        .collect();
    decisions.sort();
    decisions.dedup();
    assert_eq!(
        decisions,
        [
            ("/etc".into(), "deny".into()),
            ("/root".into(), "deny".into()),
            ("/workspace".into(), "allow".into()),
        ],
        "{spans:#?}"
    );
}

/// 8. Read then exfiltrate: the read is allowed, the upload is denied, in one session.
#[test]
fn read_then_exfiltrate_is_allow_then_deny() {
    let Some(_lock) = setup() else { return };
    let (env, _ws, out) = scenario("code-interpreter", "exfiltration");
    let d = printed_json(&out, "DENIAL");
    assert_eq!(d["resource"], "attacker.example:80", "{d}");
    let spans = env.spans_until(|s| {
        tool_spans(s, "read_file").len() == 1
            && tool_spans(s, "run_python").len() == 1
            && s.iter().filter(|x| x.name == "policy.check").count() >= 2
    });
    let read = tool_spans(&spans, "read_file");
    let run = tool_spans(&spans, "run_python");
    assert_eq!(
        read[0].attr("sandbox.id"),
        run[0].attr("sandbox.id"),
        "one session, one sandbox"
    );
    let rc = checks_under(&spans, read[0]);
    assert_eq!(rc.len(), 1, "{spans:#?}");
    assert_check(rc[0], "fs.read", "/workspace/secret.txt", "allow");
    let nc = checks_under(&spans, run[0]);
    assert!(
        nc.iter().any(|c| c.attr("sandbox.action") == "net.connect"
            && c.attr("sandbox.resource") == "attacker.example:80"
            && c.attr("sandbox.decision") == "deny"),
        "{spans:#?}"
    );
    assert_eq!(children(&spans, run[0], "sandbox.exec").len(), 1);
    assert_audited(&env, "net.connect", "attacker.example:80", "deny");
}
