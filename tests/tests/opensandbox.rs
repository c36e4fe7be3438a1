//! The OpenSandbox API of `agentrun serve --listen`, driven by the official Python SDK
//! (`opensandbox==1.1.1`, plus `opensandbox-code-interpreter==1.1.1` for `/code`; both installed
//! by `hack/test` in `.venv/test`), sync and async clients.
//!
//! Each test starts its own daemon (private state dir, loopback port), runs one scenario of
//! `tests/opensandbox/sdk_e2e.py` (which asserts what an SDK user sees and exits non-zero on
//! the first failed check), stops the daemon with SIGTERM and checks that nothing is left on
//! the host: no sandbox process, mount, cgroup or state dir.
//!
//! Scenarios: the full sync flow (create, commands, resource limits, files, background + logs,
//! interrupt, timeout, session, renew, pause/resume, kill), the async flow, list filters and
//! pagination, 400s for what agentrun cannot serve, API-key and execd-token checks, TTL
//! expiry, path escapes through the file API, 20 sandboxes at once, Python code contexts, and
//! the `sandbox.create` / `sandbox.exec` spans under the caller's `traceparent`, the
//! `networkPolicy` enforced by the egress proxy and changed live through `/policy`, and a
//! sandbox with `networkPolicy` and `resourceLimits` served from the pool.

use std::time::Duration;

use agentrun_e2e::osb::*;
use agentrun_e2e::otlp::OtlpReceiver;
use agentrun_e2e::*;

#[test]
fn sdk_sync_full_flow() {
    run_scenario("sync_flow");
}

#[test]
fn sdk_async_flow() {
    run_scenario("async_flow");
}

#[test]
fn sdk_list_metadata_filters_and_pagination() {
    run_scenario("list_filters");
}

#[test]
fn unsupported_create_fields_get_400() {
    run_scenario("bad_requests");
}

#[test]
fn entrypoint_exit_stops_the_sandbox() {
    run_scenario("entrypoint_exit");
}

#[test]
fn command_logs_are_bounded() {
    run_scenario("log_cap");
}

#[test]
fn metrics_watch_streams_every_second() {
    run_scenario("metrics_watch");
}

#[test]
fn other_ports_are_proxied_into_the_sandbox() {
    run_scenario("port_proxy");
}

#[test]
fn commands_run_as_the_requested_uid_and_gid() {
    run_scenario("run_as_user");
}

#[test]
fn ttl_expiry_deletes_the_sandbox() {
    run_scenario("expiry");
}

#[test]
fn twenty_sandboxes_at_once() {
    run_scenario("many");
}

#[test]
fn api_key_and_execd_token_are_enforced() {
    let Some(_lock) = setup() else { return };
    let key = "k-e2e-secret";
    let (d, domain) = start(&[], &["--api-key", key]);
    scenario(&d, &domain, "auth", &[("OSB_API_KEY", key.to_string())]);
    stop_clean(d);
}

#[test]
fn file_api_paths_never_leave_the_sandbox() {
    let Some(_lock) = setup() else { return };
    let dir = tempdir();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, format!("host secret {}", std::process::id())).unwrap();
    let probe = dir.path().join("probe");
    let (d, domain) = start(&[], &[]);
    scenario(
        &d,
        &domain,
        "escape",
        &[
            ("OSB_HOST_SECRET", secret.display().to_string()),
            ("OSB_HOST_PROBE", probe.display().to_string()),
        ],
    );
    assert!(
        !probe.exists(),
        "the file API created {} on the host",
        probe.display()
    );
    stop_clean(d);
}

#[test]
fn create_and_exec_spans_follow_the_callers_traceparent() {
    let Some(_lock) = setup() else { return };
    let rx = OtlpReceiver::grpc();
    let env: Vec<(&str, String)> = rx.otel_env();
    let (d, domain) = start(&env, &[]);
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    scenario(
        &d,
        &domain,
        "traces",
        &[("OSB_TRACEPARENT", format!("00-{trace}-{parent}-01"))],
    );
    let spans = rx.wait_for_spans(3, Duration::from_secs(20));
    let named = |n: &str| spans.iter().filter(|s| s.name == n).collect::<Vec<_>>();
    let creates = named("sandbox.create");
    let execs = named("sandbox.exec");
    assert_eq!(creates.len(), 1, "one sandbox.create span: {spans:#?}");
    assert!(
        execs.len() >= 2,
        "a sandbox.exec span per command (entrypoint aside): {spans:#?}"
    );
    for s in creates.iter().chain(&execs) {
        assert_eq!(s.trace_id, trace, "{s:#?}");
        assert_eq!(s.parent_span_id, parent, "{s:#?}");
    }
    let id = creates[0].attr("sandbox.id").to_string();
    assert!(
        execs.iter().all(|s| s.attr("sandbox.id") == id),
        "{execs:#?}"
    );
    let codes: Vec<&str> = execs.iter().map(|s| s.attr("process.exit.code")).collect();
    assert!(
        codes.contains(&"0") && codes.contains(&"4"),
        "exit codes {codes:?}"
    );
    stop_clean(d);
}

#[test]
fn code_interpreter_runs_python_in_persistent_contexts() {
    run_scenario("code");
}

/// With `serve --opensandbox-profile` naming a profile with a Python zygote, a code context is
/// a fork of the sandbox's shell's zygote, and keeps its state there.
#[test]
fn code_contexts_are_forked_from_the_zygote_of_the_sandboxs_profile() {
    let Some(_lock) = setup() else { return };
    let dir = tempdir();
    let base = std::fs::read_to_string(workspace_root().join("bundles/default.toml")).unwrap();
    let profile = dir.path().join("zygote.toml");
    std::fs::write(
        &profile,
        format!("{base}\n[python]\nzygote = true\npreload = [\"json\"]\n"),
    )
    .unwrap();
    let profile = profile.to_string_lossy().into_owned();
    let pool = format!("host:{profile}=2");
    let (d, domain) = start(&[], &["--opensandbox-profile", &profile, "--pool", &pool]);
    scenario(&d, &domain, "code_zygote", &[]);
    stop_clean(d);
}

/// `networkPolicy` through the SDK: a loopback HTTP server (started by the scenario) stands
/// in for an allowed host and is reached through the proxy; a non-allowed host, a deny rule
/// before a wildcard allow, PATCH (incoming rules win) and DELETE on a running sandbox take
/// effect on the next request, and a tunnel open across a DELETE of its rule is cut; no
/// networkPolicy means no route. Every proxy decision is in
/// the audit log (`agentrun audit --deny` shows the denials with their rule) and is a
/// `policy.check` span under the sandbox's `sandbox.create`; every policy change is audited.
#[test]
fn network_policy_is_enforced_and_changed_live() {
    let Some(_lock) = setup() else { return };
    let audit = tempdir();
    let rx = OtlpReceiver::grpc();
    let (d, domain) = start_observed(&rx, audit.path());
    let out = scenario(&d, &domain, "egress", &[]);
    let up = printed(&out, "UPSTREAM").to_string();
    let a = printed(&out, "SANDBOX_A").to_string();
    let b = printed(&out, "SANDBOX_B").to_string();

    // The denials, as `agentrun audit --deny` prints them.
    let denied = d
        .agentrun(["audit", "--deny"])
        .env("AGENTRUN_AUDIT_DIR", audit.path())
        .run()
        .success();
    let lines: Vec<&str> = denied.lines().collect();
    let has = |sid: &str, what: &str| {
        lines
            .iter()
            .filter(|l| l.contains(&format!(" {sid} deny net.connect {what}")))
            .count()
    };
    assert_eq!(
        has(&a, "blocked.agentrun.test:80 rule=networkPolicy.egress[0] "),
        1,
        "{denied}"
    );
    // A name the wildcard allows that does not resolve: an error, not a denial.
    assert_eq!(has(&a, "ok.agentrun.test:80 "), 0, "{denied}");
    assert_eq!(
        has(&a, "other.example.org:80 rule=network.default "),
        1,
        "{denied}"
    );
    assert_eq!(
        has(&b, &format!("{up} rule=network.default ")),
        3,
        "{denied}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains(&b) && l.contains("open connection cut: the policy changed"))
            .count(),
        1,
        "the tunnel cut by DELETE: {denied}"
    );
    assert_eq!(
        has(&b, &format!("{up} rule=networkPolicy.egress[0] ")),
        1,
        "{denied}"
    );
    assert_eq!(lines.len(), 6, "only denials, and nothing else: {denied}");

    // Everything, as JSON: the allows and the policy changes too.
    let all: Vec<serde_json::Value> = d
        .agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", audit.path())
        .run()
        .success()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let unresolved: Vec<(&str, &str, &str)> = all
        .iter()
        .filter(|r| r["resource"] == "ok.agentrun.test:80")
        .map(|r| {
            assert_eq!(r["sandbox_id"], a.as_str(), "{r}");
            (
                r["kind"].as_str().unwrap(),
                r["decision"].as_str().unwrap(),
                r["rule"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        unresolved,
        [
            ("decision", "allow", "networkPolicy.egress[1]"),
            ("error", "error", "networkPolicy.egress[1]"),
        ],
        "{all:#?}"
    );
    let allows: Vec<(String, String)> = all
        .iter()
        .filter(|r| r["kind"] == "decision" && r["decision"] == "allow")
        .filter(|r| r["resource"] != "ok.agentrun.test:80")
        .map(|r| {
            assert_eq!(r["resource"], up.as_str(), "{r}");
            (
                r["sandbox_id"].as_str().unwrap().to_string(),
                r["rule"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want = |sid: &str, rule: &str| (sid.to_string(), rule.to_string());
    assert_eq!(
        allows,
        vec![
            want(&a, "networkPolicy.egress[2]"),
            want(&b, "networkPolicy.egress[0]"),
            want(&b, "networkPolicy.egress[0]"),
            want(&b, "networkPolicy.egress[0]"),
            want(&a, "networkPolicy.egress[2]"),
        ],
        "{all:#?}"
    );
    let changes: Vec<(&str, &str)> = all
        .iter()
        .filter(|r| r["kind"] == "policy")
        .map(|r| {
            assert_eq!(r["sandbox_id"], b.as_str(), "{r}");
            (
                r["action"].as_str().unwrap(),
                r["resource"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        vec![
            (
                "net.policy.patch",
                r#"[{"action":"allow","target":"127.0.0.1"}]"#
            ),
            (
                "net.policy.patch",
                r#"[{"action":"deny","target":"127.0.0.1"}]"#
            ),
            (
                "net.policy.patch",
                r#"[{"action":"allow","target":"127.0.0.1"}]"#
            ),
            ("net.policy.delete", r#"["127.0.0.1","not-there.example"]"#),
        ],
        "{all:#?}"
    );

    // One policy.check span per decision, under its sandbox's sandbox.create.
    let decisions = all.iter().filter(|r| r["kind"] == "decision").count();
    assert_eq!(decisions, 12, "{all:#?}");
    let spans = wait_until(Duration::from_secs(20), || {
        let spans = rx.spans();
        let n = spans.iter().filter(|s| s.name == "policy.check").count();
        (n >= decisions).then_some(spans)
    })
    .unwrap_or_else(|| panic!("policy.check spans missing: {:#?}", rx.spans()));
    let create_of = |sid: &str| {
        spans
            .iter()
            .find(|s| {
                s.name == "sandbox.create"
                    && s.attributes.get("sandbox.id").map(String::as_str) == Some(sid)
            })
            .unwrap_or_else(|| panic!("no sandbox.create span of {sid}"))
            .clone()
    };
    let (ca, cb) = (create_of(&a), create_of(&b));
    let checks: Vec<_> = spans.iter().filter(|s| s.name == "policy.check").collect();
    assert_eq!(checks.len(), decisions, "{checks:#?}");
    for c in &checks {
        let sid = c.typed_attr("sandbox.id", "string");
        let parent = if sid == a { &ca } else { &cb };
        assert!(sid == a || sid == b, "{c:#?}");
        assert_eq!(c.trace_id, parent.trace_id, "{c:#?}");
        assert_eq!(c.parent_span_id, parent.span_id, "{c:#?}");
        assert_eq!(c.attr("openinference.span.kind"), "GUARDRAIL");
        assert_eq!(
            c.typed_attr("sandbox.enforced_by", "string"),
            "egress-proxy"
        );
        assert_eq!(c.typed_attr("sandbox.action", "string"), "net.connect");
        let decision = c.typed_attr("sandbox.decision", "string");
        assert_eq!(
            c.typed_attr("sandbox.blocked", "bool"),
            if decision == "deny" { "true" } else { "false" }
        );
        assert!(!c.typed_attr("sandbox.reason", "string").is_empty());
        c.typed_attr("server.port", "int");
    }
    let blocked = checks
        .iter()
        .find(|c| c.attr("sandbox.resource") == "blocked.agentrun.test:80")
        .expect("span of the blocked host");
    assert_eq!(blocked.attr("sandbox.decision"), "deny");
    assert_eq!(blocked.attr("sandbox.rule_id"), "networkPolicy.egress[0]");
    assert_eq!(blocked.attr("server.address"), "blocked.agentrun.test");
    assert_eq!(blocked.attr("sandbox.id"), a);
    // The failed lookup is an error span under A's sandbox.create.
    let failed: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "egress.connect")
        .collect();
    assert_eq!(failed.len(), 1, "{spans:#?}");
    assert_eq!(failed[0].status_code, 2, "{:#?}", failed[0]);
    assert_eq!(failed[0].attr("error.type"), "resolve");
    assert_eq!(failed[0].attr("server.address"), "ok.agentrun.test");
    assert_eq!(failed[0].parent_span_id, ca.span_id);
    stop_clean(d);
}

/// Runs a memory-bound scenario (issue 15, item 4) against a daemon started with `extra`;
/// the scenario reads the daemon's RSS from `/proc/<pid>/status` (`OSB_DAEMON_PID`) and fails
/// when it grows past its bound or when another sandbox stops answering.
/// A sandbox with a `networkPolicy` and `resourceLimits` takes a ready shell of the pool kept
/// for its image and profile (`sandbox.pool_hit=true` on its `sandbox.create` span, a hit in
/// `agentrun pool status`), and still works (the scenario: the policy allows the upstream and
/// denies another host, the memory limit is enforced); its shell, where a command was
/// OOM-killed, is discarded (`oom`), never reused.
/// Two sandboxes one after the other with a pool of one shell: each has an id of its own, the
/// second runs in the first one's shell (given back to the pool when the first was killed: two
/// pool hits, no shell made on demand, none discarded), and sees nothing of the first (its
/// files in `/` and `/tmp`, its processes).
#[test]
fn consecutive_sandboxes_reuse_one_shell_and_see_nothing_of_each_other() {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start_with_pool("1", &[], &[]);
    let before = d.wait_pool_full(Duration::from_secs(60));
    let out = scenario(&d, &domain, "reuse", &[]);
    let shell = printed(&out, "SHELL").to_string();
    let ids = printed(&out, "IDS").to_string();
    let after = d.default_pool();
    assert_eq!(
        (after.hits - before.hits, after.misses - before.misses),
        (2, 0),
        "both sandboxes took a ready shell: {before:?} -> {after:?}\n{}",
        d.log()
    );
    for id in ids.split(' ') {
        assert_ne!(id, shell, "a sandbox's id is its shell's");
        assert_eq!(id.len(), shell.len(), "ids {ids}, shell {shell}");
        assert!(id.starts_with("ar-"), "ids {ids}");
    }
    // The second sandbox's teardown runs off the delete's path: its shell is back in the
    // pool once that is done.
    let back = wait_until(Duration::from_secs(15), || {
        d.ps()
            .iter()
            .any(|e| e.id == shell && e.state == "ready")
            .then_some(())
    });
    let ps = d.ps();
    assert!(
        back.is_some(),
        "shell {shell} is not back in the pool: {ps:#?}"
    );
    // (A ready shell beyond the target may be trimmed when idle: not a verdict.)
    let discarded = d.discarded();
    let verdicts: Vec<_> = discarded.keys().filter(|k| *k != "idle").collect();
    assert!(verdicts.is_empty(), "a shell was discarded: {discarded:?}");
    stop_clean(d);
}

#[test]
fn network_policy_and_resource_limits_take_a_pooled_shell() {
    let Some(_lock) = setup() else { return };
    let rx = OtlpReceiver::grpc();
    let env: Vec<(&str, String)> = rx.otel_env();
    let (d, domain) = start(&env, &[]);
    let before = d.wait_pool_full(Duration::from_secs(60));
    let out = scenario(&d, &domain, "pooled_shapes", &[]);
    let sid = printed(&out, "SANDBOX").to_string();
    let after = d.default_pool();
    assert_eq!(
        (after.hits - before.hits, after.misses - before.misses),
        (1, 0),
        "the sandbox took a ready shell: {before:?} -> {after:?}\n{}",
        d.log()
    );
    let spans = wait_until(Duration::from_secs(20), || {
        let spans = rx.spans();
        spans
            .iter()
            .any(|s| s.name == "sandbox.create" && s.attr("sandbox.id") == sid)
            .then_some(spans)
    })
    .unwrap_or_else(|| panic!("no sandbox.create span of {sid}: {:#?}", rx.spans()));
    let create = spans
        .iter()
        .find(|s| s.name == "sandbox.create" && s.attr("sandbox.id") == sid)
        .unwrap();
    assert_eq!(
        create.typed_attr("sandbox.pool_hit", "bool"),
        "true",
        "{create:#?}"
    );
    // A command in it was OOM-killed: its shell is discarded, not reused.
    let discarded = d.discarded();
    assert!(
        discarded.get("oom").copied().unwrap_or(0) >= 1,
        "its shell went with it: {discarded:?}"
    );
    stop_clean(d);
}

fn run_memory_scenario(name: &str, extra: &[&str], env: &[(&str, String)]) {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start(&[], extra);
    let mut env = env.to_vec();
    env.push(("OSB_DAEMON_PID", d.pid().to_string()));
    let out = scenario(&d, &domain, name, &env);
    eprintln!("{out}");
    stop_clean(d);
}

/// A session's `yes &`, a code context's thread printing forever and a foreground command
/// whose client stopped reading: bounded queues, the processes wait, the daemon's memory
/// stays put and another sandbox keeps answering; each works again afterwards.
#[test]
fn output_nobody_reads_keeps_the_daemons_memory_bounded() {
    run_memory_scenario("output_flood", &[], &[]);
}

/// `truncate -s 1T` in a sandbox, then download (whole, Range, lines) and replace: streamed
/// in bounded memory (the unfixed daemon aborted allocating 1 TiB).
#[test]
fn a_1tib_sparse_file_streams_through_downloads_and_replace() {
    run_memory_scenario("big_files", &[], &[]);
}

/// 20 GB bodies: 401 before reading any of them without the execd token or the API key, 413
/// at the JSON limit with them (the unfixed daemon read them whole, token check after).
#[test]
fn huge_bodies_are_refused_before_they_are_read() {
    let key = "k-e2e-bodies";
    run_memory_scenario(
        "body_limits",
        &["--api-key", key],
        &[("OSB_API_KEY", key.to_string())],
    );
}

/// `--max-upload 8M --max-request-body 64K` through the SDK: under the limits everything
/// works; over them 413, no partial file, the old file intact.
#[test]
fn uploads_and_json_bodies_over_their_limits_get_413() {
    run_memory_scenario(
        "upload_limit",
        &["--max-upload", "8M", "--max-request-body", "64K"],
        &[],
    );
}

/// `serve --listen` without a key given, beyond loopback too: served with the key of the
/// state dir's key file (the API refuses requests without it), no warning; with
/// `--insecure-no-auth` and a key: one line, exit 125; `--insecure-no-auth` alone: served
/// with a loud warning; with a key: served, no warning, the key required.
#[test]
fn listen_without_a_key_flag_uses_the_key_file() {
    let Some(_lock) = setup() else { return };
    for addr in [
        format!("0.0.0.0:{}", free_port()),
        format!("[::]:{}", free_port()),
    ] {
        let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
        let mut d = Daemon::unstarted().with_env("AGENTRUN_API_KEY", "");
        d.launch(["--pool-size", "1", "--listen", addr.as_str()]);
        let key = d.api_key();
        assert_eq!(key.len(), 48, "{key}");
        let listed = http_get_local(port, "/v1/sandboxes");
        assert!(listed.starts_with("HTTP/1.0 401"), "{listed}");
        assert!(
            d.log().contains(&d.api_key_file().display().to_string()) && !d.log().contains(&key),
            "the log names the key file, never the key:\n{}",
            d.log()
        );
        assert!(!d.log().contains("WARNING"), "{}", d.log());
        stop_clean(d);
    }

    let d = Daemon::unstarted();
    let out = d
        .agentrun([
            "serve",
            "--pool-size",
            "1",
            "--listen",
            "127.0.0.1:1",
            "--insecure-no-auth",
            "--api-key",
            "k-e2e-listen-contradiction",
        ])
        .timeout(Duration::from_secs(60))
        .run();
    out.assert_agentrun_error();
    assert!(out.stderr().contains("--insecure-no-auth"), "{out}");
    assert!(!d.socket().exists(), "a refused daemon left its socket");

    // --insecure-no-auth: served (from loopback too), with a loud warning.
    let port = free_port();
    let mut d = Daemon::unstarted();
    d.set_env("AGENTRUN_API_KEY", "");
    d.launch([
        "--pool-size",
        "1",
        "--listen",
        &format!("0.0.0.0:{port}"),
        "--insecure-no-auth",
    ]);
    let health = http_get_local(port, "/health");
    assert!(health.contains("healthy"), "{health}\n{}", d.log());
    assert!(
        d.log().contains("WARNING: --insecure-no-auth") && d.log().contains("NO API KEY"),
        "{}",
        d.log()
    );
    stop_clean(d);

    // With a key: served, no warning, and the key is required.
    let port = free_port();
    let mut d = Daemon::unstarted();
    d.launch([
        "--pool-size",
        "1",
        "--listen",
        &format!("0.0.0.0:{port}"),
        "--api-key",
        "k-e2e-listen",
    ]);
    let listed = http_get_local(port, "/v1/sandboxes");
    assert!(listed.starts_with("HTTP/1.0 401"), "{listed}");
    assert!(!d.log().contains("WARNING"), "{}", d.log());
    stop_clean(d);
}

/// `GET path` on 127.0.0.1:port, the whole answer (HTTP/1.0: the server closes).
fn http_get_local(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// 16 background `yes` commands in one sandbox (short lines and 1 KiB lines): their logs
/// together stay within the sandbox's log budget (before, each kept 8 MiB of lines, short
/// ones at ~50 bytes of overhead each).
#[test]
fn command_logs_of_a_sandbox_share_a_bounded_budget() {
    run_memory_scenario("log_flood", &[], &[]);
}

/// Every OpenSandbox command is a run in the audit log, as a CLI or MCP run is: a `run` record
/// with the sandbox, the command line, its exit code, its outcome and the profile of the
/// sandbox (`serve --opensandbox-profile`).
#[test]
fn commands_are_audited_as_runs() {
    let Some(_lock) = setup() else { return };
    let audit = tempdir();
    let (d, domain) = start(
        &[("AGENTRUN_AUDIT_DIR", audit.path().display().to_string())],
        &["--opensandbox-profile", "strict"],
    );
    let script = r#"
import os
from opensandbox import SandboxSync
from opensandbox.config import ConnectionConfigSync
cfg = ConnectionConfigSync(domain=os.environ["OSB_DOMAIN"], api_key=os.environ["OSB_API_KEY"], protocol="http")
sbx = SandboxSync.create("host", connection_config=cfg)
try:
    assert sbx.commands.run("true").exit_code == 0
    assert sbx.commands.run("exit 4").exit_code == 4
    print("SANDBOX", sbx.id)
finally:
    sbx.kill()
print("OK")
"#;
    let mut cmd = std::process::Command::new(python());
    cmd.arg("-c")
        .arg(script)
        .env("OSB_DOMAIN", &domain)
        .env("OSB_API_KEY", d.api_key())
        .env("OPENSANDBOX_DISABLE_METRICS", "1")
        .env_remove("OPEN_SANDBOX_API_KEY")
        .env_remove("OPEN_SANDBOX_DOMAIN");
    let out = run_with_timeout(cmd, None, Duration::from_secs(120));
    assert!(out.stdout().contains("OK"), "{out}\n{}", d.log());
    let sandbox = printed(&out.stdout(), "SANDBOX").to_string();
    // A command's record is in the log before its client sees its end; `kill` may still be
    // on its way.
    let runs = wait_until(Duration::from_secs(10), || {
        let all = d
            .agentrun(["audit", "--json"])
            .env("AGENTRUN_AUDIT_DIR", audit.path())
            .run()
            .success();
        let runs: Vec<serde_json::Value> = all
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|r| r["kind"] == "run")
            .collect();
        (runs.len() >= 2).then_some(runs)
    })
    .unwrap_or_else(|| panic!("no run records in the audit log\n{}", d.log()));
    let mut seen: Vec<(String, i64, String)> = runs
        .iter()
        .map(|r| {
            assert_eq!(r["sandbox_id"], sandbox.as_str(), "{r}");
            assert_eq!(r["action"], "exec", "{r}");
            assert_eq!(r["profile"], "strict", "{r}");
            assert_eq!(r["trace_id"].as_str().map(str::len), Some(32), "{r}");
            (
                r["resource"].as_str().unwrap().to_owned(),
                r["exit"].as_i64().unwrap(),
                r["decision"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("exit 4".to_string(), 4, "error".to_string()),
            ("true".to_string(), 0, "ok".to_string()),
        ]
    );
    stop_clean(d);
}
