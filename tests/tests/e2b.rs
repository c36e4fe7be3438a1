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
//! API's escape attempts; gzip uploads in the sync flow.

use std::path::PathBuf;
use std::process::Command;

use agentrun_e2e::osb::{free_port, stop_clean, SCENARIO_TIMEOUT};
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
    let mut cmd = Command::new(python());
    cmd.arg(workspace_root().join("tests/e2b/sdk_e2b.py"))
        .arg(name)
        .env("E2B_ADDR", addr)
        .env("E2B_API_KEY", d.api_key())
        .env_remove("E2B_API_URL")
        .env_remove("E2B_SANDBOX_URL")
        .env_remove("E2B_ACCESS_TOKEN");
    let out = run_with_timeout(cmd, None, SCENARIO_TIMEOUT);
    assert!(
        out.status.code() == Some(0) && out.stdout().contains(&format!("OK {name}")),
        "scenario {name} failed\n{out}\n{}",
        d.log()
    );
}

fn run_scenario(name: &str) {
    let Some(_lock) = setup() else { return };
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
