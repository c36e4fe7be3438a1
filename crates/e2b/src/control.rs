//! The control plane (the REST API of `E2B_API_URL`, behind `X-API-Key`): create a sandbox
//! from a template or a snapshot (`POST /v2/sandboxes`, `POST /sandboxes`), list them with
//! metadata and state filters and `nextToken` pagination (`GET /v2/sandboxes`, `GET
//! /sandboxes`), get one, kill it, set its timeout, pause it (its processes frozen, or its
//! files kept on disk with `memory: false`) and connect to it (resuming a paused one).
//! Snapshots and fork are [`crate::snapshots`], metrics [`crate::metrics`]. What the SDK may
//! call and agentrun does not serve answers 501 naming it (logs, templates, secrets,
//! volumes).
//!
//! A template is an image of agentrun's store: `base` and `code-interpreter-v1` (E2B's
//! default templates) are the built-in `host` image (the host's `/usr`, so bash and python3),
//! any other name is the image of that name. A sandbox is made by the OpenSandbox front end's
//! create ([`agentrun_opensandbox::lifecycle::create_from_body`]), its main process a
//! `sleep infinity`; its metadata is kept as given (E2B's is free-form, not labels).

use std::collections::BTreeMap;
use std::sync::Arc;

use agentrun_opensandbox::{lifecycle, rfc3339, Record, SandboxState, Server};
use agentrun_pool::lock;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{json_body, json_body_or_default, E2bError, E2bResult};
use crate::paging::{page_limit, page_start, DEFAULT_LIMIT};
pub use crate::record::MAX_TIMEOUT_S;
use crate::record::{created_json, end_of, record, set_end, template_of, TEMPLATE_KEY};

/// A sandbox's timeout when create names none (E2B's default).
pub const DEFAULT_TIMEOUT_S: i64 = 300;
/// Most metadata entries, and longest key and value.
const MAX_METADATA: usize = 64;
const MAX_METADATA_KEY: usize = 256;
const MAX_METADATA_VALUE: usize = 1024;
pub fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(get_one).delete(kill))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(connect))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/refreshes", any(not_served_refresh))
        .route(
            "/sandboxes/{id}/snapshots",
            post(crate::snapshots::create_snapshot),
        )
        .route("/snapshots", get(crate::snapshots::list_snapshots))
        .route("/sandboxes/{id}/fork", post(crate::snapshots::fork))
        .route("/sandboxes/{id}/metrics", get(crate::metrics::one))
        .route("/sandboxes/metrics", get(crate::metrics::many))
        .route("/sandboxes/{id}/logs", any(not_served_logs))
        .route("/v2/sandboxes/{id}/logs", any(not_served_logs))
        .route(
            "/sandboxes/{id}/network",
            axum::routing::put(update_network),
        )
        .route("/templates", any(not_served_templates))
        .route("/templates/{*rest}", any(templates))
        .route("/v2/templates", any(not_served_templates))
        .route("/v2/templates/{*rest}", any(not_served_templates))
        .route("/v3/templates", any(not_served_templates))
        .route("/v3/templates/{*rest}", any(not_served_templates))
        .route("/default-templates", any(not_served_templates))
        .route("/secrets", any(not_served_secrets))
        .route("/secrets/{*rest}", any(not_served_secrets))
        .route("/volumes", any(not_served_volumes))
        .route("/volumes/{*rest}", any(not_served_volumes))
        .layer(axum::middleware::from_fn_with_state(
            server.clone(),
            crate::auth::require_api_key,
        ))
        .with_state(server)
}

/// Whether `template` names one of E2B's own templates (`base`, the code interpreter's).
pub fn is_e2b_template(template: &str) -> bool {
    matches!(
        template,
        "base" | "code-interpreter-v1" | "code-interpreter"
    )
}

/// The image of a template: E2B's own templates are the `host` image.
pub fn template_image(template: &str) -> &str {
    if is_e2b_template(template) {
        "host"
    } else {
        template
    }
}

/// The home directory of E2B's templates (their user `user`'s), which the frameworks' E2B
/// integrations use as their working directory (langchain-e2b's default `cwd`, ...). A
/// sandbox of one of E2B's templates has it (empty, made at create: the `host` image has no
/// `/home/user`); commands still run as root, in `/root` by default.
pub const TEMPLATE_HOME: &str = "/home/user";

/// Makes [`TEMPLATE_HOME`] in a new sandbox of one of E2B's templates.
async fn make_template_home(rec: &Arc<agentrun_opensandbox::Record>) -> E2bResult<()> {
    let dir = agentrun_opensandbox::files::rel(TEMPLATE_HOME)?;
    agentrun_opensandbox::files::with_fs(rec, move |fs| {
        fs.mkdir_p(&dir, 0o755)
            .map_err(|e| agentrun_opensandbox::files::errno(e, TEMPLATE_HOME))
    })
    .await?;
    Ok(())
}

/// A `POST /v2/sandboxes` body as sent (what is not listed is ignored, as E2B ignores fields
/// it does not know).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<i64>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    env_vars: BTreeMap<String, String>,
    #[serde(default)]
    auto_pause: bool,
    auto_pause_memory: Option<bool>,
    auto_resume: Option<AutoResume>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<Value>,
    mcp: Option<Value>,
    #[serde(default)]
    volume_mounts: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AutoResume {
    enabled: bool,
}

/// A create body, checked: what it asks for as the OpenSandbox front end's create body, its
/// template and its metadata.
pub fn parse_create(body: &[u8]) -> E2bResult<(Vec<u8>, String, BTreeMap<String, String>)> {
    let req: NewSandbox = json_body(body)?;
    let template = req.template_id.trim().to_owned();
    if template.is_empty() {
        return Err(E2bError::bad_request("templateID is required"));
    }
    let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(1..=MAX_TIMEOUT_S).contains(&timeout) {
        return Err(E2bError::bad_request(format!(
            "timeout must be between 1 and {MAX_TIMEOUT_S} seconds"
        )));
    }
    check_metadata(&req.metadata)?;
    let auto_resume = req.auto_resume.as_ref().is_some_and(|a| a.enabled);
    if auto_resume && !req.auto_pause {
        return Err(E2bError::bad_request(
            "autoResume needs autoPause (lifecycle on_timeout \"pause\")",
        ));
    }
    let lifecycle = req.auto_pause.then(|| crate::autopause::Lifecycle {
        memory: req.auto_pause_memory.unwrap_or(true),
        auto_resume,
        timeout_s: timeout,
    });
    let network_policy = network_policy(req.allow_internet_access, req.network.as_ref())?;
    if req.mcp.as_ref().is_some_and(|m| !m.is_null()) {
        return Err(E2bError::bad_request(
            "mcp is not served by agentrun's E2B API (agentrun serve --mcp serves MCP itself)",
        ));
    }
    if !req.volume_mounts.is_empty() {
        return Err(E2bError::bad_request(
            "volumeMounts are not served by agentrun's E2B API",
        ));
    }
    let mut osb = json!({
        "entrypoint": ["sleep", "infinity"],
        "env": req.env_vars,
        "timeout": timeout,
        "extensions": {TEMPLATE_KEY: template},
    });
    // Paused at its end, not killed: no OpenSandbox expiry (its end is kept by autopause).
    if let Some(l) = lifecycle {
        osb["timeout"] = Value::Null;
        osb["extensions"][crate::autopause::LIFECYCLE_KEY] = l.to_value();
    }
    if let Some(p) = network_policy {
        osb["networkPolicy"] = p;
    }
    // `Sandbox.create(snapshot_id)`: made from this API key's snapshot (404 for another's).
    if crate::snapshots::is_snapshot_id(&template) {
        osb["snapshotId"] = json!(template);
    } else {
        osb["image"] = json!({"uri": template_image(&template)});
    }
    Ok((osb.to_string().into_bytes(), template, req.metadata))
}

/// E2B's "all traffic" selector (`ctx.all_traffic`), and its IPv6 form.
const ALL_TRAFFIC: [&str; 2] = ["0.0.0.0/0", "::/0"];
/// Most `allow_out` + `deny_out` entries, and the longest.
const MAX_NETWORK_ENTRIES: usize = 256;
const MAX_NETWORK_ENTRY: usize = 253;

/// E2B's `network` (`allowOut`, `denyOut`: the SDK's `allow_out`, `deny_out`) and `allow_internet_access`, as the OpenSandbox
/// create's `networkPolicy` (agentrun's egress allowlist proxy); `None`: no network at all
/// (neither asked for: agentrun's default, or `allow_internet_access=False` alone).
///
/// As E2B: `allow_out` wins over `deny_out` (its rules come first; the first matching rule
/// decides); everything else is allowed unless `deny_out` names all traffic (`0.0.0.0/0`) or
/// `allow_internet_access` is false. Entries are host names, `*.domain` wildcards and IP
/// addresses; CIDR ranges other than all traffic, `rules` (transforms), `egress_proxy` and
/// `dns_servers` are 400.
pub fn network_policy(
    allow_internet_access: Option<bool>,
    network: Option<&Value>,
) -> E2bResult<Option<Value>> {
    let network = network.filter(|n| !n.is_null());
    let Some(network) = network else {
        return Ok(match allow_internet_access {
            Some(true) => Some(json!({"defaultAction": "allow", "egress": []})),
            _ => None,
        });
    };
    let Some(obj) = network.as_object() else {
        return Err(E2bError::bad_request("network must be an object"));
    };
    for (k, v) in obj {
        match k.as_str() {
            "allowOut" | "denyOut" => {}
            // Ingress and host masking: agentrun serves no public sandbox URLs.
            "allowPublicTraffic" | "maskRequestHost" | "httpsPorts" => {}
            "rules" | "egressProxy" | "dnsServers" if v.is_null() => {}
            other => {
                return Err(E2bError::bad_request(format!(
                    "network.{other} is not served by agentrun's E2B API (allowOut and denyOut are)"
                )))
            }
        }
    }
    let list = |key: &str| -> E2bResult<Vec<String>> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|e| match e.as_str().map(str::trim) {
                    Some(t) if !t.is_empty() && t.len() <= MAX_NETWORK_ENTRY => Ok(t.to_owned()),
                    _ => Err(E2bError::bad_request(format!(
                        "network.{key}: each entry is a host name, IP address or 0.0.0.0/0 of 1 to {MAX_NETWORK_ENTRY} bytes"
                    ))),
                })
                .collect(),
            Some(_) => Err(E2bError::bad_request(format!(
                "network.{key} must be a list"
            ))),
        }
    };
    let (allow, deny) = (list("allowOut")?, list("denyOut")?);
    if allow.len() + deny.len() > MAX_NETWORK_ENTRIES {
        return Err(E2bError::bad_request(format!(
            "network: at most {MAX_NETWORK_ENTRIES} allowOut and denyOut entries"
        )));
    }
    let all = |t: &String| ALL_TRAFFIC.contains(&t.as_str());
    for t in allow.iter().chain(&deny).filter(|t| !all(t)) {
        if t.contains('/') || t.contains(':') {
            return Err(E2bError::bad_request(format!(
                "network entry {t:?}: CIDR ranges and IPv6 addresses are not served (host names, *.domain wildcards, IPv4 addresses and 0.0.0.0/0 are)"
            )));
        }
    }
    if allow.iter().any(all) {
        return Ok(Some(json!({"defaultAction": "allow", "egress": []})));
    }
    let deny_all = allow_internet_access == Some(false) || deny.iter().any(all);
    let mut egress: Vec<Value> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (action, t) in allow
        .iter()
        .map(|t| ("allow", t))
        .chain(deny.iter().filter(|t| !all(t)).map(|t| ("deny", t)))
    {
        // The first per target wins (allow_out's).
        if seen.insert(t.trim_end_matches('.').to_ascii_lowercase()) {
            egress.push(json!({"action": action, "target": t}));
        }
    }
    Ok(Some(json!({
        "defaultAction": if deny_all { "deny" } else { "allow" },
        "egress": egress,
    })))
}

fn check_metadata(m: &BTreeMap<String, String>) -> E2bResult<()> {
    if m.len() > MAX_METADATA {
        return Err(E2bError::bad_request(format!(
            "metadata: at most {MAX_METADATA} entries"
        )));
    }
    for (k, v) in m {
        if k.is_empty() || k.len() > MAX_METADATA_KEY || v.len() > MAX_METADATA_VALUE {
            return Err(E2bError::bad_request(format!(
                "metadata {k:?}: keys are 1 to {MAX_METADATA_KEY} bytes, values at most {MAX_METADATA_VALUE}"
            )));
        }
    }
    Ok(())
}

fn state_of(rec: &Record) -> &'static str {
    match rec.state().0 {
        SandboxState::Paused => "paused",
        _ => "running",
    }
}

fn cpu_count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The `ListedSandbox` / `SandboxDetail` JSON of a record.
fn sandbox_json(rec: &Record, detail: bool) -> Value {
    let mut v = json!({
        "templateID": template_of(rec),
        "sandboxID": rec.id,
        "clientID": crate::CLIENT_ID,
        "startedAt": rfc3339(rec.created_at),
        "endAt": rfc3339(end_of(rec)),
        "cpuCount": cpu_count(),
        "memoryMB": 0,
        "diskSizeMB": 0,
        "state": state_of(rec),
        "envdVersion": crate::ENVD_VERSION,
        "metadata": *lock(&rec.metadata),
    });
    if detail {
        v["envdAccessToken"] = json!(rec.execd_token);
        v["allowInternetAccess"] = json!(rec
            .network_policy
            .as_ref()
            .is_some_and(|p| p["defaultAction"] == "allow"));
    }
    v
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PauseBody {
    memory: Option<bool>,
    #[allow(dead_code)]
    require_healthy_guest: Option<bool>,
}

/// Pauses a sandbox (409 if it is paused already); a paused sandbox no longer expires (E2B
/// keeps paused sandboxes). In memory (the default, `memory: true`): every process frozen
/// (its cgroup), nothing new starts in it. `memory: false` (`pause(mode="filesystem")`):
/// its files kept as a snapshot and the sandbox torn down (its processes, memory and shell
/// given back); connect makes it again from them, with the same id and tokens.
async fn pause(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> E2bResult<StatusCode> {
    let req: PauseBody = json_body_or_default(&body)?;
    let rec = record(&server, &id)?;
    rec.check_running()?;
    if rec.state().0 == SandboxState::Paused {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    let trace = crate::traceparent(&headers).map(str::to_owned);
    crate::autopause::pause(&server, &rec, req.memory != Some(false), trace).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, Default)]
struct ConnectBody {
    timeout: Option<i64>,
}

/// Connects to a sandbox (`Sandbox.connect`): a paused one is resumed (201) with the
/// timeout asked (default [`DEFAULT_TIMEOUT_S`]); a running one (200) gets it only if that
/// ends later than its current end.
async fn connect(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> E2bResult<Response> {
    let rec = record(&server, &id)?;
    let req: ConnectBody = if body.is_empty() {
        ConnectBody::default()
    } else {
        json_body(&body)?
    };
    let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(1..=MAX_TIMEOUT_S).contains(&timeout) {
        return Err(E2bError::bad_request(format!(
            "timeout must be between 1 and {MAX_TIMEOUT_S} seconds"
        )));
    }
    rec.check_running()?;
    let end = Utc::now() + chrono::Duration::seconds(timeout);
    let status = if rec.state().0 == SandboxState::Paused {
        let on_disk = lock(&rec.on_disk).clone();
        match on_disk {
            // Paused to disk: made again from its files (a new record, same id and tokens).
            Some(snapshot_id) => {
                lifecycle::resume_from_disk(&server, &rec, &snapshot_id, &headers).await?;
                let rec = record(&server, &id)?;
                set_end(&rec, end);
                return Ok((
                    StatusCode::CREATED,
                    Json(created_json(&rec, &template_of(&rec))),
                )
                    .into_response());
            }
            None => {
                rec.sandbox
                    .resume()
                    .map_err(|e| E2bError::from(agentrun_opensandbox::ApiError::from(e)))?;
                rec.set_state(SandboxState::Running);
            }
        }
        set_end(&rec, end);
        StatusCode::CREATED
    } else {
        if end_of(&rec) < end {
            set_end(&rec, end);
        }
        StatusCode::OK
    };
    Ok((status, Json(created_json(&rec, &template_of(&rec)))).into_response())
}

async fn create(State(server): State<Arc<Server>>, headers: HeaderMap, body: Bytes) -> Response {
    match create_inner(&server, &headers, &body).await {
        Ok(v) => (StatusCode::CREATED, Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn create_inner(server: &Arc<Server>, headers: &HeaderMap, body: &[u8]) -> E2bResult<Value> {
    let json = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(agentrun_webguard::is_json);
    if !json {
        return Err(E2bError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the request body must be JSON sent as Content-Type: application/json",
        ));
    }
    let (osb, template, metadata) = parse_create(body)?;
    let trace = crate::traceparent(headers);
    let rec = match lifecycle::create_from_body(server, &Bytes::from(osb.clone()), trace).await {
        Ok(rec) => rec,
        Err(e) if e.status == StatusCode::BAD_REQUEST && e.message.starts_with("image.uri") => {
            // Not an image: the name of one of this key's snapshots (the newest of it)?
            match snapshot_named(server, &template).await {
                Some(id) => {
                    let mut v: Value = serde_json::from_slice(&osb)
                        .map_err(|e| E2bError::bad_request(e.to_string()))?;
                    if let Some(o) = v.as_object_mut() {
                        o.remove("image");
                        o.insert("snapshotId".into(), json!(id));
                    }
                    lifecycle::create_from_body(server, &Bytes::from(v.to_string()), trace)
                        .await?
                }
                None => {
                    return Err(E2bError::bad_request(format!(
                        "template {template:?}: no image {:?} in agentrun's store and no snapshot of that name ({})",
                        template_image(&template),
                        e.message
                    )))
                }
            }
        }
        Err(e) => return Err(e.into()),
    };
    if is_e2b_template(&template) {
        if let Err(e) = make_template_home(&rec).await {
            // Not handed out half made.
            let _ = lifecycle::delete_sandbox(server, &rec.id).await;
            return Err(e);
        }
    }
    *lock(&rec.metadata) = metadata;
    if let Some(l) = crate::autopause::Lifecycle::of(&rec) {
        set_end(&rec, Utc::now() + chrono::Duration::seconds(l.timeout_s));
    }
    Ok(created_json(&rec, &template))
}

/// The id of this API key's newest snapshot named `name` (`create_snapshot(name=...)`).
async fn snapshot_named(server: &Arc<Server>, name: &str) -> Option<String> {
    let (srv, name) = (server.clone(), name.to_owned());
    tokio::task::spawn_blocking(move || {
        let all = srv.store.snapshots(Some(&srv.owner)).ok()?;
        all.into_iter()
            .filter(|s| s.name.as_deref() == Some(name.as_str()))
            .max_by(|a, b| a.created.cmp(&b.created))
            .map(|s| s.id)
    })
    .await
    .ok()
    .flatten()
}

async fn get_one(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
) -> E2bResult<Json<Value>> {
    let rec = record(&server, &id)?;
    Ok(Json(sandbox_json(&rec, true)))
}

async fn kill(State(server): State<Arc<Server>>, Path(id): Path<String>) -> E2bResult<StatusCode> {
    lifecycle::delete_sandbox(&server, &id)
        .await
        .map_err(|_| E2bError::not_found(format!("sandbox {id} not found")))?;
    crate::autopause::forget(&id);
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct Timeout {
    timeout: i64,
}

/// A set-timeout body: the new timeout, in seconds from now.
pub fn parse_timeout(body: &[u8]) -> E2bResult<i64> {
    let t: Timeout = json_body(body)?;
    if !(0..=MAX_TIMEOUT_S).contains(&t.timeout) {
        return Err(E2bError::bad_request(format!(
            "timeout must be between 0 and {MAX_TIMEOUT_S} seconds"
        )));
    }
    Ok(t.timeout)
}

async fn set_timeout(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    body: Bytes,
) -> E2bResult<StatusCode> {
    let rec = record(&server, &id)?;
    let t = parse_timeout(&body)?;
    set_end(&rec, Utc::now() + chrono::Duration::seconds(t));
    Ok(StatusCode::NO_CONTENT)
}

fn unquote(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// A list query, parsed: metadata pairs, states, template, start time bound, order, page
/// size, the page's start.
pub struct ListQuery {
    pub metadata: Vec<(String, String)>,
    pub states: Vec<String>,
    pub template: Option<String>,
    pub started_after: Option<DateTime<Utc>>,
    /// Newest first.
    pub descending: bool,
    pub limit: usize,
    pub start: usize,
}

/// `GET /v2/sandboxes`'s query: `metadata` (itself a URL-encoded `k=v&k2=v2` of URL-encoded
/// keys and values, as the SDK sends it), `state`
/// (repeated or comma-separated), `template`, `startedAfter` (RFC 3339), `order` (`asc`, the
/// default, or `desc` by start time), `limit`, `nextToken` (the index of the page's first
/// sandbox, as this server hands it out).
pub fn parse_list_query(q: Option<&str>) -> E2bResult<ListQuery> {
    let mut out = ListQuery {
        metadata: Vec::new(),
        states: Vec::new(),
        template: None,
        started_after: None,
        descending: false,
        limit: DEFAULT_LIMIT,
        start: 0,
    };
    let pairs: Vec<(String, String)> = q
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    for (k, v) in pairs {
        match k.as_str() {
            // `k=v&k2=v2` whose keys and values are URL-encoded themselves (E2B's spec).
            "metadata" => out.metadata.extend(
                form_urlencoded::parse(v.as_bytes()).map(|(k, v)| (unquote(&k), unquote(&v))),
            ),
            "state" => out.states.extend(
                v.split(',')
                    .map(|s| s.trim().to_ascii_lowercase())
                    .filter(|s| !s.is_empty()),
            ),
            "limit" => out.limit = page_limit(&v)?,
            "template" => out.template = Some(v).filter(|t| !t.is_empty()),
            "startedAfter" => {
                out.started_after = Some(
                    DateTime::parse_from_rfc3339(&v)
                        .map_err(|e| E2bError::bad_request(format!("startedAfter {v:?}: {e}")))?
                        .with_timezone(&Utc),
                )
            }
            "order" => {
                out.descending = match v.as_str() {
                    "asc" => false,
                    "desc" => true,
                    _ => return Err(E2bError::bad_request("order must be asc or desc")),
                }
            }
            "nextToken" => out.start = page_start(&v)?,
            _ => {}
        }
    }
    for s in &out.states {
        if s != "running" && s != "paused" {
            return Err(E2bError::bad_request(format!(
                "state {s:?}: expected running or paused"
            )));
        }
    }
    Ok(out)
}

async fn list(State(server): State<Arc<Server>>, RawQuery(q): RawQuery) -> E2bResult<Response> {
    let q = parse_list_query(q.as_deref())?;
    let mut matching: Vec<Arc<Record>> = server
        .all()
        .into_iter()
        // Torn down and not paused to disk: being deleted.
        .filter(|r| {
            !r.torn_down.load(std::sync::atomic::Ordering::SeqCst) || lock(&r.on_disk).is_some()
        })
        .filter(|r| q.states.is_empty() || q.states.iter().any(|s| s == state_of(r)))
        .filter(|r| q.template.as_ref().is_none_or(|t| *t == template_of(r)))
        .filter(|r| q.started_after.is_none_or(|t| r.created_at > t))
        .filter(|r| {
            let m = lock(&r.metadata);
            q.metadata.iter().all(|(k, v)| m.get(k) == Some(v))
        })
        .collect();
    // `all()` is oldest first.
    if q.descending {
        matching.reverse();
    }
    let page: Vec<Value> = matching
        .iter()
        .skip(q.start)
        .take(q.limit)
        .map(|r| sandbox_json(r, false))
        .collect();
    let next = q.start + page.len();
    let mut resp = Json(Value::Array(page)).into_response();
    if next < matching.len() {
        if let Ok(v) = next.to_string().parse() {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}

async fn not_served_refresh() -> E2bError {
    E2bError::not_served("refreshes are not served: use set_timeout")
}
async fn not_served_logs() -> E2bError {
    E2bError::not_served("sandbox logs are not served by agentrun's E2B API yet")
}
/// Most bytes of a network update.
const MAX_NETWORK_BODY: usize = 64 * 1024;

/// `PUT /sandboxes/{id}/network` (`update_network`): the sandbox's egress rules replaced,
/// atomically and at once (as create's `network`; what is left out is cleared), on its
/// egress proxy. 409 for a sandbox made without network (it has no proxy: create it with
/// `allow_internet_access` or `network`).
async fn update_network(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    body: Bytes,
) -> E2bResult<StatusCode> {
    if body.len() > MAX_NETWORK_BODY {
        return Err(E2bError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a network update is at most {MAX_NETWORK_BODY} bytes"),
        ));
    }
    let mut v: Value = json_body(&body)?;
    let Some(obj) = v.as_object_mut() else {
        return Err(E2bError::bad_request("the body must be a JSON object"));
    };
    let internet = match obj.remove("allowInternetAccess") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(b),
        Some(_) => {
            return Err(E2bError::bad_request(
                "allowInternetAccess must be a boolean",
            ))
        }
    };
    let policy = network_policy(internet, Some(&v))?
        .unwrap_or_else(|| json!({"defaultAction": "deny", "egress": []}));
    let policy = agentrun_policy::OpenSandboxPolicy::from_value(policy)
        .map_err(|e| E2bError::bad_request(e.to_string()))?;
    let rec = record(&server, &id)?;
    rec.check_running()?;
    let Some(egress) = rec.egress.as_ref() else {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} was made without network: it has no egress proxy to update (create it with allow_internet_access or network)"),
        ));
    };
    tokio::task::block_in_place(|| egress.replace(policy))?;
    Ok(StatusCode::NO_CONTENT)
}
/// `/templates/...`: `DELETE /templates/{id}` of a snapshot (the SDK's `delete_snapshot`);
/// the rest is not served.
async fn templates(
    server: State<Arc<Server>>,
    method: axum::http::Method,
    Path(rest): Path<String>,
) -> Response {
    if method == axum::http::Method::DELETE && !rest.contains('/') {
        return match crate::snapshots::delete_snapshot(server, Path(rest)).await {
            Ok(s) => s.into_response(),
            Err(e) => e.into_response(),
        };
    }
    not_served_templates().await.into_response()
}
async fn not_served_secrets() -> E2bError {
    E2bError::not_served("secrets are not served by agentrun's E2B API")
}
async fn not_served_volumes() -> E2bError {
    E2bError::not_served(
        "E2B volumes are not served by agentrun's E2B API (the OpenSandbox API has named volumes)",
    )
}
async fn not_served_templates() -> E2bError {
    E2bError::not_served("templates are not built by agentrun's E2B API: a template is an image of agentrun's store (agentrun image pull/import/build)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_bodies_become_opensandbox_creates() {
        let (osb, template, meta) = parse_create(
            br#"{"templateID":"base","timeout":60,"metadata":{"who":"me too"},"envVars":{"A":"1"}}"#,
        )
        .unwrap();
        assert_eq!(template, "base");
        assert_eq!(meta.get("who").map(String::as_str), Some("me too"));
        let v: Value = serde_json::from_slice(&osb).unwrap();
        assert_eq!(v["image"]["uri"], "host");
        assert_eq!(v["timeout"], 60);
        assert_eq!(v["env"]["A"], "1");
        let (osb, _, _) = parse_create(br#"{"templateID":"busybox"}"#).unwrap();
        let v: Value = serde_json::from_slice(&osb).unwrap();
        assert_eq!(v["image"]["uri"], "busybox");
        assert_eq!(v["timeout"], DEFAULT_TIMEOUT_S);
    }

    #[test]
    fn bad_create_bodies_are_400() {
        for body in [
            &b"{"[..],
            br#"{"templateID":""}"#,
            br#"{"templateID":"base","timeout":0}"#,
            br#"{"templateID":"base","timeout":90000}"#,
            br#"{"templateID":"base","autoResume":{"enabled":true}}"#,
            br#"{"templateID":"base","autoPause":true,"autoResume":{"on":true}}"#,
            br#"{"templateID":"base","network":{"allowOut":["10.0.0.0/8"]}}"#,
            br#"{"templateID":"base","network":{"denyOut":"0.0.0.0/0"}}"#,
            br#"{"templateID":"base","network":{"rules":{"a.test":[]}}}"#,
            br#"{"templateID":"base","network":{"egressProxy":{}}}"#,
            br#"{"templateID":"base","network":["a"]}"#,
            br#"{"templateID":"base","metadata":{"":"x"}}"#,
        ] {
            let e = parse_create(body).err().unwrap();
            assert_eq!(
                e.status,
                StatusCode::BAD_REQUEST,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn auto_pause_has_no_opensandbox_expiry() {
        let (osb, _, _) = parse_create(
            br#"{"templateID":"base","timeout":30,"autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}"#,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&osb).unwrap();
        assert!(v["timeout"].is_null());
        assert_eq!(
            v["extensions"][crate::autopause::LIFECYCLE_KEY],
            json!({"memory": false, "autoResume": true, "timeout": 30})
        );
    }

    #[test]
    fn network_maps_onto_network_policy() {
        let p = |a: Option<bool>, n: Value| network_policy(a, Some(&n)).unwrap();
        assert_eq!(network_policy(None, None).unwrap(), None);
        assert_eq!(network_policy(Some(false), None).unwrap(), None);
        assert_eq!(
            network_policy(Some(true), None).unwrap(),
            Some(json!({"defaultAction": "allow", "egress": []}))
        );
        assert_eq!(
            p(
                None,
                json!({"allowOut": ["a.test", "1.2.3.4"], "denyOut": ["0.0.0.0/0"]})
            ),
            Some(json!({"defaultAction": "deny", "egress": [
                {"action": "allow", "target": "a.test"},
                {"action": "allow", "target": "1.2.3.4"}]}))
        );
        // allow_out wins over deny_out; without all traffic denied the rest is allowed.
        assert_eq!(
            p(
                None,
                json!({"allowOut": ["a.test"], "denyOut": ["A.test", "b.test"]})
            ),
            Some(json!({"defaultAction": "allow", "egress": [
                {"action": "allow", "target": "a.test"},
                {"action": "deny", "target": "b.test"}]}))
        );
        assert_eq!(
            p(Some(false), json!({"allowOut": ["a.test"]})).unwrap()["defaultAction"],
            "deny"
        );
        assert_eq!(
            p(
                None,
                json!({"allowOut": ["0.0.0.0/0"], "denyOut": ["b.test"]})
            ),
            Some(json!({"defaultAction": "allow", "egress": []}))
        );
        let many: Vec<String> = (0..300).map(|i| format!("h{i}.test")).collect();
        assert!(network_policy(None, Some(&json!({"allowOut": many}))).is_err());
        assert!(network_policy(None, Some(&json!({"allowOut": [""]}))).is_err());
        assert!(network_policy(None, Some(&json!({"allowOut": ["::1"]}))).is_err());
    }

    #[test]
    fn list_queries() {
        // What the SDK sends for metadata {"a b": "1:2", "k": "v"}: each key and value
        // quoted, the pairs URL-encoded, the whole URL-encoded again as a query value.
        let q = parse_list_query(Some(
            "metadata=a%252520b%3D1%25253A2%26k%3Dv&state=running&state=paused&limit=5&nextToken=10",
        ))
        .unwrap();
        assert_eq!(
            q.metadata,
            vec![
                ("a b".to_string(), "1:2".to_string()),
                ("k".into(), "v".into())
            ]
        );
        assert_eq!(q.states, vec!["running", "paused"]);
        assert_eq!((q.limit, q.start), (5, 10));
        assert!(parse_list_query(Some("limit=0")).is_err());
        assert!(parse_list_query(Some("nextToken=x")).is_err());
        assert!(parse_list_query(Some("state=gone")).is_err());
        let q = parse_list_query(Some(
            "template=base&order=desc&startedAfter=2026-01-02T03%3A04%3A05%2B00%3A00",
        ))
        .unwrap();
        assert_eq!(q.template.as_deref(), Some("base"));
        assert!(q.descending);
        assert_eq!(q.started_after.map(|t| t.timestamp()), Some(1_767_323_045));
        assert!(parse_list_query(Some("order=sideways")).is_err());
        assert!(parse_list_query(Some("startedAfter=yesterday")).is_err());
    }
}
