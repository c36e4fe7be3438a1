//! Agent frameworks' E2B integrations, as published on PyPI, against `agentrun serve --e2b`,
//! unchanged: the user points them at agentrun with `E2B_API_KEY`, `E2B_API_URL` and
//! `E2B_SANDBOX_URL` and calls the framework's own tool or sandbox class (no LLM: the calls an
//! agent makes). Each framework pins its own e2b SDK, so each has its own venv (`hack/test`):
//! - CrewAI: `crewai-tools[e2b]==1.15.30` (e2b 2.20.3) in `.venv/e2b-crewai`: `E2BExecTool`,
//!   `E2BFileTool` (persistent), `E2BPythonTool`;
//! - LangChain: `langchain-e2b==0.0.6` (e2b 2.63.0) in `.venv/e2b-langchain`: Deep Agents'
//!   `E2BSandbox` / `AsyncE2BSandbox` backends, with their default working directory
//!   `/home/user`;
//! - OpenAI Agents: `openai-agents[e2b]==0.24.0` (e2b 2.31.0, which checks the API key's
//!   form: `e2b_` and hex digits) in `.venv/e2b-agents`: `E2BSandboxClient` sessions of both
//!   sandbox types, with the key as `e2b_` + the daemon's key.
//!
//! Each test starts its own daemon, runs one scenario of `tests/e2b/frameworks.py` (which
//! asserts what the framework's user sees: the command's output, a file written then read
//! back, a Python result, and that every sandbox it made is gone), stops the daemon and checks
//! that nothing is left on the host.

use std::path::PathBuf;
use std::process::Command;

use agentrun_e2e::osb::{free_port, stop_clean, SCENARIO_TIMEOUT};
use agentrun_e2e::*;

/// A framework venv's python; `hack/test` makes it. Missing is a failure, never a skip.
fn python(venv: &str) -> PathBuf {
    let p = workspace_root().join(".venv").join(venv).join("bin/python");
    assert!(
        p.exists(),
        "{} is missing: run hack/test (it creates .venv/{venv})",
        p.display()
    );
    p
}

/// Runs `scenario` of tests/e2b/frameworks.py from `venv` against a fresh daemon whose E2B
/// sandboxes have `profile`, the API key given to the framework made by `key` from the
/// daemon's.
fn run(venv: &str, scenario: &str, profile: &str, key: impl Fn(&str) -> String) {
    let Some(_lock) = setup() else { return };
    let mut d = Daemon::unstarted();
    let addr = format!("127.0.0.1:{}", free_port());
    d.launch([
        "--pool-size",
        "2",
        "--opensandbox-profile",
        profile,
        "--e2b",
        addr.as_str(),
    ]);
    let home = tempdir();
    let mut cmd = Command::new(python(venv));
    cmd.arg(workspace_root().join("tests/e2b/frameworks.py"))
        .arg(scenario)
        .env("E2B_ADDR", &addr)
        .env("E2B_API_KEY", key(&d.api_key()))
        // The frameworks' caches and config (CrewAI's storage, ...) in a temporary home.
        .env("HOME", home.path())
        .env_remove("E2B_API_URL")
        .env_remove("E2B_SANDBOX_URL")
        .env_remove("E2B_ACCESS_TOKEN")
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG");
    let out = run_with_timeout(cmd, None, SCENARIO_TIMEOUT);
    assert!(
        out.status.code() == Some(0) && out.stdout().contains(&format!("OK {scenario}")),
        "scenario {scenario} failed\n{out}\n{}",
        d.log()
    );
    stop_clean(d);
}

/// CrewAI's E2B tools: a command's output (and env, cwd) from `E2BExecTool`, a file written,
/// appended, read back, listed and removed by a persistent `E2BFileTool`, Python's output,
/// last value and exception from `E2BPythonTool`; every sandbox killed by the tools.
#[test]
fn crewai_e2b_tools_run_unchanged() {
    run("e2b-crewai", "crewai", "default", str::to_owned);
}

/// LangChain's `langchain-e2b` backends (Deep Agents): `execute` in `/home/user`, files
/// uploaded and downloaded, `read`, `edit`, `write`, `ls`, `grep`, `glob`, the async backend.
/// Its commands write in `/home/user` (`edit`, ...), as in an E2B sandbox, where the whole file
/// system is writable: the `container` profile (under `default` commands write only
/// `/workspace` and the temporary directories).
#[test]
fn langchain_e2b_backend_runs_unchanged() {
    run("e2b-langchain", "langchain", "container", str::to_owned);
}

/// The OpenAI Agents SDK's `E2BSandboxClient`: sessions of both sandbox types (`e2b`,
/// `e2b_code_interpreter`) with their defaults (auto-pause on timeout, auto-resume), the
/// workspace made and used as the commands' cwd, exit codes, a file written then read back
/// and listed, the sandbox killed when the session ends. Its e2b 2.31.0 checks the key's form
/// on the client, so the key is given as `e2b_` + the daemon's key.
#[test]
fn openai_agents_e2b_sandbox_runs_unchanged() {
    run("e2b-agents", "openai_agents", "default", |k| {
        format!("e2b_{k}")
    });
}
