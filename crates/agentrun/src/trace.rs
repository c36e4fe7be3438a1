//! Every policy decision of a run, traced and kept: a `policy.check` child span of the run's
//! `sandbox.exec` span and a record in the audit log, from wherever the decision is made
//! (argument checks before the sandbox exists, the egress proxy's threads during the run).
//!
//! Decisions made before the sandbox exists are held until its id is known (or the run is
//! refused), then written; everything later is written at once. A decision counts as recorded
//! only once the audit log has it on disk.

use std::sync::{Arc, Mutex};

use agentrun_policy::{Action, Decision};
use agentrun_telemetry::audit::AuditError;
use agentrun_telemetry::decision::{EGRESS_CONNECT, POLICY_CHECK};
use agentrun_telemetry::{
    trace_id_of, AuditLog, AuditRecord, DecisionScope, FinishedSpan, RunSpan,
};

/// Records decisions; cheap to clone, safe to share with the proxy's threads.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    parent: RunSpan,
    trace_id: String,
    profile: String,
    audit: AuditLog,
    sandbox_id: Option<String>,
    pending: Vec<AuditRecord>,
    /// Spans of held decisions: ended once the sandbox id is on them.
    pending_spans: Vec<RunSpan>,
    children: Vec<FinishedSpan>,
    decisions: u64,
    denials: u64,
    /// Rule ids of the denials, for the daemon's metrics.
    denied_rules: Vec<String>,
}

impl Recorder {
    pub fn new(parent: &RunSpan, audit: AuditLog, profile: &str) -> Self {
        let trace_id = trace_id_of(&parent.traceparent());
        Recorder {
            inner: Arc::new(Mutex::new(Inner {
                parent: parent.clone(),
                trace_id,
                profile: profile.to_owned(),
                audit,
                sandbox_id: None,
                pending: Vec::new(),
                pending_spans: Vec::new(),
                children: Vec::new(),
                decisions: 0,
                denials: 0,
                denied_rules: Vec::new(),
            })),
        }
    }

    /// The profile's own name, once it is loaded (recorded with every decision).
    pub fn set_profile(&self, name: &str) {
        self.lock().profile = name.to_owned();
    }

    /// The sandbox's id, once it exists.
    pub fn sandbox_id(&self) -> Option<String> {
        self.lock().sandbox_id.clone()
    }

    /// The profile name decisions are recorded under.
    pub fn profile(&self) -> String {
        self.lock().profile.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        agentrun_pool::lock(&self.inner)
    }

    /// Traces and keeps one decision. Returns whether it is on disk (always false before the
    /// sandbox id is known: it is held until [`Recorder::set_sandbox`] or [`Recorder::flush`]).
    pub fn decision(&self, action: &Action, d: &Decision) -> bool {
        self.decision_by(action, d, "agentrun", None)
    }

    /// Like [`Recorder::decision`] for a decision enforced (and reported) by `enforced_by`
    /// (`agentrun`, `egress-proxy`, `landlock`), at `time` (RFC 3339) when it is known.
    pub fn decision_by(
        &self,
        action: &Action,
        d: &Decision,
        enforced_by: &'static str,
        time: Option<String>,
    ) -> bool {
        let mut g = self.lock();
        g.decisions += 1;
        if !d.allow {
            g.denials += 1;
            g.denied_rules.push(d.rule_id.clone());
        }
        let mut span = g.parent.child(POLICY_CHECK);
        let mut record = g.scope().decision(&mut span, action, d, enforced_by);
        if let Some(time) = time {
            record.time = time;
        }
        if g.sandbox_id.is_some() {
            g.children.push(span.end());
        } else {
            g.pending_spans.push(span);
        }
        if g.sandbox_id.is_none() {
            g.pending.push(record);
            return false;
        }
        match g.audit.append(&record) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("agentrun: {e}");
                false
            }
        }
    }

    /// Traces and keeps a connection the egress proxy could not make after the policy
    /// allowed it (`d`): a name that does not resolve, an upstream that refuses. An error,
    /// not a decision: an `egress.connect` span with status Error and `error.type`, and an
    /// audit record of kind `error`; never counted as a violation.
    pub fn failure(&self, action: &Action, d: &Decision, f: &agentrun_egress::Failure) {
        let mut g = self.lock();
        let mut span = g.parent.child(EGRESS_CONNECT);
        let record = g
            .scope()
            .failure(&mut span, action, d, f.kind.error_type(), &f.message);
        g.children.push(span.end());
        if let Err(e) = g.audit.append(&record) {
            eprintln!("agentrun: {e}");
        }
    }

    /// The sandbox exists: held decisions are written with its id.
    pub fn set_sandbox(&self, id: &str) -> Result<(), AuditError> {
        let mut g = self.lock();
        g.sandbox_id = Some(id.to_owned());
        g.flush()
    }

    /// Writes the decisions still held (with the sandbox's id, when it exists): before the
    /// run's own record, which makes them durable.
    pub fn flush(&self) -> Result<(), AuditError> {
        self.lock().flush()
    }

    /// The audit log the run's decisions (and its `run` record) go to.
    pub fn audit(&self) -> AuditLog {
        self.lock().audit.clone()
    }

    /// The rule ids of the denials so far.
    pub fn denied_rules(&self) -> Vec<String> {
        self.lock().denied_rules.clone()
    }

    /// The decision spans so far, and (decisions, denials).
    pub fn take(&self) -> (Vec<FinishedSpan>, u64, u64) {
        let mut g = self.lock();
        let held: Vec<FinishedSpan> = std::mem::take(&mut g.pending_spans)
            .into_iter()
            .map(RunSpan::end)
            .collect();
        g.children.extend(held);
        (std::mem::take(&mut g.children), g.decisions, g.denials)
    }
}

impl Inner {
    fn scope(&self) -> DecisionScope<'_> {
        DecisionScope {
            profile: &self.profile,
            sandbox_id: self.sandbox_id.as_deref(),
            trace_id: &self.trace_id,
        }
    }

    fn flush(&mut self) -> Result<(), AuditError> {
        let id = self.sandbox_id.clone().unwrap_or_default();
        for mut span in std::mem::take(&mut self.pending_spans) {
            if !id.is_empty() {
                span.set_attribute("sandbox.id", id.clone());
            }
            self.children.push(span.end());
        }
        // Written now, made durable by the run's own record (`RunFinish::write`): the start of
        // a run waits for no disk flush of its own.
        for mut r in std::mem::take(&mut self.pending) {
            r.sandbox_id = id.clone();
            self.audit.append_written(&r)?;
        }
        Ok(())
    }
}
