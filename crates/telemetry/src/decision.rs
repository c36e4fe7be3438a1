//! A policy decision as agentrun keeps it, wherever it is made (a CLI run's checks and its
//! egress proxy, the egress proxy of a daemon's sandbox): a [`POLICY_CHECK`] span and an audit
//! record of kind `decision`. A connection the egress proxy could not make after the policy
//! allowed it is kept the same way, as an error and not a decision: an [`EGRESS_CONNECT`]
//! span with status Error and an audit record of kind `error`.
//!
//! The caller starts the span (as a child of its run's span, or from a `traceparent`), ends or
//! exports it, and appends the record (at once, or held until the sandbox exists).

use agentrun_policy::{Action, Decision};

use crate::audit::now_rfc3339;
use crate::{AuditRecord, RunSpan};

/// The name of a decision's span.
pub const POLICY_CHECK: &str = "policy.check";
/// The name of the span of a connection that could not be made.
pub const EGRESS_CONNECT: &str = "egress.connect";

/// What the decisions of one run or sandbox are recorded with.
#[derive(Debug, Clone, Copy)]
pub struct DecisionScope<'a> {
    /// The profile (policy) they are made under.
    pub profile: &'a str,
    /// The sandbox, once it exists.
    pub sandbox_id: Option<&'a str>,
    /// The trace their spans belong to.
    pub trace_id: &'a str,
}

impl DecisionScope<'_> {
    /// Puts decision `d` on `action`, enforced by `enforced_by` (`agentrun`, `egress-proxy`,
    /// `landlock`), on `span` (a fresh [`POLICY_CHECK`] span) and returns its audit record,
    /// timestamped now.
    pub fn decision(
        &self,
        span: &mut RunSpan,
        action: &Action,
        d: &Decision,
        enforced_by: &str,
    ) -> AuditRecord {
        span.set_decision(action, d, self.profile, enforced_by);
        self.set_sandbox(span);
        AuditRecord {
            decision: d.verdict().into(),
            escalation: d
                .escalation
                .map(|o| o.as_str().to_owned())
                .unwrap_or_default(),
            reason: d.reason.clone(),
            ..self.record("decision", action, d)
        }
    }

    /// Puts a connection for `action` that `d` allowed and that could not be made
    /// (`error_type`, e.g. `resolve`, and `message`) on `span` (a fresh [`EGRESS_CONNECT`]
    /// span) and returns its audit record, timestamped now.
    pub fn failure(
        &self,
        span: &mut RunSpan,
        action: &Action,
        d: &Decision,
        error_type: &str,
        message: &str,
    ) -> AuditRecord {
        span.set_connect_failure(action, &d.rule_id, error_type, message);
        self.set_sandbox(span);
        AuditRecord {
            decision: "error".into(),
            reason: message.to_owned(),
            ..self.record("error", action, d)
        }
    }

    fn set_sandbox(&self, span: &mut RunSpan) {
        if let Some(id) = self.sandbox_id {
            span.set_attribute("sandbox.id", id.to_owned());
        }
    }

    fn record(&self, kind: &str, action: &Action, d: &Decision) -> AuditRecord {
        AuditRecord {
            time: now_rfc3339(),
            kind: kind.into(),
            sandbox_id: self.sandbox_id.unwrap_or_default().to_owned(),
            trace_id: self.trace_id.to_owned(),
            action: action.name().into(),
            resource: action.resource(),
            rule: d.rule_id.clone(),
            profile: self.profile.to_owned(),
            ..Default::default()
        }
    }
}

/// The trace id of a W3C `traceparent` (empty when it has none).
pub fn trace_id_of(traceparent: &str) -> String {
    traceparent.split('-').nth(1).unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_and_a_failure_carry_their_scope() {
        let scope = DecisionScope {
            profile: "p",
            sandbox_id: Some("sb"),
            trace_id: "t",
        };
        let action = Action::Connect {
            host: "example.com".into(),
            port: 443,
        };
        let d = Decision::deny("r1", "denied");
        let mut span = RunSpan::start(POLICY_CHECK, None);
        let r = scope.decision(&mut span, &action, &d, "egress-proxy");
        assert_eq!(
            (r.kind.as_str(), r.decision.as_str(), r.rule.as_str()),
            ("decision", "deny", "r1")
        );
        assert_eq!((r.sandbox_id.as_str(), r.trace_id.as_str()), ("sb", "t"));
        assert!(span.attribute("sandbox.id").is_some());
        assert_eq!(r.escalation, "");
        assert!(span.attribute("sandbox.escalation.outcome").is_none());
        // An escalation carries its outcome on the span and the record.
        let e = Decision::escalate("network.escalate[0]", "connecting to example.com:443").settle(
            &agentrun_policy::Answer::TimedOut(std::time::Duration::from_secs(60)),
        );
        let mut span = RunSpan::start(POLICY_CHECK, None);
        let r = scope.decision(&mut span, &action, &e, "egress-proxy");
        assert_eq!(
            (r.decision.as_str(), r.escalation.as_str()),
            ("escalate", "timeout")
        );
        assert!(r.reason.contains("no answer within 60 s"), "{r:?}");
        assert!(span.attribute("sandbox.escalation.outcome").is_some());
        assert_eq!(
            span.attribute("sandbox.blocked"),
            Some(&crate::span::AttrValue::Bool(true))
        );
        let mut span = RunSpan::start(EGRESS_CONNECT, None);
        let r = scope.failure(&mut span, &action, &d, "resolve", "no such host");
        assert_eq!(
            (r.kind.as_str(), r.decision.as_str(), r.reason.as_str()),
            ("error", "error", "no such host")
        );
    }

    #[test]
    fn trace_id_of_a_traceparent() {
        assert_eq!(
            trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(trace_id_of(""), "");
    }
}
