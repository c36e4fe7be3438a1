//! `agentrun mcp`'s own lifecycle, driven over its stdio with plain JSON-RPC lines (the MCP
//! stdio transport; the real clients are in mcp_clients.rs): a session's sandbox torn down
//! after the idle timeout and replaced (the next result says so), `--one-shot` giving each
//! call a sandbox of its own, the server ending when its input closes with nothing left
//! behind, and bad options refused in one line before anything starts.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agentrun_e2e::*;
use serde_json::{json, Value};

/// A call's deadline (debug build, 2 shared cores, the first call makes a sandbox).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// `agentrun mcp` with a JSON-RPC line client on its stdio.
struct McpProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    next_id: u64,
}

impl McpProcess {
    fn start(state: &std::path::Path, args: &[&str]) -> McpProcess {
        let mut child = Command::new(agentrun_bin())
            .arg("mcp")
            .args(args)
            .env("AGENTRUN_STATE_DIR", state)
            .env("AGENTRUN_AUDIT_DIR", state.join("audit"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn agentrun mcp");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        let mut p = McpProcess {
            child,
            stdin,
            lines,
            next_id: 1,
        };
        let init = p.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "e2e", "version": "1"}}),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "agentrun", "{init}");
        p.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        p
    }

    fn send(&mut self, msg: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{msg}").expect("write to agentrun mcp");
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no answer to {method} within {CALL_TIMEOUT:?}"));
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not JSON on the protocol stream ({e}): {line}"));
            if v["id"] == json!(id) {
                return v;
            }
        }
    }

    /// A tool call's structured result (the text content is the same object).
    fn call(&mut self, tool: &str, args: Value) -> Value {
        let r = self.request("tools/call", json!({"name": tool, "arguments": args}));
        let result = &r["result"];
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        let structured = result["structuredContent"].clone();
        assert_eq!(
            serde_json::from_str::<Value>(text).ok(),
            Some(structured.clone()),
            "the text content is the structured result: {r}"
        );
        structured
    }

    /// Closes its input; returns its exit code once it ended.
    fn close(mut self, within: Duration) -> i32 {
        drop(self.stdin.take());
        let deadline = Instant::now() + within;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code().unwrap_or(-1);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("agentrun mcp did not end within {within:?} of its input closing");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn idle_sandbox_is_torn_down_and_replaced_and_nothing_is_left() {
    let Some(_lock) = setup_exclusive() else {
        return;
    };
    let dir = tempdir();
    let state = dir.path().join("state");
    let slot = state.join("mcp/0");
    let before = Leftovers::snapshot_own(&slot);
    let mut mcp = McpProcess::start(&state, &["--pool-size", "1", "--idle-timeout", "2s"]);
    let first = mcp.call("run_python", json!({"code": "x = 41\nx + 1"}));
    assert_eq!(first["stdout"], "42\n", "{first}");
    let again = mcp.call("run_python", json!({"code": "print(x)"}));
    assert_eq!(
        again["stdout"], "41\n",
        "variables persist in a session: {again}"
    );
    assert_eq!(again["sandbox_id"], first["sandbox_id"]);
    assert!(again.get("notes").is_none(), "{again}");
    // Idle past the timeout (2 s; the server's clock started before this one): the sandbox
    // goes; the next call gets a new one and is told, even when it comes before the reaper's
    // next tick.
    std::thread::sleep(Duration::from_millis(2100));
    let after = mcp.call("run_python", json!({"code": "print(x)"}));
    assert_ne!(after["sandbox_id"], first["sandbox_id"], "{after}");
    assert_eq!(after["exit_code"], 1, "{after}");
    assert!(
        after["stderr"].as_str().unwrap().contains("NameError"),
        "{after}"
    );
    let notes = after["notes"].to_string();
    assert!(notes.contains("idle"), "the result says why: {after}");
    // The client goes: the server ends, and every sandbox with it.
    assert_eq!(mcp.close(Duration::from_secs(30)), 0);
    assert_no_new_leftovers_in(&slot, &before);
}

/// Nothing of `slot`'s (processes, mounts, cgroups, sandbox state dirs) is left since
/// `before` (the server already ended: no grace beyond a few seconds of async teardown).
fn assert_no_new_leftovers_in(slot: &std::path::Path, before: &Leftovers) {
    let found = wait_until(Duration::from_secs(10), || {
        let new = Leftovers::snapshot_own(slot).new_since(before);
        new.is_empty().then_some(())
    });
    if found.is_none() {
        let new = Leftovers::snapshot_own(slot).new_since(before);
        force_cleanup_in(slot, before);
        panic!("agentrun mcp left behind:\n{new}");
    }
}

#[test]
fn one_shot_gives_every_call_a_fresh_sandbox() {
    let Some(_lock) = setup_exclusive() else {
        return;
    };
    let dir = tempdir();
    let state = dir.path().join("state");
    let slot = state.join("mcp/0");
    let before = Leftovers::snapshot_own(&slot);
    let mut mcp = McpProcess::start(&state, &["--pool-size", "1", "--one-shot"]);
    let w = mcp.call(
        "write_file",
        json!({"path": "/tmp/note.txt", "content": "hello"}),
    );
    assert_eq!(w["bytes"], 5, "{w}");
    let r = mcp.request(
        "tools/call",
        json!({"name": "read_file", "arguments": {"path": "/tmp/note.txt"}}),
    );
    assert_eq!(
        r["result"]["isError"], true,
        "a fresh sandbox has no such file: {r}"
    );
    assert_eq!(
        r["result"]["structuredContent"]["error"], "not_found",
        "{r}"
    );
    let a = mcp.call("run_shell", json!({"command": "echo $$"}));
    let b = mcp.call("run_shell", json!({"command": "echo $$; exit 3"}));
    assert_ne!(a["sandbox_id"], b["sandbox_id"]);
    assert_eq!(mcp.close(Duration::from_secs(30)), 0);
    // Each run is an audit record, as a CLI run is: its sandbox, command and exit code.
    let audit = agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", state.join("audit"))
        .run();
    let runs: Vec<Value> = audit
        .success()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["kind"] == "run")
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0]["sandbox_id"], a["sandbox_id"]);
    assert_eq!(runs[0]["decision"], "ok");
    assert_eq!(runs[1]["exit"], 3);
    assert_eq!(runs[1]["decision"], "error");
    assert!(
        runs[1]["resource"]
            .as_str()
            .unwrap()
            .ends_with("echo $$; exit 3"),
        "{runs:?}"
    );
    assert_no_new_leftovers_in(&slot, &before);
}

#[test]
fn bad_arguments_are_tool_errors_and_unknown_tools_protocol_errors() {
    let Some(_lock) = setup() else {
        return;
    };
    let dir = tempdir();
    let state = dir.path().join("state");
    let mut mcp = McpProcess::start(&state, &["--pool-size", "1"]);
    let tools = mcp.request("tools/list", json!({}));
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "run_python",
            "run_shell",
            "write_file",
            "read_file",
            "list_files"
        ]
    );
    for (tool, args, why) in [
        ("run_python", json!({}), "code is required"),
        (
            "run_shell",
            json!({"command": "true", "timeout": 0}),
            "timeout must be",
        ),
        (
            "read_file",
            json!({"path": "x", "offset": 0}),
            "offset must be",
        ),
        (
            "write_file",
            json!({"path": "x", "content": "y", "mode": 7}),
            "unknown argument",
        ),
    ] {
        let r = mcp.request("tools/call", json!({"name": tool, "arguments": args}));
        assert_eq!(r["result"]["isError"], true, "{tool}: {r}");
        let msg = r["result"]["structuredContent"]["message"]
            .as_str()
            .unwrap();
        assert!(msg.contains(why), "{tool}: {msg}");
    }
    let r = mcp.request("tools/call", json!({"name": "rm_rf", "arguments": {}}));
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown tool"),
        "{r}"
    );
    // A run past its time limit is stopped and says so.
    let t = mcp.call("run_shell", json!({"command": "sleep 30", "timeout": 1}));
    assert_eq!(t["timed_out"], true, "{t}");
    assert_eq!(t["exit_code"], 137, "{t}");
    let t = mcp.call(
        "run_python",
        json!({"code": "import time\ntime.sleep(30)", "timeout": 1}),
    );
    assert_eq!(t["timed_out"], true, "{t}");
    assert!(
        t["stderr"].as_str().unwrap().contains("KeyboardInterrupt"),
        "{t}"
    );
    // The interpreter survived the interrupt.
    let ok = mcp.call("run_python", json!({"code": "print('still here')"}));
    assert_eq!(ok["stdout"], "still here\n", "{ok}");
    assert_eq!(mcp.close(Duration::from_secs(30)), 0);
}

#[test]
fn bad_options_are_refused_in_one_line() {
    let Some(_lock) = setup() else {
        return;
    };
    let dir = tempdir();
    let state = dir.path().join("state");
    for (args, why) in [
        (vec!["--workspace", "/nonexistent/ws"], "--workspace"),
        (vec!["--profile", "no-such-profile"], "no-such-profile"),
        (vec!["--allow-host", "bad host"], "--allow-host"),
        (vec!["--idle-timeout", "0s"], "--idle-timeout"),
        (vec!["--image", "no-such-image:1"], "--image"),
    ] {
        let out = agentrun(std::iter::once("mcp").chain(args.iter().copied()))
            .env("AGENTRUN_STATE_DIR", &state)
            .timeout(Duration::from_secs(30))
            .run();
        out.assert_agentrun_error();
        let err = out.stderr();
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(
            out.stdout().is_empty(),
            "nothing on the protocol stream: {args:?}"
        );
    }
}
