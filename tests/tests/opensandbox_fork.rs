//! Fork, agentrun's extension of the OpenSandbox API (`POST /v1/sandboxes/{id}/fork`) and its
//! CLI (`agentrun fork`), driven around the official SDK (`tests/opensandbox/sdk_fork.py`):
//! a code context holding a 100 MB numpy array (kept in a file too), a dict, a module alias
//! and a function, the sandbox forked into 10 copies whose contexts each have them (a
//! semantic fork of the context) as they have the file, each a sandbox of its own and
//! independent of the others and of the parent; what a context cannot carry named (and the
//! rest carried), a busy context, a fork with no context as before; the bad counts, the
//! bounds (--max-sandboxes, memory), unknown and paused sandboxes; the span and audit
//! record. Each test ends with the daemon stopped and nothing left on the host.

use std::time::Duration;

use agentrun_e2e::osb::*;
use agentrun_e2e::snapshots::{swept_scenario, SnapshotSweep};
use agentrun_e2e::*;

#[test]
fn a_code_contexts_sandbox_forked_into_ten_copies_each_with_its_100_mb_state() {
    let Some(lock) = setup_exclusive() else {
        return;
    };
    let _sweep = SnapshotSweep::new(&lock);
    let audit = tempdir();
    let rx = agentrun_e2e::otlp::OtlpReceiver::grpc();
    let mut env: Vec<(&str, String)> = rx.otel_env();
    env.push(("AGENTRUN_AUDIT_DIR", audit.path().display().to_string()));
    let (d, domain) = start(&env, &["--max-sandboxes", "14"]);
    let out = scenario(&d, &domain, "fork:big_context", &[]);
    println!(
        "fork of a 100 MB context's sandbox into 10: {} s; slowest first print of a copy: {} s",
        printed(&out, "FORK_S"),
        printed(&out, "FIRST_PRINT_MAX_S")
    );
    println!(
        "slowest first execution of a copy's context (its state checked): {} s",
        printed(&out, "FIRST_EXEC_MAX_S")
    );
    let layer = printed(&out, "LAYER").to_owned();
    let span = wait_until(Duration::from_secs(30), || {
        rx.spans()
            .into_iter()
            .find(|s| s.name == "sandbox.fork" && s.attr("sandbox.fork.layer.id") == layer)
    })
    .unwrap_or_else(|| panic!("no sandbox.fork span of {layer}: {:?}", rx.spans()));
    assert_eq!(span.typed_attr("sandbox.fork.count", "int"), "10");
    let bytes: u64 = span
        .typed_attr("sandbox.fork.layer.bytes", "int")
        .parse()
        .unwrap();
    assert!(bytes >= 100 << 20, "{bytes}");
    println!(
        "the fork's span: layer frozen at {} ms, the copies made {} ms after",
        span.typed_attr("sandbox.fork.freeze_ms", "int"),
        span.typed_attr("sandbox.fork.copies_ms", "int")
    );
    assert_eq!(span.attr("sandbox.fork.ids").split(',').count(), 10);
    assert_eq!(span.attr("sandbox.fork.carried"), "files,contexts");
    assert_eq!(span.typed_attr("sandbox.fork.contexts", "int"), "1");
    assert_eq!(span.attr("sandbox.fork.contexts.not_carried"), "");
    let records = d
        .agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", audit.path())
        .run()
        .success();
    let fork = records
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["kind"] == "fork" && r["resource"] == layer.as_str())
        .unwrap_or_else(|| panic!("no fork audit record of {layer}: {records}"));
    assert_eq!(fork["decision"], "ok", "{fork}");
    let text = fork.to_string();
    assert!(
        text.contains("and 1 of 1 code contexts (not carried: none)"),
        "{fork}"
    );
    stop_clean(d);
}

#[test]
fn what_a_context_cannot_carry_is_named_and_the_rest_carried() {
    swept_scenario("fork:contexts", &["--max-sandboxes", "8"]);
}

#[test]
fn bad_counts_the_bounds_and_unknown_or_paused_sandboxes_are_refused() {
    swept_scenario(
        "fork:bad_input",
        &["--max-sandboxes", "4", "--max-snapshot", "4m"],
    );
}

#[test]
fn agentrun_fork_prints_the_copies_ids() {
    swept_scenario("fork:cli", &["--max-sandboxes", "6"]);
}

#[test]
fn a_snapshot_of_a_fork_copy_holds_its_parents_files_and_its_own() {
    swept_scenario("fork:copy_snapshot", &["--max-sandboxes", "8"]);
}

#[test]
fn a_daemon_killed_with_fork_copies_restarts_with_no_frozen_layer_left() {
    let Some(lock) = setup_exclusive() else {
        return;
    };
    let _sweep = SnapshotSweep::new(&lock);
    let (mut d, domain) = start(&[], &["--max-sandboxes", "6"]);
    let out = scenario(&d, &domain, "fork:leave_copies", &[]);
    let layer = d.state().join("frozen").join(printed(&out, "LAYER"));
    assert!(layer.is_dir(), "{} while its copies run", layer.display());
    d.kill9();
    relaunch_after_kill9(&mut d);
    let left: Vec<_> = std::fs::read_dir(d.state().join("frozen"))
        .map(|r| r.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "frozen layers after a restart: {left:?}");
    stop_clean(d);
}

/// The same with the `code-interpreter` profile, whose contexts are forked from its shells'
/// Python zygote (numpy preloaded): a copy's context, forked from its own shell's zygote,
/// loads the parent's globals as well.
#[test]
fn contexts_forked_from_a_zygote_carry_their_globals_too() {
    swept_scenario(
        "fork:contexts",
        &[
            "--max-sandboxes",
            "8",
            "--opensandbox-profile",
            "code-interpreter",
        ],
    );
}
