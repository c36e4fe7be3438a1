//! The lifecycle API (`/v1/sandboxes...`): create, get, list, delete, pause/resume, renew,
//! metadata patch, endpoint lookup (behind [`crate::auth::require_api_key`]); `X-Request-ID`,
//! TTL expiry; a sandbox's entrypoint, its main process (when it exits, the sandbox ends).

pub mod fork;
pub mod fork_contexts;
mod request;
pub mod snapshots;
pub mod volumes;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentrun_pool::output_log::LogBudget;
use agentrun_pool::{lock, PoolError};
use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use chrono::Utc;
use serde_json::{json, Value};

use crate::auth::require_api_key;
use crate::error::{ApiError, ApiResult, JsonBody};
use crate::execd::commands::{pump_outputs, remember, Command, ENTRYPOINT};
use crate::lines::SANDBOX_LOG_BUDGET;
use crate::params::{query_flag, query_pairs, traceparent};
use crate::{finish_span, random_token, rfc3339, Record, SandboxState, Server};
use request::{host_arch, only_field};
pub use request::{
    parse_cpu, parse_create, parse_memory, parse_renew, patch_metadata_body, CreateRequest,
    Validated,
};

pub fn routes(server: Arc<Server>) -> Router {
    let v1 = Router::new()
        .route("/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(get_one).delete(delete))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route(
            "/sandboxes/{id}/renew-expiration",
            post(|s, id, body| change(s, id, body, renew)),
        )
        .route(
            "/sandboxes/{id}/metadata",
            axum::routing::patch(|s, id, body| change(s, id, body, patch_metadata)),
        )
        .route("/sandboxes/{id}/endpoints/{port}", get(endpoint))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        // agentrun's extension: copies of a live sandbox (docs/opensandbox-compat.md#fork).
        .route("/sandboxes/{id}/fork", post(fork::fork))
        .route("/snapshots", get(snapshots::list))
        .route(
            "/snapshots/{snapshot_id}",
            get(snapshots::get_one).delete(snapshots::delete),
        )
        .route(
            "/sandboxes/{id}/diagnostics/{kind}",
            any(unsupported_diagnostics),
        )
        .route("/pools", any(unsupported_pools))
        .route("/pools/{name}", any(unsupported_pools))
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
        // Under `/v1` (what the SDKs use) and at the root, as upstream's server.
        .nest("/v1", v1.clone())
        .merge(v1)
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
    if let Some(s) = &rec.snapshot_id {
        // Made from a snapshot: that is its startup source (the spec's `image` is absent).
        v["snapshotId"] = json!(s);
        if let Some(o) = v.as_object_mut() {
            o.remove("image");
        }
    }
    if let Some(x) = &rec.extensions {
        v["extensions"] = x.clone();
    }
    v
}

async fn create(
    State(server): State<Arc<Server>>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let rec = create_from_body(&server, &body, traceparent(&headers).as_deref()).await?;
    Ok((StatusCode::ACCEPTED, Json(sandbox_json(&rec))).into_response())
}

/// A sandbox made from a create request's body ([`parse_create`]; from a snapshot too),
/// under the server's profile, its `sandbox.create` span a child of `traceparent`. The
/// OpenSandbox API's create, and the E2B API's (which words its request as this body).
pub async fn create_from_body(
    server: &Arc<Server>,
    body: &axum::body::Bytes,
    traceparent: Option<&str>,
) -> ApiResult<Arc<Record>> {
    let (req, mut v) = parse_create(body)?;
    v.spec.profile = server.profile.clone();
    let restore_start = Instant::now();
    if let Some(id) = v.snapshot_id.clone() {
        let srv = server.clone();
        let (image, entrypoint) =
            tokio::task::spawn_blocking(move || snapshots::restore_image(&srv, &id))
                .await
                .map_err(|e| ApiError::internal(e.to_string()))??;
        v.spec.image = image;
        if v.entrypoint.is_empty() {
            v.entrypoint = entrypoint
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| vec!["tail".into(), "-f".into(), "/dev/null".into()]);
        }
    }
    let mut span = agentrun_telemetry::RunSpan::start("sandbox.create", traceparent);
    span.set_attribute("openinference.span.kind", "TOOL");
    span.set_attribute("container.image.name", v.spec.image.as_str());
    span.set_attribute("sandbox.profile", v.spec.profile.as_str());
    let trace = span.traceparent();
    let (v_snapshot, v_image, trace_parent) =
        (v.snapshot_id.clone(), v.spec.image.clone(), trace.clone());
    let result = create_sandbox(server, &req, v, trace, body, None).await;
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
    if let Some(snapshot_id) = &v_snapshot {
        let err = result.as_ref().err().map(|e| (e.code, e.message.clone()));
        let id = result.as_ref().map(|r| r.id.clone()).unwrap_or_default();
        let restore = agentrun_pool::snapshot::report(
            agentrun_pool::snapshot::RESTORE_SPAN,
            Some(&server.audit),
            &agentrun_pool::snapshot::Report {
                sandbox_id: &id,
                snapshot_id,
                image: &v_image,
                duration: restore_start.elapsed(),
                error: err.as_ref().map(|(c, m)| (*c, m.as_str())),
                traceparent: Some(&trace_parent),
                profile: &server.profile,
                ..Default::default()
            },
        );
        finish_span(restore);
    }
    result
}

/// Makes a sandbox for a create request (`body`, parsed as `req` and `v`). `keep`: the
/// record of a sandbox paused to disk that this one brings back: its id, tokens, times,
/// metadata and startup source are kept (the endpoints stay the same).
async fn create_sandbox(
    server: &Arc<Server>,
    req: &CreateRequest,
    v: Validated,
    trace: String,
    body: &axum::body::Bytes,
    keep: Option<&Record>,
) -> ApiResult<Arc<Record>> {
    // A missing image is the caller's mistake: say so before making anything.
    if let Err(e) = server.store.resolve(&v.spec.image) {
        return Err(ApiError::bad_request(format!("image.uri: {e}")));
    }
    // Its volumes are opened (and named ones made, and held) before it exists; what the
    // mounts name are these fds, mounted while they are open.
    let live = server.live.clone();
    let mut spec = v.spec.clone();
    let (specs, srv) = (v.volumes.clone(), server.clone());
    let made = tokio::task::spawn_blocking(move || {
        let opened = volumes::open(&specs, &srv.volume_roots, &srv.volume_store)?;
        spec.mounts.extend(opened.mounts.iter().cloned());
        match live.create(&spec) {
            Ok(sandbox) => Ok((sandbox, opened.held)),
            Err(e) => {
                volumes::release(opened.held, true);
                Err(ApiError::from(e))
            }
        }
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    let (sandbox, held) = made?;
    // Its egress proxy listens before anything runs in it.
    let egress = match (v.network.clone(), sandbox.egress_socket()) {
        (Some(policy), Some(socket)) => {
            let started = crate::egress::SandboxEgress::start(
                sandbox.id(),
                socket,
                policy,
                server.audit.clone(),
                trace,
                v.credential_proxy,
                &server.upstream_roots,
            )
            .and_then(|e| {
                // The CA in the image's system bundles too, in the sandbox's cell (made
                // before the CA): clients that ignore the trust environment trust it.
                let dir = socket.parent().unwrap_or(std::path::Path::new("/"));
                agentrun_egress::system_trust::install_for_pid(sandbox.init_pid(), dir)
                    .map_err(agentrun_egress::EgressError::Trust)?;
                Ok(e)
            });
            match started {
                Ok(e) => Some(e),
                Err(e) => {
                    let live = server.live.clone();
                    let id = sandbox.id().to_owned();
                    // A JoinHandle: the task logs its own failure.
                    let _ = tokio::task::spawn_blocking(move || {
                        if let Err(e) = live.delete(&id) {
                            tracing::warn!(target: "agentrun::opensandbox::lifecycle", "deleting sandbox {id} after a failed create: {e}");
                        }
                        volumes::release(held, true);
                    })
                    .await;
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
        execd_token: match keep {
            Some(k) => k.execd_token.clone(),
            None => random_token()?,
        },
        egress_token: match keep {
            Some(k) => k.egress_token.clone(),
            None => random_token()?,
        },
        image: keep.map_or_else(|| v.spec.image.clone(), |k| k.image.clone()),
        snapshot_id: keep.map_or_else(|| v.snapshot_id.clone(), |k| k.snapshot_id.clone()),
        create_body: body.clone(),
        on_disk: Mutex::new(None),
        entrypoint: v.entrypoint.clone(),
        shell: std::sync::OnceLock::new(),
        created_at: keep.map_or(now, |k| k.created_at),
        expires_at: Mutex::new(match keep {
            Some(k) => *lock(&k.expires_at),
            None => v.timeout.map(|t| now + chrono::Duration::seconds(t)),
        }),
        metadata: Mutex::new(match keep {
            Some(k) => lock(&k.metadata).clone(),
            None => req.metadata.clone(),
        }),
        network_policy: req.network_policy.clone().filter(|p| !p.is_null()),
        egress,
        extensions: req.extensions.clone().filter(|p| !p.is_null()),
        state: Mutex::new((SandboxState::Running, now)),
        ended: Mutex::new(None),
        netns: Default::default(),
        torn_down: Default::default(),
        commands: Mutex::new(Default::default()),
        log_budget: Arc::new(LogBudget::with_cap(SANDBOX_LOG_BUDGET)),
        finished_commands: Default::default(),
        sessions: Mutex::new(Default::default()),
        stdin: Mutex::new(Default::default()),
        code: Mutex::new(Default::default()),
        cpu_sample: Mutex::new((Instant::now(), 0)),
        volumes: Mutex::new(held),
        access_renew_s: v.access_renew_s,
        access_renewed: Mutex::new(None),
    });
    // The entrypoint is the sandbox's main process.
    if let Err(e) = start_entrypoint(server, &rec).await {
        let live = server.live.clone();
        let id = rec.id.clone();
        let rec2 = rec.clone();
        // A JoinHandle: the task logs its own failure.
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(e) = &rec2.egress {
                e.stop();
            }
            if let Err(e) = live.delete(&id) {
                tracing::warn!(target: "agentrun::opensandbox::lifecycle", "deleting sandbox {id} after a failed create: {e}");
            }
            volumes::release(std::mem::take(&mut *lock(&rec2.volumes)), true);
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
    let cmd = agentrun_pool::process::StartCommand::new(argv, Vec::new(), "/");
    let p = match agentrun_pool::process::spawn(&rec.sandbox, cmd, false).await {
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

/// The `page` and `pageSize` of a list request (the sandbox and the snapshot lists), and the
/// page of items answered, in the spec's `{items, pagination}` shape.
pub(crate) struct Paging {
    page: usize,
    size: usize,
}

impl Default for Paging {
    fn default() -> Self {
        Paging { page: 1, size: 20 }
    }
}

impl Paging {
    /// Takes `k=v` if it is a paging parameter (a bad value is a 400); other keys are ignored.
    pub(crate) fn take(&mut self, k: &str, v: &str) -> ApiResult<()> {
        match k {
            "page" => {
                self.page = v
                    .parse()
                    .ok()
                    .filter(|p| *p >= 1)
                    .ok_or_else(|| ApiError::bad_request("page must be >= 1"))?
            }
            "pageSize" | "page_size" => {
                self.size = v
                    .parse()
                    .ok()
                    .filter(|p| (1..=200).contains(p))
                    .ok_or_else(|| ApiError::bad_request("pageSize must be between 1 and 200"))?
            }
            _ => {}
        }
        Ok(())
    }

    /// The page of `matching` asked for, with the pagination of the whole.
    pub(crate) fn answer(&self, matching: Vec<Value>) -> Json<Value> {
        let total = matching.len();
        let pages = total.div_ceil(self.size);
        let items: Vec<Value> = matching
            .into_iter()
            .skip((self.page - 1) * self.size)
            .take(self.size)
            .collect();
        Json(json!({
            "items": items,
            "pagination": {
                "page": self.page,
                "pageSize": self.size,
                "totalItems": total,
                "totalPages": pages,
                "hasNextPage": self.page < pages,
            }
        }))
    }
}

/// A `state` query value of a list: comma-separated states, lower-cased.
pub(super) fn state_list(v: &str) -> impl Iterator<Item = String> + '_ {
    v.split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
}

async fn list(State(server): State<Arc<Server>>, RawQuery(q): RawQuery) -> ApiResult<Json<Value>> {
    let pairs = query_pairs(&q);
    let mut states: Vec<String> = Vec::new();
    let mut meta: Vec<(String, String)> = Vec::new();
    let mut paging = Paging::default();
    for (k, v) in &pairs {
        match k.as_str() {
            "state" => states.extend(state_list(v)),
            "metadata" => meta.extend(form_urlencoded::parse(v.as_bytes()).into_owned()),
            _ => {
                paging.take(k, v)?;
            }
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
    Ok(paging.answer(matching))
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
    // Paused to disk: its files go with it.
    let on_disk = lock(&rec.on_disk).take();
    if let Some(sid) = on_disk {
        let srv = server.clone();
        remove_snapshot_logged(srv, sid).await;
    }
    Ok(())
}

async fn delete(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    delete_sandbox(&server, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause`: freezes it (cgroup freezer; its memory kept). With
/// `?toDisk=true` (an agentrun extension): its files are kept as a snapshot and the sandbox
/// is torn down (its memory and shell given back); `resume` makes it again from the snapshot
/// with the same id and endpoints (files only: processes, sessions and code contexts are
/// not kept; the entrypoint starts again).
async fn pause(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let to_disk = query_flag(&q, &["toDisk", "to_disk"])?;
    let rec = server.record(&id)?;
    rec.check_running()?;
    if rec.state().0 == SandboxState::Paused {
        return Err(ApiError::conflict(format!(
            "sandbox {id} is already paused"
        )));
    }
    if !to_disk {
        rec.sandbox.pause()?;
        rec.set_state(SandboxState::Paused);
        return Ok(StatusCode::ACCEPTED);
    }
    pause_to_disk(&server, &rec, traceparent(&headers)).await?;
    Ok(StatusCode::ACCEPTED)
}

/// Pauses a running sandbox to disk: its files kept as a snapshot, then it is torn down (its
/// processes, memory and shell go; the record, with its id, tokens and metadata, stays)
/// until [`resume_from_disk`]. 409 for a sandbox holding named volumes.
pub async fn pause_to_disk(
    server: &Arc<Server>,
    rec: &Arc<Record>,
    trace: Option<String>,
) -> ApiResult<()> {
    if !lock(&rec.volumes).is_empty() {
        return Err(ApiError::conflict(format!(
            "sandbox {} holds named volumes: it cannot be paused to disk (pause it in memory)",
            rec.id
        )));
    }
    let snapshot_id = snapshots::pause_to_disk(server, rec, trace).await?;
    *lock(&rec.on_disk) = Some(snapshot_id);
    rec.set_state(SandboxState::Paused);
    rec.tear_down(&server.live);
    Ok(())
}

async fn resume(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<StatusCode> {
    let rec = server.record(&id)?;
    if rec.state().0 != SandboxState::Paused {
        return Err(ApiError::conflict(format!("sandbox {id} is not paused")));
    }
    let on_disk = lock(&rec.on_disk).clone();
    match on_disk {
        None => {
            rec.sandbox.resume()?;
            rec.set_state(SandboxState::Running);
        }
        Some(snapshot_id) => resume_from_disk(&server, &rec, &snapshot_id, &headers).await?,
    }
    Ok(StatusCode::ACCEPTED)
}

/// Makes a sandbox paused to disk again: its create request, from its snapshot, with its id,
/// tokens, times and metadata; then its snapshot goes.
pub async fn resume_from_disk(
    server: &Arc<Server>,
    rec: &Arc<Record>,
    snapshot_id: &str,
    headers: &HeaderMap,
) -> ApiResult<()> {
    let start = Instant::now();
    let srv = server.clone();
    let sid = snapshot_id.to_owned();
    let (image, _) = tokio::task::spawn_blocking(move || snapshots::restore_image(&srv, &sid))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    let (req, mut v) = parse_create(&rec.create_body)?;
    v.spec.profile = server.profile.clone();
    v.spec.image = image.clone();
    v.spec.id = Some(rec.id.clone());
    v.entrypoint = rec.entrypoint.clone();
    // The old sandbox's teardown (off the pause's request) ends before its id is used again.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.live.get(&rec.id).is_some() {
        if Instant::now() > deadline {
            return Err(ApiError::internal(format!(
                "sandbox {} is still being torn down",
                rec.id
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let trace = traceparent(headers).unwrap_or_default();
    let result = create_sandbox(server, &req, v, trace.clone(), &rec.create_body, Some(rec)).await;
    let err = result.as_ref().err().map(|e| (e.code, e.message.clone()));
    let restore = agentrun_pool::snapshot::report(
        agentrun_pool::snapshot::RESTORE_SPAN,
        Some(&server.audit),
        &agentrun_pool::snapshot::Report {
            sandbox_id: &rec.id,
            snapshot_id,
            image: &image,
            duration: start.elapsed(),
            error: err.as_ref().map(|(c, m)| (*c, m.as_str())),
            traceparent: (!trace.is_empty()).then_some(trace.as_str()),
            profile: &server.profile,
            ..Default::default()
        },
    );
    finish_span(restore);
    result?;
    let (srv, sid) = (server.clone(), snapshot_id.to_owned());
    remove_snapshot_logged(srv, sid).await;
    Ok(())
}

/// Removes a sandbox's own snapshot on disk, which nothing uses any more; a failure leaves
/// the snapshot (listed, removable) and is logged.
async fn remove_snapshot_logged(server: Arc<Server>, id: String) {
    let removed =
        tokio::task::spawn_blocking(move || server.store.remove_snapshot(&id, None).map(drop))
            .await;
    match removed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(target: "agentrun::opensandbox::lifecycle", "removing a used snapshot: {e}")
        }
        Err(e) => {
            tracing::warn!(target: "agentrun::opensandbox::lifecycle", "removing a used snapshot: {e}")
        }
    }
}

/// A change of sandbox `{id}` that its JSON body asks for (`POST .../renew-expiration`,
/// `PATCH .../metadata`): the body read, the sandbox found (404), then `change` checks and
/// makes it and gives the answer.
async fn change(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody,
    change: fn(&Record, &[u8]) -> ApiResult<Value>,
) -> ApiResult<Json<Value>> {
    let rec = server.record(&id)?;
    change(&rec, &body).map(Json)
}

fn renew(rec: &Record, body: &[u8]) -> ApiResult<Value> {
    let t = parse_renew(body, Utc::now())?;
    *lock(&rec.expires_at) = Some(t);
    Ok(json!({"expiresAt": rfc3339(t)}))
}

fn patch_metadata(rec: &Record, body: &[u8]) -> ApiResult<Value> {
    let current = lock(&rec.metadata).clone();
    let next = patch_metadata_body(current, body)?;
    *lock(&rec.metadata) = next;
    Ok(sandbox_json(rec))
}

async fn endpoint(
    State(server): State<Arc<Server>>,
    Path((id, port)): Path<(String, u16)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    let rec = server.record(&id)?;
    let use_server_proxy = query_flag(&q, &["use_server_proxy"])?;
    // The address the client reached us by is the one it can reach execd by.
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| server.listen.to_string());
    if use_server_proxy {
        // Through the server, the API key is the credential: the server puts the sandbox's
        // token in itself, so the token is not handed out.
        return Ok(Json(json!({
            "endpoint": crate::server_proxy::endpoint(&host, &id, port),
            "headers": {},
        })));
    }
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

async fn unsupported_diagnostics() -> ApiError {
    ApiError::not_supported("diagnostics are not served by agentrun: a sandbox's decisions and runs are its spans and its audit records (agentrun audit --json, by sandbox_id), its shell is in `agentrun ps`")
}

async fn unsupported_pools() -> ApiError {
    ApiError::not_supported("server-side pools (Kubernetes) are not served: agentrun keeps warm shells itself (agentrun serve --pool), and the SDK's client-side pool works unchanged")
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
