//! The snapshot API: `POST /sandboxes/{id}/snapshots`, `GET /snapshots` (`sandboxId` and
//! `state` filters, pagination), `GET`/`DELETE /snapshots/{id}`; a create's `snapshotId`
//! resolves here ([`restore_image`]).
//!
//! A snapshot is the sandbox's writable layer kept as an image layer over its image
//! ([`agentrun_image::snapshot`]), taken with the sandbox frozen
//! ([`agentrun_pool::snapshot::take`]). The POST answers 202 with the snapshot `Creating`
//! once the request is checked (the sandbox exists and runs, its layer is under the size
//! limit), and the capture goes on off the request: `GET` shows it `Ready` (listed from the
//! store, so across restarts) or `Failed` (kept in memory, with why). Snapshots belong to the
//! API key that made them (its fingerprint is their owner): another key's snapshot is a 404.

use std::sync::Arc;
use std::time::Instant;

use agentrun_image::{ImageError, Snapshot, SnapshotMeta};
use agentrun_pool::lock;
use agentrun_pool::snapshot::{report, Report, SNAPSHOT_SPAN};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::{only_field, state_list, Paging};
use crate::error::{ApiError, ApiResult, JsonBody};
pub use crate::held::PendingSnapshot;
use crate::params::{query_pairs, traceparent};
use crate::{finish_span, rfc3339, Server};

/// Most failed snapshots kept listed (the oldest go first).
const MAX_FAILED_KEPT: usize = 256;

impl PendingSnapshot {
    fn json(&self) -> Value {
        let mut v = json!({
            "id": self.id,
            "sandboxId": self.sandbox_id,
            "status": {
                "state": self.state,
                "reason": self.reason,
                "message": self.message,
                "lastTransitionAt": rfc3339(self.since),
            },
            "createdAt": rfc3339(self.created_at),
        });
        if let Some(n) = &self.name {
            v["name"] = n.clone().into();
        }
        v
    }
}

fn ready_json(s: &Snapshot) -> Value {
    let created = DateTime::parse_from_rfc3339(&s.created)
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|_| Utc::now());
    let mut v = json!({
        "id": s.id,
        "sandboxId": s.sandbox_id,
        "status": {
            "state": "Ready",
            "reason": "snapshot_ready",
            "message": format!("{} bytes of changed files over image {}", s.size, s.base_image),
            "lastTransitionAt": rfc3339(created),
        },
        "createdAt": rfc3339(created),
    });
    if let Some(n) = &s.name {
        v["name"] = n.clone().into();
    }
    v
}

fn snapshot_not_found(id: &str) -> ApiError {
    ApiError::not_found("SNAPSHOT::NOT_FOUND", format!("no snapshot {id}"))
}

fn image_error(e: ImageError) -> ApiError {
    match e {
        ImageError::SnapshotTooLarge { .. } => ApiError::bad_request(e.to_string()),
        ImageError::NotFound(_) => ApiError::not_found("SNAPSHOT::NOT_FOUND", e.to_string()),
        e => ApiError::internal(e.to_string()),
    }
}

/// The image a create's `snapshotId` names, and the snapshot's entrypoint: 404 for no such
/// snapshot of this API key (deleted, another key's, never made), 409 while it is being made.
pub fn restore_image(server: &Server, id: &str) -> ApiResult<(String, Option<Vec<String>>)> {
    if let Some(p) = lock(&server.snapshots).get(id) {
        if p.owner == server.owner {
            return Err(match p.state {
                "Creating" => ApiError::conflict(format!("snapshot {id} is still being created")),
                _ => ApiError::conflict(format!("snapshot {id} failed: {}", p.message)),
            });
        }
    }
    let s = server
        .store
        .snapshot(id, Some(&server.owner))
        .map_err(|_| snapshot_not_found(id))?;
    Ok((s.image, s.entrypoint))
}

/// `POST /sandboxes/{id}/snapshots` (`{"name": ...}`, optional).
pub async fn create(
    State(server): State<Arc<Server>>,
    Path(sandbox_id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let name = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        match only_field(&body, "name")? {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= 256 => Some(s),
            Some(_) => {
                return Err(ApiError::bad_request(
                    "name must be a string of 1 to 256 characters",
                ))
            }
        }
    };
    let rec = server.record(&sandbox_id)?;
    rec.check_running()?;
    if rec.torn_down.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::not_found(
            "SANDBOX::NOT_FOUND",
            format!("no sandbox {sandbox_id}"),
        ));
    }
    let id = format!("snap-{}", crate::random_token()?);
    let now = Utc::now();
    let pending = PendingSnapshot {
        id: id.clone(),
        sandbox_id: sandbox_id.clone(),
        name: name.clone(),
        owner: server.owner.clone(),
        created_at: now,
        state: "Creating",
        reason: "snapshot_accepted",
        message: "the sandbox's writable layer is being captured".into(),
        since: now,
    };
    // The size limit is checked now (a 400 with the size), on the layer as it is; the
    // capture holds it to the limit again, frozen.
    let max = server.limits.max_snapshot;
    let sandbox = rec.sandbox.clone();
    let measured = tokio::task::spawn_blocking(move || sandbox.writable_layer_bytes())
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    if measured > max {
        let e = ImageError::SnapshotTooLarge {
            bytes: measured,
            max,
        };
        let mut span = report(
            SNAPSHOT_SPAN,
            Some(&server.audit),
            &Report {
                sandbox_id: &sandbox_id,
                snapshot_id: &id,
                image: &rec.image,
                bytes: measured,
                error: Some(("too_large", &e.to_string())),
                traceparent: traceparent(&headers).as_deref(),
                profile: &server.profile,
                ..Default::default()
            },
        );
        span.set_attribute("sandbox.snapshot.max_bytes", max as i64);
        finish_span(span);
        return Err(ApiError::bad_request(format!(
            "{e} (agentrun serve --max-snapshot)"
        )));
    }
    lock(&server.snapshots).insert(id.clone(), pending.clone());
    let answer = pending.json();
    let location = format!("/v1/snapshots/{id}");
    let (srv, trace) = (server.clone(), traceparent(&headers));
    let entrypoint = rec.entrypoint.clone();
    let image_name = rec.image.clone();
    tokio::task::spawn_blocking(move || {
        let meta = SnapshotMeta {
            id: id.clone(),
            sandbox_id: sandbox_id.clone(),
            name,
            owner: srv.owner.clone(),
            entrypoint: Some(entrypoint),
            max_bytes: Some(max),
        };
        let start = Instant::now();
        let taken = agentrun_pool::snapshot::take(&rec.sandbox, &srv.store, &meta);
        let (bytes, frozen, error) = match &taken {
            Ok(t) => (t.made.size, Some(t.frozen), None),
            Err(e) => (0, None, Some(e.to_string())),
        };
        let span = report(
            SNAPSHOT_SPAN,
            Some(&srv.audit),
            &Report {
                sandbox_id: &sandbox_id,
                snapshot_id: &id,
                image: &image_name,
                bytes,
                duration: start.elapsed(),
                frozen,
                error: error.as_deref().map(|m| ("snapshot_capture_failed", m)),
                traceparent: trace.as_deref(),
                profile: &srv.profile,
            },
        );
        if agentrun_telemetry::export_enabled() {
            span.finish();
        }
        let mut pending = lock(&srv.snapshots);
        match error {
            None => {
                pending.remove(&id);
            }
            Some(message) => {
                tracing::warn!(target: "agentrun::opensandbox::snapshots", sandbox = %sandbox_id, snapshot = %id, "snapshot failed: {message}");
                if let Some(p) = pending.get_mut(&id) {
                    p.state = "Failed";
                    p.reason = "snapshot_capture_failed";
                    p.message = message;
                    p.since = Utc::now();
                }
                // Failures are kept (listed, until deleted) up to a bound: the oldest go.
                let failed = pending.values().filter(|p| p.state == "Failed").count();
                if failed > MAX_FAILED_KEPT {
                    let oldest = pending
                        .values()
                        .filter(|p| p.state == "Failed")
                        .min_by_key(|p| p.since)
                        .map(|p| p.id.clone());
                    if let Some(o) = oldest {
                        pending.remove(&o);
                    }
                }
            }
        }
    });
    let mut resp = (StatusCode::ACCEPTED, Json(answer)).into_response();
    if let Ok(loc) = axum::http::HeaderValue::from_str(&location) {
        resp.headers_mut().insert("location", loc);
    }
    Ok(resp)
}

/// Every snapshot this API key may see: the store's (ready) and those being made or failed.
fn visible(server: &Server) -> ApiResult<Vec<(String, Value, String, String)>> {
    let ready = server
        .store
        .snapshots(Some(&server.owner))
        .map_err(image_error)?;
    let mut all: Vec<(String, Value, String, String)> = ready
        .iter()
        .map(|s| {
            (
                s.created.clone(),
                ready_json(s),
                s.sandbox_id.clone(),
                "ready".to_string(),
            )
        })
        .collect();
    for p in lock(&server.snapshots).values() {
        if p.owner == server.owner && !ready.iter().any(|s| s.id == p.id) {
            all.push((
                rfc3339(p.created_at),
                p.json(),
                p.sandbox_id.clone(),
                p.state.to_ascii_lowercase(),
            ));
        }
    }
    all.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(all)
}

/// `GET /snapshots?sandboxId=&state=&page=&pageSize=`.
pub async fn list(
    State(server): State<Arc<Server>>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<Value>> {
    let mut states: Vec<String> = Vec::new();
    let mut sandbox: Option<String> = None;
    let mut name: Option<String> = None;
    let mut paging = Paging::default();
    let pairs = query_pairs(&q);
    for (k, v) in &pairs {
        match k.as_str() {
            "state" => states.extend(state_list(v)),
            "sandboxId" | "sandbox_id" => sandbox = Some(v.clone()),
            "name" => name = Some(v.clone()),
            _ => {
                paging.take(k, v)?;
            }
        }
    }
    let srv = server.clone();
    let all = tokio::task::spawn_blocking(move || visible(&srv))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    let matching: Vec<Value> = all
        .into_iter()
        .filter(|(_, _, sid, _)| sandbox.as_ref().is_none_or(|s| s == sid))
        .filter(|(_, v, _, _)| name.as_ref().is_none_or(|n| v["name"].as_str() == Some(n)))
        .filter(|(_, _, _, st)| states.is_empty() || states.contains(st))
        .map(|(_, v, _, _)| v)
        .collect();
    Ok(paging.answer(matching))
}

/// `GET /snapshots/{id}`.
pub async fn get_one(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    if let Some(p) = lock(&server.snapshots).get(&id) {
        if p.owner == server.owner {
            return Ok(Json(p.json()));
        }
    }
    let srv = server.clone();
    let found = tokio::task::spawn_blocking(move || srv.store.snapshot(&id, Some(&srv.owner)))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    match found {
        Ok(s) => Ok(Json(ready_json(&s))),
        Err(ImageError::NotFound(m)) => Err(ApiError::not_found("SNAPSHOT::NOT_FOUND", m)),
        Err(e) => Err(image_error(e)),
    }
}

/// `DELETE /snapshots/{id}`: 204; 409 while it is being made; sandboxes made from it keep
/// running (their layers stay until they end).
pub async fn delete(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    {
        let mut pending = lock(&server.snapshots);
        if let Some(p) = pending.get(&id) {
            if p.owner == server.owner {
                if p.state == "Creating" {
                    return Err(ApiError::conflict(format!(
                        "snapshot {id} is still being created"
                    )));
                }
                pending.remove(&id);
                return Ok(StatusCode::NO_CONTENT);
            }
        }
    }
    let srv = server.clone();
    let removed =
        tokio::task::spawn_blocking(move || srv.store.remove_snapshot(&id, Some(&srv.owner)))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
    match removed {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(e) => Err(image_error(e)),
    }
}

/// Takes the snapshot of a pause to disk (`paused:<sandbox id>` is its name): the sandbox
/// frozen, its files written; the caller then tears the sandbox down. Its span and audit
/// record are a snapshot's.
pub async fn pause_to_disk(
    server: &Arc<Server>,
    rec: &Arc<crate::Record>,
    trace: Option<String>,
) -> ApiResult<String> {
    take_now(server, rec, Some(format!("paused:{}", rec.id)), trace).await
}

/// Takes a snapshot of a sandbox's files (frozen while they are written) and answers its id
/// once it is in the store (ready): a pause to disk's, and the E2B API's snapshots (which
/// answer when it is made). Its span and audit record are a snapshot's.
pub async fn take_now(
    server: &Arc<Server>,
    rec: &Arc<crate::Record>,
    name: Option<String>,
    trace: Option<String>,
) -> ApiResult<String> {
    let id = format!("snap-{}", crate::random_token()?);
    let meta = SnapshotMeta {
        id: id.clone(),
        sandbox_id: rec.id.clone(),
        name,
        owner: server.owner.clone(),
        entrypoint: Some(rec.entrypoint.clone()),
        max_bytes: Some(server.limits.max_snapshot),
    };
    let (srv, r) = (server.clone(), rec.clone());
    let start = Instant::now();
    let taken = tokio::task::spawn_blocking(move || {
        agentrun_pool::snapshot::take(&r.sandbox, &srv.store, &meta)
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    let err = taken.as_ref().err().map(|e| e.to_string());
    let span = report(
        SNAPSHOT_SPAN,
        Some(&server.audit),
        &Report {
            sandbox_id: &rec.id,
            snapshot_id: &id,
            image: &rec.image,
            bytes: taken.as_ref().map_or(0, |t| t.made.size),
            duration: start.elapsed(),
            frozen: taken.as_ref().ok().map(|t| t.frozen),
            error: err.as_deref().map(|m| ("snapshot_capture_failed", m)),
            traceparent: trace.as_deref(),
            profile: &server.profile,
        },
    );
    finish_span(span);
    match taken {
        Ok(_) => Ok(id),
        Err(agentrun_pool::PoolError::Image(e @ ImageError::SnapshotTooLarge { .. })) => Err(
            ApiError::bad_request(format!("{e} (agentrun serve --max-snapshot)")),
        ),
        Err(e) => Err(e.into()),
    }
}
