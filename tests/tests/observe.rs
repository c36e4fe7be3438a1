//! The daemon's live picture and its kill, for a long-lived sandbox's commands: an
//! OpenSandbox command shows on the control socket's `top` as a `process` of its sandbox
//! (its sandbox's CPU and memory, its shell), `kill` ends that command alone with 137 and the
//! sandbox goes on, unknown ids are refused, and the last minute's runs count its next
//! command (`tests/opensandbox/sdk_observe.py`, the official SDK). `agentrun exec` runs are
//! covered by tests/tests/top.rs and the dashboard's tests.

use agentrun_e2e::osb::*;
use agentrun_e2e::*;

#[test]
fn opensandbox_command_is_listed_and_killed_alone() {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start(&[], &[]);
    scenario(&d, &domain, "observe:process_kill", &[]);
    stop_clean(d);
}
