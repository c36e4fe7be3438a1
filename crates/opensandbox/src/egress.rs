//! A sandbox's `networkPolicy`, enforced, and the egress sidecar API that changes it.
//!
//! A sandbox created with a `networkPolicy` gets agentrun's egress bridge (`127.0.0.1:3128`
//! inside it, `HTTP(S)_PROXY` in every process's environment) and its own egress proxy on the
//! host, listening on the socket in the sandbox's state dir. The proxy decides every
//! connection with [`agentrun_policy::NetworkPolicy::check`] on the rules mapped from the
//! policy ([`OpenSandboxPolicy::to_network_policy`]); each decision is a `policy.check` span
//! (child of the sandbox's `sandbox.create`) and an audit record with the sandbox id, made by
//! [`agentrun_telemetry::DecisionScope`] as the CLI's runs make theirs.
//!
//! The egress sidecar's API, [`routes`] under `/egress/{sid}` (what the endpoint lookup for
//! port 18080 hands out, guarded by the per-sandbox `OPENSANDBOX-EGRESS-AUTH` token):
//! `/policy` serves `GET` (the policy in force), `PATCH` (merge rules: incoming first, one
//! rule per target) and `DELETE` (remove rules by target); `/credential-vault` answers 501.
//! A change replaces the proxy's policy at once (the next connection is decided by it, and
//! open connections it denies are cut) and is audited. A sandbox created without a
//! `networkPolicy` has no network at all (loopback only) and no proxy; its policy cannot be
//! changed.

use std::path::Path;
use std::sync::{Arc, Mutex};

use agentrun_egress::{DecisionSink, Failure, FailureSink, Proxy};
use agentrun_policy::{Action, Decision, OpenSandboxPolicy, OpenSandboxRule, RuleAction};
use agentrun_pool::lock;
use agentrun_telemetry::decision::{EGRESS_CONNECT, POLICY_CHECK};
use agentrun_telemetry::{trace_id_of, AuditLog, AuditRecord, DecisionScope, RunSpan};
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::{any, get};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::auth::EgressSandbox;
use crate::error::{ApiError, ApiResult, JsonBody};
use crate::{Record, Server};

/// The profile name decisions are recorded under.
const PROFILE: &str = "opensandbox.networkPolicy";

/// The enforced network policy of one sandbox and the proxy enforcing it.
pub struct SandboxEgress {
    sandbox_id: String,
    /// The policy as the API shows and changes it.
    policy: Mutex<OpenSandboxPolicy>,
    proxy: Mutex<Option<Proxy>>,
    audit: AuditLog,
    /// `traceparent` of the sandbox's `sandbox.create` span.
    trace: String,
}

impl SandboxEgress {
    /// Starts the proxy of sandbox `id` on `socket` (the sandbox's egress socket).
    pub fn start(
        id: &str,
        socket: &Path,
        policy: OpenSandboxPolicy,
        audit: AuditLog,
        trace: String,
    ) -> Result<Self, agentrun_egress::EgressError> {
        let listener = agentrun_egress::bind(socket)?;
        let sink = decision_sink(id.to_owned(), audit.clone(), trace.clone());
        let failures = failure_sink(id.to_owned(), audit.clone(), trace.clone());
        let proxy = Proxy::builder(policy.to_network_policy(), sink)
            .failures(failures)
            .start(listener, socket);
        Ok(SandboxEgress {
            sandbox_id: id.to_owned(),
            policy: Mutex::new(policy),
            proxy: Mutex::new(Some(proxy)),
            audit,
            trace,
        })
    }

    /// The policy in force.
    pub fn policy(&self) -> OpenSandboxPolicy {
        lock(&self.policy).clone()
    }

    /// Applies `change` to the policy and puts the result in force; audited as `action`
    /// (`resource`: what was asked). Nothing changes when `change` fails.
    fn change(
        &self,
        action: &str,
        resource: String,
        change: impl FnOnce(&mut OpenSandboxPolicy) -> Result<(), agentrun_policy::NetworkPolicyError>,
    ) -> ApiResult<OpenSandboxPolicy> {
        let mut current = lock(&self.policy);
        let mut next = current.clone();
        change(&mut next).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let record = AuditRecord {
            kind: "policy".into(),
            sandbox_id: self.sandbox_id.clone(),
            trace_id: trace_id_of(&self.trace),
            action: action.into(),
            resource,
            decision: "applied".into(),
            reason: next.to_value().to_string(),
            profile: PROFILE.into(),
            ..Default::default()
        };
        // A change nobody can later account for is not made.
        self.audit
            .append(&record)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        if let Some(p) = lock(&self.proxy).as_ref() {
            p.set_policy(next.to_network_policy());
        }
        *current = next.clone();
        Ok(next)
    }

    /// Stops the proxy (before the sandbox's state dir goes away).
    pub fn stop(&self) {
        if let Some(p) = lock(&self.proxy).take() {
            p.stop();
        }
    }

    /// The proxy, to stop off the async threads (before the sandbox's state dir goes away);
    /// later changes only update the stored policy.
    pub fn take_proxy(&self) -> Option<Proxy> {
        lock(&self.proxy).take()
    }
}

/// The scope of sandbox `id`'s decisions, in the trace of `traceparent`.
fn scope<'a>(id: &'a str, trace_id: &'a str) -> DecisionScope<'a> {
    DecisionScope {
        profile: PROFILE,
        sandbox_id: Some(id),
        trace_id,
    }
}

/// Appends `record` to the audit log; whether it is on disk (a failure is logged).
fn append(audit: &AuditLog, id: &str, record: &AuditRecord) -> bool {
    match audit.append(record) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(target: "agentrun::opensandbox::egress", sandbox = %id, "audit log: {e}");
            false
        }
    }
}

/// Exports `span` on a thread of its own: the export may block on the network, never on a
/// connection's path.
fn export(span: RunSpan) {
    if agentrun_telemetry::export_enabled() {
        let _ = std::thread::Builder::new()
            .name("egress-span".into())
            .spawn(move || span.finish());
    }
}

/// Traces and audits each of the proxy's decisions for sandbox `id`. An allow is acted on
/// only once its audit record is on disk.
fn decision_sink(id: String, audit: AuditLog, trace: String) -> DecisionSink {
    let trace_id = trace_id_of(&trace);
    Arc::new(move |action: &Action, d: &Decision| {
        let mut span = RunSpan::start(POLICY_CHECK, Some(&trace));
        let record = scope(&id, &trace_id).decision(&mut span, action, d, "egress-proxy");
        let recorded = append(&audit, &id, &record);
        export(span);
        recorded
    })
}

/// Traces and audits a connection sandbox `id`'s proxy could not make after the policy
/// allowed it (a name that does not resolve, an upstream that refuses): an `egress.connect`
/// span with status Error, an audit record of kind `error`. Not a denial.
fn failure_sink(id: String, audit: AuditLog, trace: String) -> FailureSink {
    let trace_id = trace_id_of(&trace);
    Arc::new(move |action: &Action, d: &Decision, f: &Failure| {
        let mut span = RunSpan::start(EGRESS_CONNECT, Some(&trace));
        let record =
            scope(&id, &trace_id).failure(&mut span, action, d, f.kind.error_type(), &f.message);
        append(&audit, &id, &record);
        export(span);
    })
}

/// The egress sidecar's API of one sandbox, served under `/egress/{sid}`.
pub fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route(
            "/policy",
            get(get_policy).patch(patch_policy).delete(delete_policy),
        )
        .route("/credential-vault", any(credential_vault))
        .route("/credential-vault/{*rest}", any(credential_vault))
        .with_state(server)
}

/// The sidecar's credential vault: not supported (501, once the token checks out).
async fn credential_vault(_: EgressSandbox) -> ApiResult<StatusCode> {
    Err(ApiError::not_supported(
        "the credential vault is not supported",
    ))
}

/// The `PolicyStatusResponse` of a policy.
fn status(policy: Option<&OpenSandboxPolicy>) -> Value {
    let (mode, policy) = match policy {
        Some(p) => (
            match p.default_action {
                RuleAction::Allow => "allow_all",
                RuleAction::Deny => "deny_all",
            },
            p.to_value(),
        ),
        // No networkPolicy: no network at all.
        None => ("deny_all", json!({"defaultAction": "deny", "egress": []})),
    };
    json!({"status": "ok", "mode": mode, "enforcementMode": "proxy", "policy": policy})
}

fn egress_of(rec: &Record) -> ApiResult<&SandboxEgress> {
    rec.egress.as_ref().ok_or_else(|| {
        ApiError::conflict(format!(
            "sandbox {} was created without a networkPolicy: it has no network, and its egress policy cannot be changed",
            rec.id
        ))
    })
}

async fn get_policy(EgressSandbox(rec): EgressSandbox) -> ApiResult<Json<Value>> {
    let policy = rec.egress.as_ref().map(SandboxEgress::policy);
    Ok(Json(status(policy.as_ref())))
}

async fn patch_policy(
    EgressSandbox(rec): EgressSandbox,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    change_policy(
        &rec,
        &body,
        "net.policy.patch",
        "[{\"action\": \"allow\"|\"deny\", \"target\": \"...\"}]",
        |policy, rules: &Vec<OpenSandboxRule>| policy.patch(rules),
    )
}

async fn delete_policy(
    EgressSandbox(rec): EgressSandbox,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    change_policy(
        &rec,
        &body,
        "net.policy.delete",
        "a list of targets",
        |policy, targets: &Vec<String>| policy.remove(targets).map(|_| ()),
    )
}

/// PATCH and DELETE `/policy`: the body parsed as `T` (else 400 saying what was `expected`),
/// the change audited (`action`, the body as the resource) and applied to the live proxy.
fn change_policy<T: serde::de::DeserializeOwned + serde::Serialize>(
    rec: &Record,
    body: &Bytes,
    action: &str,
    expected: &str,
    apply: impl FnOnce(&mut OpenSandboxPolicy, &T) -> Result<(), agentrun_policy::NetworkPolicyError>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let asked: T = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("invalid request body: expected {expected}: {e}"))
    })?;
    let egress = egress_of(rec)?;
    let resource = serde_json::to_string(&asked).unwrap_or_default();
    let next = tokio::task::block_in_place(|| {
        egress.change(action, resource, |policy| apply(policy, &asked))
    })?;
    Ok((StatusCode::OK, Json(status(Some(&next)))))
}
