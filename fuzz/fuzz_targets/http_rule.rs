//! The L7 rule parser (`HttpRule::parse`, a profile's `http_allow`/`http_deny`/
//! `http_escalate` entries) and `check_http` on arbitrary input: no panic; an accepted rule
//! has an upper-case method or none, a path prefix starting with `/` and no space, and
//! deciding any request with it never panics.
#![no_main]

use agentrun_policy::{check_http, HttpRequest, HttpRule, RuleAction};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The first line is the rule; the second, a request line `METHOD HOST PORT PATH`.
    let mut lines = text.splitn(2, '\n');
    let spec = lines.next().unwrap_or_default();
    let Ok(rule) = HttpRule::parse("fuzz[0]", RuleAction::Deny, spec) else {
        return;
    };
    assert!(rule.path.starts_with('/'));
    assert!(!rule.path.contains(' '));
    if let Some(m) = &rule.method {
        assert_eq!(m, &m.to_ascii_uppercase());
    }
    let _ = rule.target();
    let req = lines.next().unwrap_or_default();
    let parts: Vec<&str> = req.split(' ').collect();
    if let [method, host, port, path] = parts.as_slice() {
        let port = port.parse().unwrap_or(443);
        let fields = vec![("X-A".to_owned(), b"1".to_vec())];
        let req = HttpRequest {
            method,
            host,
            port,
            path,
            fields: &fields,
        };
        if let Some(d) = check_http(&[rule], &req) {
            assert!(!d.rule_id.is_empty());
        }
    }
});
