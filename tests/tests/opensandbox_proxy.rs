//! The server-side proxy of the OpenSandbox API (`/v1/sandboxes/{id}/proxy/{port}`, what the
//! endpoint lookup returns with `use_server_proxy=true`), driven by the official SDK with
//! `ConnectionConfig(use_server_proxy=True)` against a daemon with an API key: the scenarios
//! of `tests/opensandbox/sdk_proxy.py` (sync and async SDK: commands streamed, files, logs,
//! the egress policy, a user's HTTP server and WebSocket on a sandbox port, code contexts;
//! what the route refuses; a sandbox's answers carry no `Set-Cookie` and a `CSP: sandbox`;
//! and the route on a daemon with `--insecure-no-auth`). Each test stops its
//! daemon and checks nothing is left on the host.

use agentrun_e2e::osb::*;
use agentrun_e2e::*;

const KEY: &str = "k-proxy-e2e-secret";

fn run_with_key(name: &str) {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start(&[], &["--api-key", KEY]);
    scenario(&d, &domain, name, &[("OSB_API_KEY", KEY.to_string())]);
    stop_clean(d);
}

#[test]
fn sync_sdk_through_the_server_proxy() {
    run_with_key("proxy:sync");
}

#[test]
fn async_sdk_through_the_server_proxy() {
    run_with_key("proxy:async");
}

#[test]
fn server_proxy_needs_the_api_key() {
    run_with_key("proxy:auth");
}

#[test]
fn server_proxy_with_insecure_no_auth() {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start(&[], &["--insecure-no-auth"]);
    scenario(&d, &domain, "proxy:no_key", &[]);
    stop_clean(d);
}
