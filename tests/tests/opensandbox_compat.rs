//! Behaviours of upstream OpenSandbox that its SDK e2e tests rely on, checked with the official
//! SDK against `agentrun serve --listen` (`tests/opensandbox/sdk_compat.py`; the table of what
//! is served is docs/opensandbox-compat.md).
//!
//! - A code interrupt stops the running execution with `KeyboardInterrupt` and the context
//!   lives on with its globals, even when it arrives at once (from the `init` handler), and an
//!   interrupt of an idle context changes nothing (upstream's
//!   `test_code_interpreter_e2e*::test_08_code_execution_interrupt`), sync and async.

use agentrun_e2e::osb::*;

#[test]
fn code_interrupt_keeps_the_context_sync() {
    run_scenario("compat:code_interrupt_sync");
}

#[test]
fn code_interrupt_keeps_the_context_async() {
    run_scenario("compat:code_interrupt_async");
}

#[test]
fn routes_are_served_at_the_root_too_and_unserved_ones_say_why() {
    run_scenario("compat:routes");
}

#[test]
fn cwd_expands_variables_and_tilde_as_execd() {
    run_scenario("compat:cwd_expansion");
}

#[test]
fn set_env_reaches_later_commands_sync() {
    run_scenario("compat:set_env");
}

#[test]
fn set_env_reaches_later_commands_async() {
    run_scenario("compat:set_env_async");
}

#[test]
fn server_proxy_traffic_renews_a_sandbox_with_the_access_renew_extension() {
    run_scenario("compat:access_renew");
}
