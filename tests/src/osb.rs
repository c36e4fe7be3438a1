//! The OpenSandbox API's e2e harness: a daemon serving it on a loopback port, and the
//! official SDK's scenarios (`tests/opensandbox/sdk_e2e.py SCENARIO`, or `AREA:SCENARIO` for
//! the scenarios of `tests/opensandbox/sdk_AREA.py`) run against it with the venv's python.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::*;

/// Deadline of one scenario (debug build, 2 shared cores).
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(240);

/// The venv's python; `hack/test` makes it. Missing is a failure, never a skip.
pub fn python() -> PathBuf {
    let p = workspace_root().join(".venv/test/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run hack/test (it creates .venv/test and installs opensandbox==1.1.1)",
        p.display()
    );
    p
}

/// A free loopback port (free when asked).
///
/// Never the same port twice in one test process: the listener is closed before the daemon
/// binds, so the kernel may hand the same port to the next call, and a daemon given it for
/// two front ends (`--e2b` and `--mcp`) failed to start ("Address already in use").
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A daemon serving the OpenSandbox API on a fresh loopback port.
pub fn start(env: &[(&str, String)], extra: &[&str]) -> (Daemon, String) {
    start_with_pool("2", env, extra)
}

/// [`start`] with a pool of `size` shells.
pub fn start_with_pool(size: &str, env: &[(&str, String)], extra: &[&str]) -> (Daemon, String) {
    let mut d = Daemon::unstarted();
    for (k, v) in env {
        d.set_env(k, v);
    }
    let domain = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--pool-size", size, "--listen", domain.as_str()];
    args.extend_from_slice(extra);
    d.launch(args);
    (d, domain)
}

/// Runs one scenario against the daemon; panics with its output and the daemon's log.
/// Returns its stdout. `OSB_API_KEY` is the daemon's generated key (its key file) unless
/// `env` sets it.
pub fn scenario(d: &Daemon, domain: &str, name: &str, env: &[(&str, String)]) -> String {
    let mut cmd = Command::new(python());
    cmd.arg(workspace_root().join("tests/opensandbox/sdk_e2e.py"))
        .arg(name)
        .env("OSB_DOMAIN", domain)
        // `agentrun ps --json` of this daemon: which shell serves which sandbox.
        .env("OSB_AGENTRUN", agentrun_bin())
        .env("AGENTRUN_STATE_DIR", d.state())
        .env("OPENSANDBOX_DISABLE_METRICS", "1")
        .env_remove("OPEN_SANDBOX_API_KEY")
        .env_remove("OPEN_SANDBOX_DOMAIN");
    if d.api_key_file().exists() {
        cmd.env("OSB_API_KEY", d.api_key());
    }
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

/// SIGTERM, clean exit, nothing left behind.
pub fn stop_clean(mut d: Daemon) {
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

/// After `d` was killed with SIGKILL: waits (30 s at most) until what it left on the host is
/// gone, then starts it again on a new loopback port (pool of 2); returns that address.
pub fn relaunch_after_kill9(d: &mut Daemon) -> String {
    let mut new = Leftovers::default();
    let clean = wait_until(Duration::from_secs(30), || {
        new = Leftovers::snapshot_own(d.state()).new_since(d.before());
        new.is_empty().then_some(())
    });
    assert!(clean.is_some(), "the killed daemon left behind:\n{new}");
    let domain = format!("127.0.0.1:{}", free_port());
    d.launch(["--pool-size", "2", "--listen", domain.as_str()]);
    domain
}

pub fn run_scenario(name: &str) {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start(&[], &[]);
    scenario(&d, &domain, name, &[]);
    stop_clean(d);
}

/// The value a scenario printed on a line `KEY value` (panics, with the output, if none).
pub fn printed<'a>(stdout: &'a str, key: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("the scenario printed no {key}:\n{stdout}"))
}

/// A daemon serving the OpenSandbox API whose spans go to `rx` and whose audit log is `audit`.
pub fn start_observed(rx: &crate::otlp::OtlpReceiver, audit: &std::path::Path) -> (Daemon, String) {
    let mut env: Vec<(&str, String)> = rx.otel_env();
    env.push(("AGENTRUN_AUDIT_DIR", audit.display().to_string()));
    start(&env, &[])
}
