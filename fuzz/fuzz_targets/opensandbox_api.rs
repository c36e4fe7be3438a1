//! The OpenSandbox API's request parsing (`crates/opensandbox`): what the official SDKs send.
//! The first byte picks the request; the rest is its body (or header/query value):
//! - lifecycle: 0 create (`POST /v1/sandboxes`: image, entrypoint, env, metadata, resource
//!   limits, networkPolicy, ...), 1 renew, 2 metadata patch, 3 cpu/memory quantities;
//! - execd commands: 4 run command, 5 create session, 6 run in session;
//! - files: 7 upload metadata part, 8 permissions, 9 move, 10 replace, 11 `Range` header,
//!   12 search pattern (glob);
//! - code interpreting: 13 create context, 14 run code;
//! - egress (`networkPolicy` and the sidecar's `/policy`): 15 a policy, 16 PATCH rules,
//!   17 DELETE targets. Property: every rule a policy accepted is one the proxy decides with
//!   (none silently dropped: a dropped deny rule would open the network).
#![no_main]

use agentrun_opensandbox::{code, execd, files, lifecycle};
use agentrun_policy::{OpenSandboxPolicy, OpenSandboxRule};
use libfuzzer_sys::fuzz_target;

fn policy_checks(p: &OpenSandboxPolicy) {
    let net = p.to_network_policy();
    assert_eq!(
        net.rules.len(),
        p.egress.len(),
        "rules dropped on the way to the proxy: {p:?} -> {net:?}"
    );
    for r in &p.egress {
        let host = r.target.trim_start_matches("*.");
        for h in [host.to_owned(), format!("x.{host}"), format!("{host}.")] {
            let d = net.check(&h, 443);
            assert!(!d.rule_id.is_empty());
        }
    }
    let _ = OpenSandboxPolicy::from_value(p.to_value()).expect("a policy's own JSON parses");
}

fn base_policy() -> OpenSandboxPolicy {
    OpenSandboxPolicy::from_value(serde_json::json!({
        "defaultAction": "deny",
        "egress": [{"action": "allow", "target": "pypi.org"}, {"action": "deny", "target": "*.evil.test"}],
    }))
    .expect("valid policy")
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, body)) = agentrun_fuzz::split_selector(data) else {
        return;
    };
    let text = std::str::from_utf8(body).ok();
    match sel % 18 {
        0 => {
            if let Ok((_, v)) = lifecycle::parse_create(body) {
                drop(v);
            }
        }
        1 => {
            let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("time");
            let _ = lifecycle::parse_renew(body, now);
        }
        2 => {
            let mut current = std::collections::BTreeMap::new();
            current.insert("team".to_owned(), "a".to_owned());
            let _ = lifecycle::patch_metadata_body(current, body);
        }
        3 => {
            if let Some(t) = text {
                let _ = lifecycle::parse_cpu(t);
                let _ = lifecycle::parse_memory(t);
            }
        }
        4 => {
            let _ = execd::parse_run_command(body);
        }
        5 => {
            let _ = execd::parse_create_session(body);
        }
        6 => {
            let _ = execd::parse_run_in_session(body);
        }
        7 => {
            let _ = files::parse_file_meta(body);
        }
        8 => {
            let _ = files::parse_permissions(body);
        }
        9 => {
            let _ = files::parse_moves(body);
        }
        10 => {
            let _ = files::parse_replacements(body);
        }
        11 => {
            if body.len() >= 8 {
                let size = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
                if let Ok(h) = std::str::from_utf8(&body[8..]) {
                    if let Some((a, b)) = files::parse_range(h, size) {
                        assert!(a <= b && b < size, "range {a}-{b} of {size} from {h:?}");
                    }
                }
            }
        }
        12 => {
            if let Some(Ok(m)) = text.map(files::search_matcher) {
                for p in ["a.py", "dir/a.py", "a/b/c.txt", ".hidden", ""] {
                    let _ = m.is_match(p);
                }
            }
        }
        13 => {
            let _ = code::parse_create_context(body);
        }
        14 => {
            let _ = code::parse_run_code(body);
        }
        15 => {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
                if let Ok(p) = OpenSandboxPolicy::from_value(v) {
                    policy_checks(&p);
                }
            }
        }
        16 => {
            if let Ok(rules) = serde_json::from_slice::<Vec<OpenSandboxRule>>(body) {
                let mut p = base_policy();
                if p.patch(&rules).is_ok() {
                    policy_checks(&p);
                }
            }
        }
        _ => {
            if let Ok(targets) = serde_json::from_slice::<Vec<String>>(body) {
                let mut p = base_policy();
                if p.remove(&targets).is_ok() {
                    policy_checks(&p);
                }
            }
        }
    }
});
