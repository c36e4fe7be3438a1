//! The lifecycle API (`/v1/sandboxes...`): create, get, list, delete, pause/resume, renew,
//! metadata patch, endpoint lookup (behind [`crate::auth::require_api_key`]); `X-Request-ID`,
//! TTL expiry; a sandbox's entrypoint, its main process (when it exits, the sandbox ends).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentrun_pool::live::LiveSpec;
use agentrun_pool::{lock, PoolError};
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::require_api_key;
use crate::error::{ApiError, ApiResult, JsonBody};
use crate::execd::commands::{pump_outputs, remember, Command, ENTRYPOINT};
use crate::process::{dev_null, spawn};
use crate::{finish_span, random_token, rfc3339, Record, SandboxState, Server};

/// Longest `timeout` accepted (seconds).
const MAX_TIMEOUT_S: i64 = 86_400;

pub fn routes(server: Arc<Server>) -> Router {
    let v1 = Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(get_one).delete(delete))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/renew-expiration", post(renew))
        .route(
            "/sandboxes/{id}/metadata",
            axum::routing::patch(patch_metadata),
        )
        .route("/sandboxes/{id}/endpoints/{port}", get(endpoint))
        .route("/sandboxes/{id}/snapshots", post(unsupported_snapshot))
        .route("/metrics/events", post(metrics_event))
        .layer(axum::middleware::from_fn_with_state(
            server.clone(),
            require_api_key,
        ))
        .with_state(server);
    Router::new()
        .route(
            "/health",
            get(|| async { Json(json!({"status": "healthy"})) }),
        )
        .route(
            "/version",
            get(|| async {
                Json(json!({"version": env!("CARGO_PKG_VERSION"), "server": "agentrun"}))
            }),
        )
        .nest("/v1", v1)
}

/// Echoes `X-Request-ID`, or makes one.
pub async fn request_id(req: Request, next: Next) -> Response {
    // Without randomness the response just has no request id.
    let id = req.headers().get("x-request-id").cloned().or_else(|| {
        random_token()
            .ok()
            .and_then(|t| HeaderValue::from_str(&t).ok())
    });
    let mut resp = next.run(req).await;
    if let Some(id) = id {
        resp.headers_mut().insert("x-request-id", id);
    }
    resp
}

fn parse_json<T: for<'de> Deserialize<'de>>(body: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageSpec {
    uri: String,
    auth: Option<Value>,
}

/// A `POST /v1/sandboxes` body as sent.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateRequest {
    image: Option<ImageSpec>,
    snapshot_id: Option<String>,
    template_id: Option<String>,
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    timeout: Option<i64>,
    #[serde(default)]
    resource_limits: BTreeMap<String, String>,
    /// Scheduling hints (Kubernetes requests): accepted, the limits are what is enforced.
    #[serde(default)]
    #[allow(dead_code)]
    resource_requests: Option<BTreeMap<String, String>>,
    network_policy: Option<Value>,
    credential_proxy: Option<Value>,
    #[serde(default)]
    secure_access: bool,
    #[serde(default)]
    volumes: Vec<Value>,
    platform: Option<Value>,
    lifecycle: Option<Value>,
    extensions: Option<Value>,
}

/// `"500m"`, `"2"`, `"0.5"` -> cores.
pub fn parse_cpu(s: &str) -> Option<f64> {
    let s = s.trim();
    let v = match s.strip_suffix('m') {
        Some(m) => m.parse::<f64>().ok()? / 1000.0,
        None => s.parse::<f64>().ok()?,
    };
    (v > 0.0 && v <= 1024.0 && v.is_finite()).then_some(v)
}

/// `"512Mi"`, `"2Gi"`, `"1G"`, `"512M"`, `"1048576"` -> bytes.
pub fn parse_memory(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: u64 = n.parse().ok()?;
    let unit = unit.trim_end_matches('b');
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1000,
        "m" => 1000u64.pow(2),
        "g" => 1000u64.pow(3),
        "t" => 1000u64.pow(4),
        "ki" => 1 << 10,
        "mi" => 1 << 20,
        "gi" => 1 << 30,
        "ti" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult).filter(|v| *v > 0)
}

fn label_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn check_metadata(m: &BTreeMap<String, String>) -> ApiResult<()> {
    for (k, v) in m {
        let name = k.rsplit('/').next().unwrap_or(k);
        if k.starts_with("opensandbox.io/") {
            return Err(ApiError::bad_request(format!(
                "metadata key {k:?}: the opensandbox.io/ prefix is reserved"
            )));
        }
        if !label_ok(name) || k.len() > 253 {
            return Err(ApiError::bad_request(format!(
                "metadata key {k:?} is not a valid label key"
            )));
        }
        if !v.is_empty() && !label_ok(v) {
            return Err(ApiError::bad_request(format!(
                "metadata value {v:?} (key {k:?}) is not a valid label value"
            )));
        }
    }
    Ok(())
}

fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// What the create request asks for, validated.
pub struct Validated {
    spec: LiveSpec,
    entrypoint: Vec<String>,
    timeout: Option<i64>,
    /// `networkPolicy` (`None`: absent or null, no network at all).
    network: Option<agentrun_policy::OpenSandboxPolicy>,
}

/// A `POST /v1/sandboxes` body parsed and checked: everything about a create request that
/// needs no sandbox (the handler's first step; the `opensandbox_api` fuzz target drives it).
pub fn parse_create(body: &[u8]) -> ApiResult<(CreateRequest, Validated)> {
    let req = parse_json(body)?;
    let v = validate(&req)?;
    Ok((req, v))
}

fn validate(req: &CreateRequest) -> ApiResult<Validated> {
    let bad = |m: &str| Err(ApiError::bad_request(m.to_string()));
    if req.snapshot_id.is_some() {
        return bad("snapshotId: snapshots are not supported by agentrun");
    }
    if req.template_id.is_some() {
        return bad("templateId: templates are not supported by agentrun");
    }
    let Some(image) = &req.image else {
        return bad("image is required");
    };
    if image.uri.trim().is_empty() {
        return bad("image.uri is required");
    }
    if image.auth.as_ref().is_some_and(|a| !a.is_null()) {
        return bad("image.auth: registry credentials are not supported here; pull the image into agentrun's store first (agentrun image pull)");
    }
    let entrypoint = req.entrypoint.clone().unwrap_or_default();
    if entrypoint.is_empty() || entrypoint[0].is_empty() {
        return bad("entrypoint must have at least one element");
    }
    if req.secure_access {
        return bad("secureAccess=true is not supported: execd access is always guarded by a per-sandbox token");
    }
    if !req.volumes.is_empty() {
        return bad("volumes are not supported by agentrun's OpenSandbox API yet");
    }
    if req.lifecycle.as_ref().is_some_and(|v| !v.is_null()) {
        return bad("lifecycle hooks are not supported");
    }
    if req
        .credential_proxy
        .as_ref()
        .and_then(|c| c.get("enabled"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        return bad("credentialProxy is not supported");
    }
    if let Some(p) = req.platform.as_ref().filter(|p| !p.is_null()) {
        let os = p.get("os").and_then(Value::as_str).unwrap_or("linux");
        let arch = p.get("arch").and_then(Value::as_str).unwrap_or(host_arch());
        if os != "linux" || arch != host_arch() {
            return Err(ApiError::bad_request(format!(
                "platform {os}/{arch} is not available: this host runs linux/{}",
                host_arch()
            )));
        }
    }
    if let Some(t) = req.timeout {
        if !(1..=MAX_TIMEOUT_S).contains(&t) {
            return Err(ApiError::bad_request(format!(
                "timeout must be between 1 and {MAX_TIMEOUT_S} seconds (or null for no expiry)"
            )));
        }
    }
    check_metadata(&req.metadata)?;
    let mut cpus = None;
    let mut memory = None;
    for (k, v) in &req.resource_limits {
        match k.as_str() {
            "cpu" => {
                cpus = Some(parse_cpu(v).ok_or_else(|| {
                    ApiError::bad_request(format!("resourceLimits.cpu {v:?}: expected cores (\"2\", \"0.5\") or millicores (\"500m\")"))
                })?)
            }
            "memory" => {
                let m = parse_memory(v).ok_or_else(|| {
                    ApiError::bad_request(format!("resourceLimits.memory {v:?}: expected a size such as \"512Mi\" or \"2Gi\""))
                })?;
                if m < 4 << 20 {
                    return bad("resourceLimits.memory must be at least 4Mi");
                }
                memory = Some(m)
            }
            "gpu" if v.trim() == "0" => {}
            "gpu" => return bad("resourceLimits.gpu: GPUs are not supported"),
            other => {
                return Err(ApiError::bad_request(format!("resourceLimits.{other} is not supported (cpu, memory)")))
            }
        }
    }
    let mut spec = LiveSpec::new(image.uri.trim())
        .cpus(cpus)
        .memory_bytes(memory);
    for (k, v) in &req.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(ApiError::bad_request(format!(
                "env {k:?}: invalid variable"
            )));
        }
        spec = spec.env(k, v);
    }
    let network = match req.network_policy.as_ref().filter(|p| !p.is_null()) {
        Some(p) => Some(
            agentrun_policy::OpenSandboxPolicy::from_value(p.clone())
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
        ),
        None => None,
    };
    if network.is_some() {
        // Every process reaches the network only through the egress bridge and proxy.
        spec = spec.egress_port(Some(agentrun_egress::SANDBOX_PROXY_PORT));
        for (k, v) in agentrun_egress::proxy_env() {
            spec = spec.env(k, v);
        }
    }
    Ok(Validated {
        spec,
        entrypoint,
        timeout: req.timeout,
        network,
    })
}

/// The `Sandbox` JSON of a record.
fn sandbox_json(rec: &Record) -> Value {
    let (state, since) = rec.state();
    let (reason, message) = match &*lock(&rec.ended) {
        Some((reason, why)) => (*reason, why.clone()),
        None if state == SandboxState::Paused => {
            ("SANDBOX_PAUSED", "agentrun sandbox paused".into())
        }
        None => ("SANDBOX_RUNNING", "agentrun sandbox running".into()),
    };
    let mut v = json!({
        "id": rec.id,
        "image": {"uri": rec.image},
        "status": {
            "state": state,
            "reason": reason,
            "message": message,
            "lastTransitionAt": rfc3339(since),
        },
        "metadata": *lock(&rec.metadata),
        "entrypoint": rec.entrypoint,
        "createdAt": rfc3339(rec.created_at),
        "platform": {"os": "linux", "arch": host_arch()},
    });
    if let Some(e) = *lock(&rec.expires_at) {
        v["expiresAt"] = json!(rfc3339(e));
    }
    if let Some(x) = &rec.extensions {
        v["extensions"] = x.clone();
    }
    v
}

fn traceparent(headers: &HeaderMap) -> Option<String> {
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn create(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let (req, v) = parse_create(&body)?;
    let mut span =
        agentrun_telemetry::RunSpan::start("sandbox.create", traceparent(&headers).as_deref());
    span.set_attribute("openinference.span.kind", "TOOL");
    span.set_attribute("container.image.name", v.spec.image.as_str());
    span.set_attribute("sandbox.profile", v.spec.profile.as_str());
    let trace = span.traceparent();
    let result = create_sandbox(&server, &req, v, trace).await;
    match &result {
        Ok(rec) => {
            span.set_attribute("sandbox.id", rec.id.as_str());
            span.set_attribute("container.id", rec.id.as_str());
            span.set_attribute("sandbox.pool_hit", rec.sandbox.pool_hit());
            // The shell it runs in (its cgroup's name; a shell serves sandbox after sandbox).
            span.set_attribute("sandbox.shell_id", rec.sandbox.shell_id());
        }
        Err(e) => span.set_error(e.code, &e.message),
    }
    finish_span(span);
    let rec = result?;
    Ok((StatusCode::ACCEPTED, Json(sandbox_json(&rec))).into_response())
}

async fn create_sandbox(
    server: &Arc<Server>,
    req: &CreateRequest,
    v: Validated,
    trace: String,
) -> ApiResult<Arc<Record>> {
    // A missing image is the caller's mistake: say so before making anything.
    if let Err(e) = server.store.resolve(&v.spec.image) {
        return Err(ApiError::bad_request(format!("image.uri: {e}")));
    }
    let live = server.live.clone();
    let spec = v.spec.clone();
    let sandbox = tokio::task::spawn_blocking(move || live.create(&spec))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    // Its egress proxy listens before anything runs in it.
    let egress = match (v.network.clone(), sandbox.egress_socket()) {
        (Some(policy), Some(socket)) => {
            let started = crate::egress::SandboxEgress::start(
                sandbox.id(),
                socket,
                policy,
                server.audit.clone(),
                trace,
            );
            match started {
                Ok(e) => Some(e),
                Err(e) => {
                    let live = server.live.clone();
                    let id = sandbox.id().to_owned();
                    let _ = tokio::task::spawn_blocking(move || live.delete(&id)).await;
                    return Err(ApiError::internal(e.to_string()));
                }
            }
        }
        _ => None,
    };
    let now = Utc::now();
    let rec = Arc::new(Record {
        id: sandbox.id().to_owned(),
        sandbox: sandbox.clone(),
        execd_token: random_token()?,
        egress_token: random_token()?,
        image: v.spec.image.clone(),
        entrypoint: v.entrypoint.clone(),
        shell: std::sync::OnceLock::new(),
        created_at: now,
        expires_at: Mutex::new(v.timeout.map(|t| now + chrono::Duration::seconds(t))),
        metadata: Mutex::new(req.metadata.clone()),
        network_policy: req.network_policy.clone().filter(|p| !p.is_null()),
        egress,
        extensions: req.extensions.clone().filter(|p| !p.is_null()),
        state: Mutex::new((SandboxState::Running, now)),
        ended: Mutex::new(None),
        netns: Default::default(),
        torn_down: Default::default(),
        commands: Mutex::new(Default::default()),
        log_budget: Default::default(),
        finished_commands: Default::default(),
        sessions: Mutex::new(Default::default()),
        code: Mutex::new(Default::default()),
        cpu_sample: Mutex::new((Instant::now(), 0)),
    });
    // The entrypoint is the sandbox's main process.
    if let Err(e) = start_entrypoint(server, &rec).await {
        let live = server.live.clone();
        let id = rec.id.clone();
        let rec2 = rec.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(e) = &rec2.egress {
                e.stop();
            }
            live.delete(&id)
        })
        .await;
        return Err(e);
    }
    server.insert(rec.clone());
    Ok(rec)
}

/// The sandbox's main process: the create request's entrypoint, a command of the sandbox
/// (its output kept as the sandbox's log, last lines only). When it exits, the sandbox ends
/// ([`Record::entrypoint_exited`]).
async fn start_entrypoint(server: &Arc<Server>, rec: &Arc<Record>) -> ApiResult<()> {
    let argv = rec.entrypoint.clone();
    let p = match spawn(rec, argv, Vec::new(), "/".into(), dev_null()?).await {
        Ok(p) => p,
        Err(PoolError::Spawn { message, .. }) => {
            return Err(ApiError::bad_request(format!("entrypoint: {message}")))
        }
        Err(e) => return Err(e.into()),
    };
    let cmd = Arc::new(Command::running(
        rec,
        ENTRYPOINT.into(),
        rec.entrypoint.join(" "),
        p.id,
    ));
    remember(rec, &cmd);
    let (exited, _) = pump_outputs(server, rec, &cmd, p.stdout, p.stderr, None);
    let (live, rec, exit) = (server.live.clone(), rec.clone(), p.exit);
    tokio::spawn(async move {
        let e = exit.await.unwrap_or_default();
        let _ = exited.send(true);
        cmd.finish(&rec, e.exit_code, String::new());
        rec.entrypoint_exited(&live, e.exit_code);
    });
    Ok(())
}

async fn get_one(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let rec = server.record(&id)?;
    Ok(Json(sandbox_json(&rec)))
}

/// Parses `a=1&a=2&b=3` into pairs.
fn query_pairs(q: &Option<String>) -> Vec<(String, String)> {
    q.as_deref()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

async fn list(State(server): State<Arc<Server>>, RawQuery(q): RawQuery) -> ApiResult<Json<Value>> {
    let pairs = query_pairs(&q);
    let mut states: Vec<String> = Vec::new();
    let mut meta: Vec<(String, String)> = Vec::new();
    let mut page = 1usize;
    let mut page_size = 20usize;
    for (k, v) in &pairs {
        match k.as_str() {
            "state" => states.extend(
                v.split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .filter(|s| !s.is_empty()),
            ),
            "metadata" => meta.extend(form_urlencoded::parse(v.as_bytes()).into_owned()),
            "page" => {
                page = v
                    .parse()
                    .ok()
                    .filter(|p| *p >= 1)
                    .ok_or_else(|| ApiError::bad_request("page must be >= 1"))?
            }
            "pageSize" | "page_size" => {
                page_size = v
                    .parse()
                    .ok()
                    .filter(|p| (1..=200).contains(p))
                    .ok_or_else(|| ApiError::bad_request("pageSize must be between 1 and 200"))?
            }
            _ => {}
        }
    }
    let matching: Vec<Value> = server
        .all()
        .iter()
        .filter(|r| {
            states.is_empty() || states.contains(&r.state().0.as_str().to_ascii_lowercase())
        })
        .filter(|r| {
            let m = lock(&r.metadata);
            meta.iter().all(|(k, v)| m.get(k) == Some(v))
        })
        .map(|r| sandbox_json(r))
        .collect();
    let total = matching.len();
    let pages = total.div_ceil(page_size);
    let items: Vec<Value> = matching
        .into_iter()
        .skip((page - 1) * page_size)
        .take(page_size)
        .collect();
    Ok(Json(json!({
        "items": items,
        "pagination": {
            "page": page,
            "pageSize": page_size,
            "totalItems": total,
            "totalPages": pages,
            "hasNextPage": page < pages,
        }
    })))
}

/// Deletes a sandbox: gone from the API and every process killed before this returns; its
/// teardown finishes in the background.
pub async fn delete_sandbox(server: &Arc<Server>, id: &str) -> ApiResult<()> {
    let rec = server
        .remove(id)
        .ok_or_else(|| ApiError::not_found("SANDBOX::NOT_FOUND", format!("no sandbox {id}")))?;
    rec.set_state(SandboxState::Terminated);
    // Every process dies now; the teardown (mounts, cgroups, state) finishes off the request.
    rec.tear_down(&server.live);
    Ok(())
}

async fn delete(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    delete_sandbox(&server, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn pause(State(server): State<Arc<Server>>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    let rec = server.record(&id)?;
    rec.check_running()?;
    if rec.state().0 == SandboxState::Paused {
        return Err(ApiError::conflict(format!(
            "sandbox {id} is already paused"
        )));
    }
    rec.sandbox.pause()?;
    rec.set_state(SandboxState::Paused);
    Ok(StatusCode::ACCEPTED)
}

async fn resume(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let rec = server.record(&id)?;
    if rec.state().0 != SandboxState::Paused {
        return Err(ApiError::conflict(format!("sandbox {id} is not paused")));
    }
    rec.sandbox.resume()?;
    rec.set_state(SandboxState::Running);
    Ok(StatusCode::ACCEPTED)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RenewRequest {
    expires_at: String,
}

/// A renew body's `expiresAt`, checked against `now` (in the future, at most
/// `MAX_TIMEOUT_S` away).
pub fn parse_renew(body: &[u8], now: DateTime<Utc>) -> ApiResult<DateTime<Utc>> {
    let req: RenewRequest = parse_json(body)?;
    let t: DateTime<Utc> = DateTime::parse_from_rfc3339(&req.expires_at)
        .map_err(|e| ApiError::bad_request(format!("expiresAt {:?}: {e}", req.expires_at)))?
        .with_timezone(&Utc);
    if t <= now {
        return Err(ApiError::bad_request("expiresAt must be in the future"));
    }
    if t > now + chrono::Duration::seconds(MAX_TIMEOUT_S) {
        return Err(ApiError::bad_request(format!(
            "expiresAt may be at most {MAX_TIMEOUT_S} s from now"
        )));
    }
    Ok(t)
}

async fn renew(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<Value>> {
    let rec = server.record(&id)?;
    let t = parse_renew(&body, Utc::now())?;
    *lock(&rec.expires_at) = Some(t);
    Ok(Json(json!({"expiresAt": rfc3339(t)})))
}

/// `metadata` after a `PATCH .../metadata` body (a value of `null` removes its key), checked.
pub fn patch_metadata_body(
    mut metadata: BTreeMap<String, String>,
    body: &[u8],
) -> ApiResult<BTreeMap<String, String>> {
    let patch: BTreeMap<String, Option<String>> = parse_json(body)?;
    for (k, v) in patch {
        match v {
            Some(v) => {
                metadata.insert(k, v);
            }
            None => {
                metadata.remove(&k);
            }
        }
    }
    check_metadata(&metadata)?;
    Ok(metadata)
}

async fn patch_metadata(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<Value>> {
    let rec = server.record(&id)?;
    let current = lock(&rec.metadata).clone();
    let next = patch_metadata_body(current, &body)?;
    *lock(&rec.metadata) = next;
    Ok(Json(sandbox_json(&rec)))
}

async fn endpoint(
    State(server): State<Arc<Server>>,
    Path((id, port)): Path<(String, u16)>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let rec = server.record(&id)?;
    // The address the client reached us by is the one it can reach execd by.
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| server.listen.to_string());
    match port {
        crate::EXECD_PORT => Ok(Json(json!({
            "endpoint": format!("{host}/execd/{id}"),
            "headers": {crate::EXECD_TOKEN_HEADER: rec.execd_token},
        }))),
        crate::EGRESS_PORT => Ok(Json(json!({
            "endpoint": format!("{host}/egress/{id}"),
            "headers": {crate::EGRESS_TOKEN_HEADER: rec.egress_token},
        }))),
        // Any other port: execd's proxy to 127.0.0.1:port inside the sandbox.
        p => Ok(Json(json!({
            "endpoint": format!("{host}/execd/{id}/proxy/{p}"),
            "headers": {crate::EXECD_TOKEN_HEADER: rec.execd_token},
        }))),
    }
}

async fn unsupported_snapshot() -> ApiError {
    ApiError::not_supported("snapshots are not supported by agentrun")
}

async fn metrics_event(_body: Body) -> StatusCode {
    StatusCode::NO_CONTENT
}

/// Deletes sandboxes whose `expiresAt` has passed.
pub async fn expiry_loop(server: Arc<Server>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let now = Utc::now();
        let due: Vec<String> = server
            .all()
            .iter()
            .filter(|r| lock(&r.expires_at).is_some_and(|e| e <= now))
            .map(|r| r.id.clone())
            .collect();
        for id in due {
            // Ended by its timeout: its shell is not reused (as a run's after a timeout).
            if let Ok(rec) = server.record(&id) {
                rec.sandbox.taint("timeout");
            }
            if let Err(e) = delete_sandbox(&server, &id).await {
                tracing::warn!(target: "agentrun::opensandbox::lifecycle", sandbox = %id, "expiring the sandbox: {}", e.message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_units() {
        assert_eq!(parse_cpu("500m"), Some(0.5));
        assert_eq!(parse_cpu("2"), Some(2.0));
        assert_eq!(parse_cpu("0.25"), Some(0.25));
        assert_eq!(parse_cpu("0"), None);
        assert_eq!(parse_cpu("x"), None);
        assert_eq!(parse_memory("512Mi"), Some(512 << 20));
        assert_eq!(parse_memory("2Gi"), Some(2 << 30));
        assert_eq!(parse_memory("1G"), Some(1_000_000_000));
        assert_eq!(parse_memory("512M"), Some(512_000_000));
        assert_eq!(parse_memory("1048576"), Some(1 << 20));
        assert_eq!(parse_memory("1gib"), Some(1 << 30));
        assert_eq!(parse_memory("lots"), None);
    }

    #[test]
    fn metadata_rules() {
        let m = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(check_metadata(&m("project", "demo")).is_ok());
        assert!(check_metadata(&m("opensandbox.io/x", "y")).is_err());
        assert!(check_metadata(&m("bad key", "y")).is_err());
        assert!(check_metadata(&m("k", "-bad")).is_err());
    }
}
