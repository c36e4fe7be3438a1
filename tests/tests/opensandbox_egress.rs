//! Egress conformance of `agentrun serve` with the official SDK, sync and async
//! (`tests/opensandbox/sdk_egress.py`): what a sandbox's client sees for a name its
//! `networkPolicy` allows that does not resolve (502, an error: not a denial) and for a denied
//! one (403), and how that is audited and traced; the egress sidecar's `PATCH`/`DELETE
//! /policy` merged and answered as upstream's (components/egress/policy_server.go), and what
//! of it is audited.

use std::time::Duration;

use agentrun_e2e::osb::*;
use agentrun_e2e::otlp::OtlpReceiver;
use agentrun_e2e::*;
use serde_json::Value;

/// The audit log of `dir` as JSON records.
fn audit_records(d: &Daemon, dir: &std::path::Path) -> Vec<Value> {
    d.agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", dir)
        .run()
        .success()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// `(kind, decision, rule)` of sandbox `sid`'s records about `resource`, in order.
fn about<'a>(all: &'a [Value], sid: &str, resource: &str) -> Vec<(&'a str, &'a str, &'a str)> {
    all.iter()
        .filter(|r| r["sandbox_id"] == sid && r["resource"] == resource)
        .map(|r| {
            (
                r["kind"].as_str().unwrap(),
                r["decision"].as_str().unwrap(),
                r["rule"].as_str().unwrap_or(""),
            )
        })
        .collect()
}

/// A name the policy allows that does not resolve is answered 502 (the SDK scenario checks
/// the answers, sync and async); it is audited as an allow followed by an error saying it
/// did not resolve, traced as an allowing `policy.check` and a failed `egress.connect`
/// (`error.type=resolve`), and never listed as a denial. Denials stay denials.
#[test]
fn unresolvable_allowed_names_are_errors_not_denials() {
    let Some(_lock) = setup() else { return };
    let audit = tempdir();
    let rx = OtlpReceiver::grpc();
    let (d, domain) = start_observed(&rx, audit.path());
    let sync = printed(&scenario(&d, &domain, "egress:unresolved", &[]), "SANDBOX").to_string();
    let asyn = printed(
        &scenario(&d, &domain, "egress:unresolved_async", &[]),
        "SANDBOX",
    )
    .to_string();

    let all = audit_records(&d, audit.path());
    for sid in [sync.as_str(), asyn.as_str()] {
        let allowed = ("decision", "allow", "networkPolicy.egress[1]");
        let error = ("error", "error", "networkPolicy.egress[1]");
        assert_eq!(
            about(&all, sid, "allowed.invalid:80"),
            [allowed, error],
            "{all:#?}"
        );
        assert_eq!(
            about(&all, sid, "allowed.invalid:443"),
            [allowed, error],
            "{all:#?}"
        );
        let wild = "networkPolicy.egress[2]";
        assert_eq!(
            about(&all, sid, "deep.sub.wild.invalid:80"),
            [("decision", "allow", wild), ("error", "error", wild)],
            "{all:#?}"
        );
        for r in all
            .iter()
            .filter(|r| r["sandbox_id"] == sid && r["kind"] == "error")
        {
            let host = r["resource"].as_str().unwrap().split(':').next().unwrap();
            assert!(
                r["reason"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("cannot resolve {host}: ")),
                "{r}"
            );
        }
        let denied = ("decision", "deny", "networkPolicy.egress[0]");
        assert_eq!(about(&all, sid, "blocked.invalid:80"), [denied], "{all:#?}");
        assert_eq!(
            about(&all, sid, "blocked.invalid:443"),
            [denied],
            "{all:#?}"
        );
        assert_eq!(
            about(&all, sid, "other.invalid:80"),
            [("decision", "deny", "network.default")],
            "{all:#?}"
        );
    }

    // `agentrun audit --deny` lists the denials and nothing about the unresolved names.
    let denied = d
        .agentrun(["audit", "--deny"])
        .env("AGENTRUN_AUDIT_DIR", audit.path())
        .run()
        .success();
    assert_eq!(denied.lines().count(), 6, "{denied}");
    assert!(!denied.contains("allowed.invalid"), "{denied}");
    assert!(!denied.contains("wild.invalid"), "{denied}");

    // Traced: the allowing policy.check, then an egress.connect error of type resolve.
    let spans = wait_until(Duration::from_secs(20), || {
        let spans = rx.spans();
        let n = spans.iter().filter(|s| s.name == "egress.connect").count();
        (n >= 6).then_some(spans)
    })
    .unwrap_or_else(|| panic!("egress.connect spans missing: {:#?}", rx.spans()));
    for sid in [sync.as_str(), asyn.as_str()] {
        let mine = |name: &str, key: &str, value: &str| -> Vec<_> {
            spans
                .iter()
                .filter(|s| {
                    s.name == name
                        && s.attributes.get("sandbox.id").map(String::as_str) == Some(sid)
                        && s.attributes.get(key).map(String::as_str) == Some(value)
                })
                .collect()
        };
        let of = |name: &str, resource: &str| {
            if name == "policy.check" {
                mine(name, "sandbox.resource", resource)
            } else {
                // egress.connect names the host (server.address) and port (server.port).
                let (host, port) = resource.split_once(':').unwrap();
                mine(name, "server.address", host)
                    .into_iter()
                    .filter(|s| {
                        s.attributes.get("server.port").map(String::as_str) == Some(port)
                            || port == "*"
                    })
                    .collect::<Vec<_>>()
            }
        };
        let check = of("policy.check", "allowed.invalid:80");
        assert_eq!(check.len(), 1, "{spans:#?}");
        assert_eq!(check[0].attr("sandbox.decision"), "allow");
        assert_eq!(check[0].attr("sandbox.blocked"), "false");
        let failed = of("egress.connect", "allowed.invalid:*");
        assert_eq!(failed.len(), 2, "port 80 and 443: {spans:#?}");
        for f in failed {
            assert_eq!(f.status_code, 2, "{f:#?}");
            assert_eq!(f.attr("error.type"), "resolve");
        }
        let check = of("policy.check", "blocked.invalid:80");
        assert_eq!(check.len(), 1, "{spans:#?}");
        assert_eq!(check[0].attr("sandbox.decision"), "deny");
        assert!(of("egress.connect", "blocked.invalid:*").is_empty());
    }
    stop_clean(d);
}

/// `PATCH` and `DELETE /policy` through the SDK (sync and async) and on the wire: upstream's
/// merge and delete semantics, its `mode`, its answers; every change that changes something
/// is audited, a `DELETE` of targets not in the policy is not a change.
#[test]
fn policy_get_patch_delete_and_replace_match_upstream() {
    let Some(_lock) = setup() else { return };
    let audit = tempdir();
    let env = [("AGENTRUN_AUDIT_DIR", audit.path().display().to_string())];
    let (d, domain) = start(&env, &[]);
    let sync = printed(&scenario(&d, &domain, "egress:policy", &[]), "SANDBOX").to_string();
    let asyn = printed(
        &scenario(&d, &domain, "egress:policy_async", &[]),
        "SANDBOX",
    )
    .to_string();

    let all = audit_records(&d, audit.path());
    for sid in [sync.as_str(), asyn.as_str()] {
        let changes: Vec<(&str, &str)> = all
            .iter()
            .filter(|r| r["kind"] == "policy" && r["sandbox_id"] == sid)
            .map(|r| {
                (
                    r["action"].as_str().unwrap(),
                    r["resource"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            changes,
            [
                (
                    "net.policy.patch",
                    r#"[{"action":"deny","target":"pypi.ORG"},{"action":"allow","target":"*.A.test"},{"action":"allow","target":"X.test"},{"action":"deny","target":"x.TEST"}]"#
                ),
                (
                    "net.policy.patch",
                    r#"[{"action":"deny","target":"b.a.test"},{"action":"deny","target":"*.a.test"}]"#
                ),
                ("net.policy.delete", r#"["PYPI.org","nope.test"]"#),
                ("net.policy.delete", r#"["*.A.TEST"]"#),
                (
                    "net.policy.patch",
                    r#"[{"action":"allow","target":"127.0.0.1"}]"#
                ),
                (
                    "net.policy.patch",
                    r#"[{"action":"deny","target":"127.0.0.1"}]"#
                ),
                ("net.policy.delete", r#"["127.0.0.1","b.a.test","x.test"]"#),
                (
                    "net.policy.replace",
                    r#"{"defaultAction":"deny","egress":[{"action":"allow","target":"127.0.0.1"}]}"#
                ),
                (
                    "net.policy.replace",
                    r#"{"defaultAction":"deny","egress":[{"action":"allow","target":"127.0.0.1"}]}"#
                ),
                (
                    "net.policy.reset",
                    r#"{"defaultAction":"deny","egress":[]}"#
                ),
            ],
            "{all:#?}"
        );
    }
    stop_clean(d);
}
