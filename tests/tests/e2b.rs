//! The E2B API of `agentrun serve --e2b`, driven by the official Python SDKs (`e2b==2.63.0`,
//! `e2b-code-interpreter==2.11.5`, installed by `hack/test` in `.venv/e2b`) unchanged: only
//! `E2B_API_URL` and `E2B_SANDBOX_URL` point at agentrun.
//!
//! Each test starts its own daemon (private state dir, loopback port), runs one scenario of
//! `tests/e2b/sdk_e2b.py` (which asserts what an SDK user sees and exits non-zero on the
//! first failed check), stops the daemon with SIGTERM and checks that nothing is left on the
//! host.
//!
//! Scenarios: the sync flow (create with metadata and envs, `commands.run` with exit codes,
//! streamed output, env, cwd, user, background + list + kill, connect, stdin; files
//! write/read/list/ make_dir/rename/remove; list by metadata; kill), the async flow (commands,
//! files, `run_code`, list), pause and `connect` (resume), `set_timeout` expiry, `run_code`
//! (state across calls, stderr, an exception's name/value/traceback, contexts, another language
//! refused), the API key / envd token checks with bad input to the routes, `files.watch_dir`
//! (sync polled watchers, recursive, the async stream), `Sandbox.list` pages and the file
//! API's escape attempts; gzip uploads in the sync flow; snapshots (create, list, restore,
//! delete, another API key's refused), fork, `pause(mode="filesystem")`, `get_metrics` and
//! terminals (`pty.create`, input, resize, ^C, connect, kill, `stream_input`).

use std::path::PathBuf;
use std::process::Command;

use std::time::Duration;

use agentrun_e2e::osb::{free_port, printed, stop_clean, SCENARIO_TIMEOUT};
use agentrun_e2e::otlp::{OtlpReceiver, ReceivedSpan};
use agentrun_e2e::snapshots::{snapshot_ids, SnapshotSweep};
use agentrun_e2e::*;

/// The venv's python; `hack/test` makes it. Missing is a failure, never a skip.
fn python() -> PathBuf {
    let p = workspace_root().join(".venv/e2b/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run hack/test (it creates .venv/e2b with e2b==2.63.0)",
        p.display()
    );
    p
}

/// A daemon serving the E2B API on a fresh loopback port: (it, its address).
fn start() -> (Daemon, String) {
    let mut d = Daemon::unstarted();
    let addr = format!("127.0.0.1:{}", free_port());
    d.launch(["--pool-size", "2", "--e2b", addr.as_str()]);
    (d, addr)
}

/// Runs one scenario; panics with its output and the daemon's log.
fn scenario(d: &Daemon, addr: &str, name: &str) {
    scenario_with(d, addr, name, &d.api_key(), &[]);
}

/// Runs one scenario with this API key and environment; its stdout. Panics with its output
/// and the daemon's log.
fn scenario_with(d: &Daemon, addr: &str, name: &str, key: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(python());
    cmd.arg(workspace_root().join("tests/e2b/sdk_e2b.py"))
        .arg(name)
        .env("E2B_ADDR", addr)
        .env("E2B_API_KEY", key)
        .env_remove("E2B_API_URL")
        .env_remove("E2B_SANDBOX_URL")
        .env_remove("E2B_ACCESS_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_with_timeout(cmd, None, SCENARIO_TIMEOUT);
    assert!(
        out.status.code() == Some(0) && out.stdout().contains(&format!("OK {name}")),
        "scenario {name} failed\n{out}\n{}",
        d.log()
    );
    out.stdout()
}

fn run_scenario(name: &str) {
    let Some(_lock) = setup() else { return };
    let (d, addr) = start();
    scenario(&d, &addr, name);
    stop_clean(d);
}

/// A scenario that makes snapshots in the host's image store: under the exclusive lock, the
/// snapshots it leaves (a failure's) removed after it.
fn run_snapshot_scenario(name: &str) {
    let Some(lock) = setup_exclusive() else {
        return;
    };
    let _sweep = SnapshotSweep::new(&lock);
    let (d, addr) = start();
    scenario(&d, &addr, name);
    stop_clean(d);
}

#[test]
fn sdk_sync_flow() {
    run_scenario("sync_flow");
}

#[test]
fn sdk_async_flow() {
    run_scenario("async_flow");
}

#[test]
fn pause_and_connect_resume_the_sandbox() {
    run_scenario("pause_connect");
}

#[test]
fn set_timeout_expiry_kills_the_sandbox() {
    run_scenario("timeout");
}

#[test]
fn run_code_keeps_state_and_reports_errors() {
    run_scenario("code");
}

#[test]
fn api_key_and_access_token_are_enforced() {
    run_scenario("auth");
}

/// The file API never leaves the sandbox (`..`, symlinks to the host's paths, moves,
/// removes, listings, host pseudo files, FIFOs and devices): the same attempts as the
/// OpenSandbox front end's `file_api_paths_never_leave_the_sandbox`, through the E2B SDK, with
/// the sandboxes of every shipped profile (`--opensandbox-profile`).
#[test]
fn file_api_paths_never_leave_the_sandbox() {
    let Some(_lock) = setup() else { return };
    for profile in [
        "default",
        "strict",
        "code-interpreter",
        "container",
        "build",
    ] {
        let dir = tempdir();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, format!("host secret {}", std::process::id())).unwrap();
        let probe = dir.path().join("probe");
        let mut d = Daemon::unstarted();
        let addr = format!("127.0.0.1:{}", free_port());
        d.launch([
            "--pool-size",
            "1",
            "--opensandbox-profile",
            profile,
            "--e2b",
            addr.as_str(),
        ]);
        let mut cmd = Command::new(python());
        cmd.arg(workspace_root().join("tests/e2b/sdk_e2b.py"))
            .arg("escape")
            .env("E2B_ADDR", &addr)
            .env("E2B_API_KEY", d.api_key())
            .env("E2B_HOST_SECRET", &secret)
            .env("E2B_HOST_PROBE", &probe)
            .env_remove("E2B_API_URL")
            .env_remove("E2B_SANDBOX_URL")
            .env_remove("E2B_ACCESS_TOKEN");
        let out = run_with_timeout(cmd, None, SCENARIO_TIMEOUT);
        assert!(
            out.status.code() == Some(0) && out.stdout().contains("OK escape"),
            "scenario escape failed under profile {profile}\n{out}\n{}",
            d.log()
        );
        for p in [
            probe.clone(),
            probe.with_extension("rel"),
            probe.with_extension("d"),
        ] {
            assert!(
                !p.exists(),
                "the file API created {} on the host (profile {profile})",
                p.display()
            );
        }
        stop_clean(d);
    }
}

#[test]
fn files_watch_dir_reports_changes() {
    run_scenario("watch");
}

#[test]
fn list_filters_by_metadata_and_pages() {
    run_scenario("list_pages");
}

/// `create_snapshot`, `list_snapshots`, `Sandbox.create(snapshot_id)`, `fork`,
/// `delete_snapshot`: the files each sandbox sees (a snapshot's files in the sandboxes made
/// from it, not those written after it; forks apart from each other and from their
/// source; nothing in a sandbox not made from it) and bad input to the routes (4xx JSON).
#[test]
fn snapshots_fork_and_create_from_a_snapshot() {
    let Some(lock) = setup_exclusive() else {
        return;
    };
    let _sweep = SnapshotSweep::new(&lock);
    let (d, addr) = start();
    let out = scenario_with(&d, &addr, "snapshots", &d.api_key(), &[]);
    stop_clean(d);
    // What the SDK waited (debug build, not a benchmark).
    for l in out
        .lines()
        .filter(|l| l.ends_with("_MS") || l.contains("_MS="))
    {
        println!("{l}");
    }
}

/// Another API key's snapshot is not listed, restored or deleted (404); the key that made
/// it restores and deletes it.
#[test]
fn another_api_keys_snapshot_is_not_reached() {
    let Some(lock) = setup_exclusive() else {
        return;
    };
    let _sweep = SnapshotSweep::new(&lock);
    let launch = |key: &str| {
        let mut d = Daemon::unstarted();
        let addr = format!("127.0.0.1:{}", free_port());
        d.launch(["--pool-size", "1", "--api-key", key, "--e2b", addr.as_str()]);
        (d, addr)
    };
    let (k1, k2) = ("e2b-snapshot-owner-key-1", "e2b-snapshot-other-key-2");
    let (d, addr) = launch(k1);
    let out = scenario_with(&d, &addr, "snapshot_for_other_key", k1, &[]);
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("SNAPSHOT="))
        .unwrap_or_else(|| panic!("no SNAPSHOT= line in {out}"))
        .to_owned();
    stop_clean(d);
    let (d, addr) = launch(k2);
    scenario_with(
        &d,
        &addr,
        "other_key_snapshot",
        k2,
        &[("E2B_SNAPSHOT_ID", &id)],
    );
    stop_clean(d);
    let (d, addr) = launch(k1);
    scenario_with(
        &d,
        &addr,
        "owner_key_snapshot",
        k1,
        &[("E2B_SNAPSHOT_ID", &id)],
    );
    stop_clean(d);
}

/// `pause(mode="filesystem")`: the sandbox's files kept on disk, its processes gone;
/// `connect` makes it again with the same id; killed while paused, its snapshot goes too.
#[test]
fn pause_to_filesystem_and_connect() {
    let Some(lock) = setup_exclusive() else {
        return;
    };
    let _sweep = SnapshotSweep::new(&lock);
    let before = snapshot_ids(None);
    let (d, addr) = start();
    scenario(&d, &addr, "pause_filesystem");
    stop_clean(d);
    // The snapshots of the pauses went with the resume and the kill.
    assert_eq!(
        snapshot_ids(None),
        before,
        "a pause's snapshot was left in the store"
    );
}

/// `get_metrics` and `/sandboxes/metrics`: a busy sandbox's CPU and memory, not charged to
/// an idle one; bad input 4xx.
#[test]
fn get_metrics_reports_the_sandboxs_own_cpu_and_memory() {
    run_scenario("metrics");
}

/// `network` (`allow_out`, `deny_out`) and `allow_internet_access` onto the egress allowlist
/// proxy: a loopback server answers an allowed name, a denied name is refused (403) and never
/// reaches it, a sandbox without network reaches nothing; bad rules are 400 JSON.
#[test]
fn network_allow_and_deny_lists_are_enforced() {
    run_scenario("network");
}

/// `run_code(envs=...)` sets them for that execution only (its subprocesses too);
/// `restart_code_context` gives a fresh interpreter under the same id and cwd; another
/// sandbox's context is not found; bad `env_vars` 400 JSON.
#[test]
fn run_code_envs_and_context_restart() {
    run_scenario("code_env_restart");
}

/// lifecycle `on_timeout: "pause"` (memory and filesystem): paused at the timeout, not
/// killed; `auto_resume`: the next envd request resumes it, and it pauses again at its next
/// end; without it, envd refuses until `connect`.
#[test]
fn on_timeout_pause_and_auto_resume() {
    run_snapshot_scenario("auto_pause");
}

/// Every E2B process is a run in the audit log, as an OpenSandbox command is: `true` and
/// `exit 4` through the SDK's `commands.run` are `run` records with the sandbox, the command
/// line (the SDK runs `/bin/bash -l -c CMD`), the exit code and outcome, the sandbox's profile
/// (`--opensandbox-profile`) and a trace id; each with its `sandbox.exec` span in that trace
/// (exit code, pid, duration; the non-zero exit an error).
/// Terminals: `pty.create` (bash on a pty of the asked size, its output as `pty` data),
/// input, resize, connect, kill, `stream_input`; bad sizes and pids are Connect errors.
#[test]
fn pty_create_input_resize_connect_and_kill() {
    run_scenario("pty");
}

#[test]
fn processes_are_audited_as_runs() {
    let Some(_lock) = setup() else { return };
    let audit = tempdir();
    let rx = OtlpReceiver::grpc();
    let mut d = Daemon::unstarted();
    d.set_env("AGENTRUN_AUDIT_DIR", audit.path());
    for (k, v) in rx.otel_env() {
        d.set_env(k, v);
    }
    let addr = format!("127.0.0.1:{}", free_port());
    d.launch([
        "--pool-size",
        "1",
        "--opensandbox-profile",
        "strict",
        "--e2b",
        addr.as_str(),
    ]);
    let out = scenario_with(&d, &addr, "audited_runs", &d.api_key(), &[]);
    let sandbox = printed(&out, "SANDBOX").to_string();
    // A process's record is in the log before its client sees its end.
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
    let execs = wait_until(Duration::from_secs(20), || {
        let execs: Vec<ReceivedSpan> = rx
            .spans()
            .into_iter()
            .filter(|s| {
                s.name == "sandbox.exec"
                    && s.attributes.get("sandbox.id").map(String::as_str) == Some(sandbox.as_str())
            })
            .collect();
        (execs.len() >= 2).then_some(execs)
    })
    .unwrap_or_else(|| panic!("no sandbox.exec spans of {sandbox}: {:#?}", rx.spans()));
    let mut seen: Vec<(String, i64, String)> = runs
        .iter()
        .map(|r| {
            let exit = r["exit"].as_i64().unwrap();
            let span = execs
                .iter()
                .find(|s| s.trace_id == r["trace_id"].as_str().unwrap_or_default())
                .unwrap_or_else(|| panic!("no sandbox.exec span in the trace of {r}: {execs:#?}"));
            assert_eq!(
                span.typed_attr("process.exit.code", "int"),
                exit.to_string()
            );
            span.typed_attr("process.pid", "int");
            span.typed_attr("sandbox.duration_ms", "int");
            assert_eq!(
                span.status_code == ReceivedSpan::STATUS_ERROR,
                exit != 0,
                "{span:#?}"
            );
            assert_eq!(r["sandbox_id"], sandbox.as_str(), "{r}");
            assert_eq!(r["action"], "exec", "{r}");
            assert_eq!(r["profile"], "strict", "{r}");
            let trace = r["trace_id"].as_str().unwrap_or_default();
            assert!(
                trace.len() == 32
                    && trace.bytes().all(|b| b.is_ascii_hexdigit())
                    && trace.bytes().any(|b| b != b'0'),
                "trace id {r}"
            );
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
            ("/bin/bash -l -c exit 4".to_string(), 4, "error".to_string()),
            ("/bin/bash -l -c true".to_string(), 0, "ok".to_string()),
        ]
    );
    stop_clean(d);
}
