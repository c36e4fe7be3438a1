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
//! `enforcementMode` is `proxy`.
//!
//! `/credential-vault` serves the sandbox's credential vault ([`agentrun_egress::Vault`]):
//! `POST` creates it (201), `GET` shows it sanitized, `PATCH` changes it atomically
//! (`expectedRevision` guards it: 409; the revision check, the 412 check, the audit record
//! and the swap are one step under the vault's lock, so an audited change is the change
//! made), `DELETE` removes it (204); `GET
//! /credential-vault/credentials[/{name}]` and `/bindings[/{name}]` list and show metadata.
//! No answer, error, log line, span or audit record holds a credential's value. A body that
//! does not parse is refused with the position and kind of the error, never serde's text
//! (which can quote the input). `https` bindings need `credentialProxy.enabled` at create
//! (the proxy then intercepts TLS to the bound hosts, with a CA made for the sandbox whose
//! certificate is in the sandbox's trust stores: see [`agentrun_egress::mitm`]); without it
//! a vault with an `https` binding is refused with 412, as upstream's sidecar refuses one
//! when its credential proxy is not ready. Each request a credential is added to is a
//! `policy.check` span and an audit record (rule `credentialVault.bindings[NAME]`).
//! A change replaces the proxy's policy at once (the next connection is decided by it, and
//! open connections it denies are cut) and is audited. A sandbox created without a
//! `networkPolicy` has no network at all (loopback only) and no proxy; its policy cannot be
//! changed (409).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agentrun_egress::vault::{VaultCreate, VaultMutation, VaultState};
use agentrun_egress::{
    DecisionSink, Failure, FailureSink, InjectionSink, Interceptor, Proxy, Vault, VaultError,
};
use agentrun_policy::{Action, Decision, NetworkPolicyError, OpenSandboxPolicy, OpenSandboxRule};
use agentrun_pool::lock;
use agentrun_telemetry::decision::{EGRESS_CONNECT, POLICY_CHECK};
use agentrun_telemetry::{trace_id_of, AuditLog, AuditRecord, DecisionScope, RunSpan};
use axum::body::Bytes;
use axum::extract::Path as UrlPath;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::auth::EgressSandbox;
use crate::error::{ApiError, ApiResult, JsonBody};
pub use crate::held::SandboxEgress;
use crate::params::segment;
use crate::{Record, Server};

/// The profile name decisions are recorded under.
const PROFILE: &str = "opensandbox.networkPolicy";

impl SandboxEgress {
    /// Starts the proxy of sandbox `id` on `socket` (the sandbox's egress socket).
    /// With `credential_proxy`, a CA is made for the sandbox (upstream certificates
    /// verified against the system's roots and `upstream_roots`) and its certificate written
    /// next to the socket, where the sandbox's trust environment points.
    pub fn start(
        id: &str,
        socket: &Path,
        policy: OpenSandboxPolicy,
        audit: AuditLog,
        trace: String,
        credential_proxy: bool,
        upstream_roots: &[PathBuf],
    ) -> Result<Self, agentrun_egress::EgressError> {
        let listener = agentrun_egress::bind(socket)?;
        let vault = Vault::new();
        let sink = decision_sink(id.to_owned(), audit.clone(), trace.clone());
        let failures = failure_sink(id.to_owned(), audit.clone(), trace.clone());
        // No approver: the OpenSandbox API has no person to ask, and a `networkPolicy` cannot
        // say escalate (never deserialized); an escalate decision would be denied "needs
        // approval". A front end with someone to ask gives the builder an `approver`.
        let mut builder = Proxy::builder(policy.to_network_policy(), sink)
            .failures(failures)
            .injections(injection_sink(id.to_owned(), audit.clone(), trace.clone()));
        if credential_proxy {
            let interceptor = Interceptor::new(id, upstream_roots)?;
            if let Some(dir) = socket.parent() {
                interceptor.write_trust(dir)?;
            }
            builder = builder.intercept(Arc::new(interceptor), vault.clone());
        } else {
            builder = builder.intercept_plain(vault.clone());
        }
        let proxy = builder.start(listener, socket);
        Ok(SandboxEgress {
            sandbox_id: id.to_owned(),
            policy: Mutex::new(policy),
            proxy: Mutex::new(Some(proxy)),
            audit,
            trace,
            vault,
            credential_proxy,
        })
    }

    /// The policy in force.
    pub fn policy(&self) -> OpenSandboxPolicy {
        lock(&self.policy).clone()
    }

    /// Replaces the whole policy and puts it in force at once (audited as
    /// `net.policy.replace`): the E2B API's `PUT /sandboxes/{id}/network`.
    pub fn replace(&self, next: OpenSandboxPolicy) -> ApiResult<OpenSandboxPolicy> {
        let resource = next.to_value().to_string();
        self.change("net.policy.replace", resource, |policy| {
            *policy = next;
            Ok(true)
        })
        .map(|(p, _)| p)
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
        // A change nobody can later account for is not made.
        let reason = next.to_value().to_string();
        self.audit_change("policy", action, resource, reason)?;
        if let Some(p) = lock(&self.proxy).as_ref() {
            p.set_policy(next.to_network_policy());
        }
        *current = next.clone();
        Ok((next, true))
    }

    /// Audits a vault change (`action`; `reason`: the sanitized state after it). A change
    /// that cannot be audited is refused before it is made (see [`Self::vault_change`]).
    fn audit_vault(&self, action: &str, resource: String, reason: String) -> ApiResult<()> {
        self.audit_change("credential-vault", action, resource, reason)
    }

    /// Appends the audit record of an applied change of the sandbox's `kind` (`policy`,
    /// `credential-vault`): `resource` what was asked, `reason` the state after it.
    fn audit_change(
        &self,
        kind: &str,
        action: &str,
        resource: String,
        reason: String,
    ) -> ApiResult<()> {
        let record = AuditRecord {
            kind: kind.into(),
            sandbox_id: self.sandbox_id.clone(),
            trace_id: trace_id_of(&self.trace),
            action: action.into(),
            resource,
            decision: "applied".into(),
            reason,
            profile: PROFILE.into(),
            ..Default::default()
        };
        self.audit
            .append(&record)
            .map_err(|e| ApiError::internal(e.to_string()))
    }

    /// Whether its proxy intercepts TLS (`credentialProxy.enabled`).
    pub fn credential_proxy(&self) -> bool {
        self.credential_proxy
    }

    /// `https` bindings need the credential proxy (412 otherwise).
    fn check_https(&self, state: &VaultState) -> ApiResult<()> {
        if self.credential_proxy {
            return Ok(());
        }
        match state
            .bindings
            .iter()
            .find(|b| b.match_.schemes.iter().any(|s| s == "https"))
        {
            Some(b) => Err(ApiError::new(
                StatusCode::PRECONDITION_FAILED,
                "CREDENTIAL_VAULT::PROXY_NOT_READY",
                format!(
                    "binding {:?} matches https, which needs the sandbox created with credentialProxy.enabled",
                    b.name
                ),
            )),
            None => Ok(()),
        }
    }

    /// Stops the proxy (before the sandbox's state dir goes away).
    pub fn stop(&self) {
        if let Some(p) = lock(&self.proxy).take() {
            p.stop();
        }
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

/// Traces and audits each request sandbox `id`'s proxy added a credential to: a
/// `policy.check` span and an audit record naming the binding (never the value).
fn injection_sink(id: String, audit: AuditLog, trace: String) -> InjectionSink {
    let trace_id = trace_id_of(&trace);
    Arc::new(
        move |action: &Action, method: &str, path: &str, binding: &str| {
            let d = Decision::allow(
                format!("credentialVault.bindings[{binding}]"),
                format!("credential injected: {method} {path}"),
            );
            let mut span = RunSpan::start(POLICY_CHECK, Some(&trace));
            let record = scope(&id, &trace_id).decision(&mut span, action, &d, "egress-proxy");
            let recorded = append(&audit, &id, &record);
            span.finish_detached("egress-span");
            recorded
        },
    )
}

/// The egress sidecar's API of one sandbox, served under `/egress/{sid}`.
pub fn routes(server: Arc<Server>) -> Router {
    let mut r = Router::new()
        .route(
            "/policy",
            get(get_policy)
                .patch(patch_policy)
                .delete(delete_policy)
                .post(replace_policy)
                .put(replace_policy),
        )
        .route(
            "/credential-vault",
            get(vault_get)
                .post(vault_create)
                .patch(vault_patch)
                .delete(vault_delete),
        );
    for list in [VaultList::Credentials, VaultList::Bindings] {
        let path = format!("/credential-vault/{}", list.names().0);
        r = r.route(&path, get(move |sb| vault_list(sb, list))).route(
            &format!("{path}/{{name}}"),
            get(move |sb, name| vault_entry(sb, name, list)),
        );
    }
    r.with_state(server)
}

impl From<VaultError> for ApiError {
    fn from(e: VaultError) -> Self {
        vault_error(e)
    }
}

/// A vault error as the API answers it (its message names no secret).
fn vault_error(e: VaultError) -> ApiError {
    match e.status {
        404 => ApiError::not_found("CREDENTIAL_VAULT::NOT_FOUND", e.message),
        409 => ApiError::new(
            StatusCode::CONFLICT,
            "CREDENTIAL_VAULT::CONFLICT",
            e.message,
        ),
        _ => ApiError::bad_request(e.message),
    }
}

/// A vault request body parsed as `T`. The error says where and what kind (never serde's
/// text, which may quote a value).
fn parse_vault<T: serde::de::DeserializeOwned>(body: &Bytes, expected: &str) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| {
        let kind = match e.classify() {
            serde_json::error::Category::Io => "unreadable",
            serde_json::error::Category::Syntax => "not JSON",
            serde_json::error::Category::Data => "a field is missing, unknown or of the wrong type",
            serde_json::error::Category::Eof => "it ends early",
        };
        ApiError::bad_request(format!(
            "invalid request body: expected {expected}: {kind} (line {}, column {})",
            e.line(),
            e.column()
        ))
    })
}

fn vault_of(rec: &Record) -> ApiResult<&SandboxEgress> {
    rec.egress.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "CREDENTIAL_VAULT::PROXY_NOT_READY",
            format!(
                "sandbox {} was created without a networkPolicy: it has no egress proxy to inject credentials",
                rec.id
            ),
        )
    })
}

/// `POST /credential-vault`: 201 with the sanitized state.
async fn vault_create(
    EgressSandbox(rec): EgressSandbox,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<VaultState>)> {
    let req: VaultCreate = parse_vault(&body, "{\"credentials\": [...], \"bindings\": [...]}")?;
    let egress = vault_of(&rec)?;
    let state = tokio::task::block_in_place(|| egress.vault_create(req))?;
    Ok((StatusCode::CREATED, Json(state)))
}

impl SandboxEgress {
    /// Creates the vault: nothing is made unless it is valid, allowed (412: an `https`
    /// binding without the credential proxy) and audited, in one step under the vault's
    /// lock (blocking: the audit record is synced).
    pub fn vault_create(&self, req: VaultCreate) -> ApiResult<VaultState> {
        self.vault.create_approved(req, "inline", |state| {
            self.check_https(state)?;
            self.audit_vault(
                "credential_vault.create",
                names(state),
                serde_json::to_string(state).unwrap_or_default(),
            )
        })
    }

    /// Changes the vault, all or nothing: the revision check (409), the https check (412),
    /// the audit record and the swap are one step under the vault's lock, so a change that
    /// is audited is the change made, and of two changes expecting one revision exactly
    /// one is made (blocking: the audit record is synced).
    pub fn vault_patch(&self, m: VaultMutation) -> ApiResult<VaultState> {
        self.vault.mutate_approved(m, |state| {
            self.check_https(state)?;
            self.audit_vault(
                "credential_vault.patch",
                names(state),
                serde_json::to_string(state).unwrap_or_default(),
            )
        })
    }

    /// Deletes the vault once the deletion is audited (404 when there is none).
    pub fn vault_delete(&self) -> ApiResult<()> {
        self.vault.delete_approved(|| {
            self.audit_vault("credential_vault.delete", String::new(), String::new())
        })
    }
}

/// The names a state holds, as an audit record's resource.
fn names(state: &VaultState) -> String {
    let creds: Vec<&str> = state.credentials.iter().map(|c| c.name.as_str()).collect();
    let binds: Vec<&str> = state.bindings.iter().map(|b| b.name.as_str()).collect();
    format!(
        "credentials={} bindings={}",
        creds.join(","),
        binds.join(",")
    )
}

async fn vault_get(EgressSandbox(rec): EgressSandbox) -> ApiResult<Json<VaultState>> {
    let egress = vault_of(&rec)?;
    Ok(Json(egress.vault.state().map_err(vault_error)?))
}

/// `PATCH /credential-vault`: all or nothing, the next revision.
async fn vault_patch(
    EgressSandbox(rec): EgressSandbox,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<VaultState>> {
    let m: VaultMutation = parse_vault(
        &body,
        "{\"expectedRevision\", \"credentials\": {add, replace, delete}, \"bindings\": {...}}",
    )?;
    let egress = vault_of(&rec)?;
    Ok(Json(tokio::task::block_in_place(|| egress.vault_patch(m))?))
}

/// `DELETE /credential-vault`: 204.
async fn vault_delete(EgressSandbox(rec): EgressSandbox) -> ApiResult<StatusCode> {
    let egress = vault_of(&rec)?;
    tokio::task::block_in_place(|| egress.vault_delete())?;
    Ok(StatusCode::NO_CONTENT)
}

/// The two lists of a vault the API also shows on their own, each entry keyed by its `name`.
#[derive(Clone, Copy)]
enum VaultList {
    Credentials,
    Bindings,
}

impl VaultList {
    /// Its key in the vault's JSON, and what one entry is called.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            VaultList::Credentials => ("credentials", "credential"),
            VaultList::Bindings => ("bindings", "binding"),
        }
    }

    /// Its entries in `s`: name and JSON.
    fn entries(self, s: &VaultState) -> Vec<(&str, Value)> {
        match self {
            VaultList::Credentials => s
                .credentials
                .iter()
                .map(|c| (c.name.as_str(), json!(c)))
                .collect(),
            VaultList::Bindings => s
                .bindings
                .iter()
                .map(|b| (b.name.as_str(), json!(b)))
                .collect(),
        }
    }
}

/// `GET /credential-vault/credentials` or `/bindings`: that list, with the vault's revision.
async fn vault_list(EgressSandbox(rec): EgressSandbox, list: VaultList) -> ApiResult<Json<Value>> {
    let s = vault_of(&rec)?.vault.state().map_err(vault_error)?;
    let entries: Vec<Value> = list.entries(&s).into_iter().map(|(_, v)| v).collect();
    Ok(Json(
        json!({"revision": s.revision, (list.names().0): entries}),
    ))
}

/// `GET /credential-vault/credentials/{name}` or `/bindings/{name}`: that entry (404 when the
/// list has none of that name).
async fn vault_entry(
    EgressSandbox(rec): EgressSandbox,
    UrlPath(p): UrlPath<HashMap<String, String>>,
    list: VaultList,
) -> ApiResult<Json<Value>> {
    let s = vault_of(&rec)?.vault.state().map_err(vault_error)?;
    let name = segment(&p, "name");
    let entry = list.entries(&s).into_iter().find(|(n, _)| *n == name);
    entry.map(|(_, v)| Json(v)).ok_or_else(|| {
        let what = list.names().1;
        ApiError::not_found("CREDENTIAL_VAULT::NOT_FOUND", format!("no {what} {name:?}"))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox egress without the credential proxy (https bindings: 412), its audit log in
    /// a directory of its own, and a vault with one plain-HTTP binding (revision 1).
    fn egress(tag: &str) -> (SandboxEgress, AuditLog, PathBuf) {
        let dir = std::env::temp_dir().join(format!("agentrun-vault-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let audit = AuditLog::new(dir.join("audit"));
        let policy =
            OpenSandboxPolicy::from_value(json!({"defaultAction": "deny", "egress": []})).unwrap();
        let e = SandboxEgress::start(
            "sbx",
            &dir.join("proxy.sock"),
            policy,
            audit.clone(),
            String::new(),
            false,
            &[],
        )
        .unwrap();
        let create: VaultCreate = serde_json::from_value(json!({
            "credentials": [{"name": "k", "source": {"type": "inline", "value": "v0"}}],
            "bindings": [{"name": "b", "match": {"schemes": ["http"], "ports": [80],
                          "hosts": ["h.example"]}, "auth": {"type": "bearer", "credential": "k"}}]
        }))
        .unwrap();
        e.vault_create(create).unwrap();
        (e, audit, dir)
    }

    fn audited(audit: &AuditLog, action: &str) -> usize {
        audit
            .read_all()
            .unwrap()
            .iter()
            .filter(|r| r.action == action)
            .count()
    }

    /// Concurrent PATCHes all expecting revision 1: exactly one is made and audited, every
    /// other is a 409 and leaves no audit record (an audited change is the change made).
    #[test]
    fn concurrent_patches_expecting_one_revision_make_and_audit_exactly_one() {
        let (e, audit, dir) = egress("race");
        let n = 8;
        let barrier = std::sync::Barrier::new(n);
        let results: Vec<ApiResult<VaultState>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let (e, barrier) = (&e, &barrier);
                    s.spawn(move || {
                        let m: VaultMutation = serde_json::from_value(json!({
                            "expectedRevision": 1,
                            "credentials": {"replace": [{"name": "k", "source": {"value": format!("v{}", i + 1)}}]}
                        }))
                        .unwrap();
                        barrier.wait();
                        e.vault_patch(m)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let made: Vec<&VaultState> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(made.len(), 1, "{results:?}");
        assert_eq!(made[0].revision, 2);
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            assert_eq!(r.status, StatusCode::CONFLICT, "{r}");
        }
        assert_eq!(
            audited(&audit, "credential_vault.patch"),
            1,
            "audited changes that were not made"
        );
        assert_eq!(e.vault.state().unwrap().revision, 2);
        e.stop();
        let _ = std::fs::remove_dir_all(dir);
    }

    /// An https binding without the credential proxy: 412, not made, not audited.
    #[test]
    fn an_https_binding_without_the_proxy_is_412_and_not_audited() {
        let (e, audit, dir) = egress("412");
        let m: VaultMutation = serde_json::from_value(json!({
            "bindings": {"add": [{"name": "s", "match": {"hosts": ["h.example"]},
                                  "auth": {"type": "bearer", "credential": "k"}}]}
        }))
        .unwrap();
        let err = e.vault_patch(m).unwrap_err();
        assert_eq!(err.status, StatusCode::PRECONDITION_FAILED, "{err}");
        assert_eq!(audited(&audit, "credential_vault.patch"), 0);
        assert_eq!(e.vault.state().unwrap().revision, 1);
        e.vault_delete().unwrap();
        assert_eq!(audited(&audit, "credential_vault.delete"), 1);
        assert_eq!(e.vault_delete().unwrap_err().status, StatusCode::NOT_FOUND);
        e.stop();
        let _ = std::fs::remove_dir_all(dir);
    }
}
