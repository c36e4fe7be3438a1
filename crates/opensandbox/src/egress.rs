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
//! A name the policy allows that does not resolve is not a denial: the proxy answers `502`
//! saying so, and it is audited and traced as an allow followed by an error (`egress.connect`,
//! `error.type=resolve`). Upstream's sidecar answers a denied name with DNS NXDOMAIN, and an
//! allowed one that does not exist with its resolver's NXDOMAIN (SERVFAIL when the resolver
//! fails); behind a forward proxy the closest answers are 403 and 502.
//!
//! The egress sidecar's API, [`routes`] under `/egress/{sid}` (what the endpoint lookup for
//! port 18080 hands out, guarded by the per-sandbox `OPENSANDBOX-EGRESS-AUTH` token), as
//! upstream's components/egress/policy_server.go serves it: `/policy` serves `GET` (the
//! `PolicyStatusResponse` with the policy in force), `PATCH` (a non-empty list of rules merged
//! by [`OpenSandboxPolicy::patch`]: incoming first, first per target wins, targets compared
//! case-insensitively; `defaultAction` never changes) and `DELETE` (a non-empty JSON list of
//! targets removed by [`OpenSandboxPolicy::remove`]; none of them in the policy: 200 with
//! `reason: "no matching targets found"` and no change); both answer the status without the
//! policy. `POST`/`PUT` replace the whole policy with the body's (an empty body resets it
//! to deny-all, `reason` saying so). `mode` is upstream's: `allow_all`/`deny_all` without rules, else `enforcing`;
//! `enforcementMode` is `proxy`. `/credential-vault` answers 501.
//! A change replaces the proxy's policy at once (the next connection is decided by it, and
//! open connections it denies are cut) and is audited. A sandbox created without a
//! `networkPolicy` has no network at all (loopback only) and no proxy; its policy cannot be
//! changed (409).

use std::path::Path;
use std::sync::{Arc, Mutex};

use agentrun_egress::{DecisionSink, Failure, FailureSink, Proxy};
use agentrun_policy::{Action, Decision, NetworkPolicyError, OpenSandboxPolicy, OpenSandboxRule};
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
        // No approver: the OpenSandbox API has no person to ask, and a `networkPolicy` cannot
        // say escalate (never deserialized); an escalate decision would be denied "needs
        // approval". A front end with someone to ask gives the builder an `approver`.
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
    /// (`resource`: what was asked). Nothing changes when `change` fails, and nothing is
    /// audited or applied when it reports that it changed nothing. Returns the policy in
    /// force and whether it changed.
    fn change(
        &self,
        action: &str,
        resource: String,
        change: impl FnOnce(&mut OpenSandboxPolicy) -> Result<bool, NetworkPolicyError>,
    ) -> ApiResult<(OpenSandboxPolicy, bool)> {
        let mut current = lock(&self.policy);
        let mut next = current.clone();
        if !change(&mut next).map_err(policy_error)? {
            return Ok((next, false));
        }
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
        Ok((next, true))
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

/// Traces and audits each of the proxy's decisions for sandbox `id`. An allow is acted on
/// only once its audit record is on disk.
fn decision_sink(id: String, audit: AuditLog, trace: String) -> DecisionSink {
    let trace_id = trace_id_of(&trace);
    Arc::new(move |action: &Action, d: &Decision| {
        let mut span = RunSpan::start(POLICY_CHECK, Some(&trace));
        let record = scope(&id, &trace_id).decision(&mut span, action, d, "egress-proxy");
        if !d.allow {
            agentrun_pool::metrics::global().denial(&d.rule_id);
        }
        let recorded = append(&audit, &id, &record);
        span.finish_detached("egress-span");
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
        span.finish_detached("egress-span");
    })
}

/// The egress sidecar's API of one sandbox, served under `/egress/{sid}`.
pub fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route(
            "/policy",
            get(get_policy)
                .patch(patch_policy)
                .delete(delete_policy)
                .post(replace_policy)
                .put(replace_policy),
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

/// What the sidecar reports as its `enforcementMode` (upstream: `dns` or `dns+nft`): every
/// connection goes through agentrun's egress proxy.
const ENFORCEMENT_MODE: &str = "proxy";

/// The `PolicyStatusResponse` for `policy`, as upstream's sidecar answers: `mode` derived as
/// upstream's `modeFromPolicy` (`allow_all`/`deny_all` without rules, else `enforcing`), the
/// policy itself only when `with_policy` (GET; PATCH and DELETE leave it out), `reason` when
/// there is one.
fn status(policy: &OpenSandboxPolicy, with_policy: bool, reason: Option<&str>) -> Value {
    let mut v = json!({"status": "ok", "mode": policy.mode(), "enforcementMode": ENFORCEMENT_MODE});
    if with_policy {
        v["policy"] = policy.to_value();
    }
    if let Some(r) = reason {
        v["reason"] = json!(r);
    }
    v
}

/// A policy change refused: 400, or 413 for too many rules (as upstream).
fn policy_error(e: NetworkPolicyError) -> ApiError {
    match e {
        NetworkPolicyError::TooManyRules(_) => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "INVALID_PARAMETER",
            e.to_string(),
        ),
        NetworkPolicyError::Invalid(_) => ApiError::bad_request(e.to_string()),
    }
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
    // Without a networkPolicy: no network at all.
    let policy = rec
        .egress
        .as_ref()
        .map(SandboxEgress::policy)
        .unwrap_or_else(|| OpenSandboxPolicy {
            default_action: agentrun_policy::RuleAction::Deny,
            egress: Vec::new(),
        });
    Ok(Json(status(&policy, true, None)))
}

/// `PATCH /policy`: a non-empty list of rules merged in (see [`OpenSandboxPolicy::patch`]).
async fn patch_policy(
    EgressSandbox(rec): EgressSandbox,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<Value>> {
    let rules: Vec<OpenSandboxRule> = parse(
        &body,
        "[{\"action\": \"allow\"|\"deny\", \"target\": \"...\"}]",
    )?;
    let egress = egress_of(&rec)?;
    let resource = serde_json::to_string(&rules).unwrap_or_default();
    let (next, _) = tokio::task::block_in_place(|| {
        egress.change("net.policy.patch", resource, |policy| {
            policy.patch(&rules).map(|()| true)
        })
    })?;
    Ok(Json(status(&next, false, None)))
}

/// `POST`/`PUT /policy`: the whole policy replaced by the body (a `networkPolicy`:
/// `defaultAction` and `egress`), or reset to deny-all when the body is empty, as upstream's
/// `handlePost`; answers the status without the policy (`reason` on a reset).
async fn replace_policy(
    EgressSandbox(rec): EgressSandbox,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<Value>> {
    let reset = body.iter().all(u8::is_ascii_whitespace);
    let next = if reset {
        OpenSandboxPolicy {
            default_action: agentrun_policy::RuleAction::Deny,
            egress: Vec::new(),
        }
    } else {
        let value: Value = parse(&body, "a networkPolicy {\"defaultAction\", \"egress\"}")?;
        if !value.is_object() {
            return Err(ApiError::bad_request(
                "invalid request body: expected a networkPolicy object {\"defaultAction\", \"egress\"}",
            ));
        }
        OpenSandboxPolicy::from_value(value).map_err(policy_error)?
    };
    if next.egress.len() > agentrun_policy::MAX_OPENSANDBOX_RULES {
        return Err(policy_error(NetworkPolicyError::TooManyRules(
            next.egress.len(),
        )));
    }
    let egress = egress_of(&rec)?;
    let resource = next.to_value().to_string();
    let action = if reset {
        "net.policy.reset"
    } else {
        "net.policy.replace"
    };
    let (next, _) = tokio::task::block_in_place(|| {
        egress.change(action, resource, |policy| {
            *policy = next;
            Ok(true)
        })
    })?;
    let reason = reset.then_some("policy reset to default deny-all");
    Ok(Json(status(&next, false, reason)))
}

/// `DELETE /policy`: a non-empty list of targets removed (see
/// [`OpenSandboxPolicy::remove`]); when none of them is in the policy nothing changes and
/// the answer says so (`reason`), as upstream's.
async fn delete_policy(
    EgressSandbox(rec): EgressSandbox,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<Value>> {
    let targets: Vec<String> = parse(&body, "a list of targets")?;
    let egress = egress_of(&rec)?;
    let resource = serde_json::to_string(&targets).unwrap_or_default();
    let (next, changed) = tokio::task::block_in_place(|| {
        egress.change("net.policy.delete", resource, |policy| {
            policy.remove(&targets).map(|n| n > 0)
        })
    })?;
    let reason = (!changed).then_some("no matching targets found");
    Ok(Json(status(&next, false, reason)))
}

/// A request body parsed as `T`, else 400 saying what was `expected`.
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes, expected: &str) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("invalid request body: expected {expected}: {e}"))
    })
}
