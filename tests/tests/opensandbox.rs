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
//! the `sandbox.create` / `sandbox.exec` spans under the caller's `traceparent`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::otlp::OtlpReceiver;
use agentrun_e2e::*;

/// Deadline of one scenario (debug build, 2 shared cores).
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(240);

/// The venv's python; `hack/test` makes it. Missing is a failure, never a skip.
fn python() -> PathBuf {
    let p = workspace_root().join(".venv/test/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run hack/test (it creates .venv/test and installs opensandbox==1.1.1)",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A daemon serving the OpenSandbox API on a fresh loopback port.
fn start(env: &[(&str, String)], extra: &[&str]) -> (Daemon, String) {
    let mut d = Daemon::unstarted();
    for (k, v) in env {
        d.set_env(k, v);
    }
    let domain = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--pool-size", "2", "--listen", domain.as_str()];
    args.extend_from_slice(extra);
    d.launch(args);
    (d, domain)
}

/// Runs one scenario against the daemon; panics with its output and the daemon's log.
fn scenario(d: &Daemon, domain: &str, name: &str, env: &[(&str, String)]) {
    let mut cmd = Command::new(python());
    cmd.arg(workspace_root().join("tests/opensandbox/sdk_e2e.py"))
        .arg(name)
        .env("OSB_DOMAIN", domain)
        .env("OPENSANDBOX_DISABLE_METRICS", "1")
        .env_remove("OPEN_SANDBOX_API_KEY")
        .env_remove("OPEN_SANDBOX_DOMAIN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_with_timeout(cmd, None, SCENARIO_TIMEOUT);
    assert!(
        out.status.code() == Some(0) && out.stdout().contains(&format!("OK {name}")),
        "scenario {name} failed\n{out}\n{}",
        d.log()
    );
}

/// SIGTERM, clean exit, nothing left behind.
fn stop_clean(mut d: Daemon) {
    let out = d.terminate(Duration::from_secs(60));
    assert_eq!(
        out.status.code(),
        Some(0),
        "agentrun serve after SIGTERM\n{out}"
    );
    let mut new = Leftovers::default();
    let clean = wait_until(Duration::from_secs(10), || {
        new = Leftovers::snapshot_own(d.state()).new_since(d.before());
        new.is_empty().then_some(())
    });
    assert!(clean.is_some(), "the daemon left behind:\n{new}");
}

fn run_scenario(name: &str) {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start(&[], &[]);
    scenario(&d, &domain, name, &[]);
    stop_clean(d);
}

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
