//! E2B's snapshots and fork, on the snapshot machinery of the OpenSandbox front end (issue
//! 31): `POST /sandboxes/{id}/snapshots` (`create_snapshot`), `GET /snapshots`
//! (`list_snapshots`), `DELETE /templates/{id}` of a snapshot (`delete_snapshot`) and
//! `POST /sandboxes/{id}/fork` (`fork`). A sandbox is made from a snapshot by naming its id
//! as the template (`Sandbox.create(snapshot_id)`), which [`crate::control`] turns into the
//! OpenSandbox create's `snapshotId`.
//!
//! A snapshot is the sandbox's files (its writable layer over its image, taken frozen by
//! [`lifecycle::snapshots::take_now`], answered once it is in the store); processes and
//! memory are not kept (E2B's `mode="filesystem"`; `memory: true` is refused). Snapshots
//! belong to the API key that made them (the store's owner is its fingerprint): another
//! key's are not listed, not deleted and not made into sandboxes (404). A fork is the
//! OpenSandbox fork ([`lifecycle::fork::fork_records`]): the parent's files as one shared
//! read-only layer under each copy's own writable layer, all copies or none.

use std::sync::Arc;

use agentrun_opensandbox::{lifecycle, Server};
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::Utc;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{json_body_or_default, E2bError, E2bResult};
use crate::record::{created_json, end_of, record, set_end, template_of, MAX_TIMEOUT_S};

/// Longest snapshot name.
const MAX_NAME: usize = 256;
/// Most copies of one fork (the SDK's own bound).
pub const MAX_FORK_COUNT: u64 = 20;
/// Default and largest page of the snapshot list.
/// The name a pause to disk gives its snapshot (not one of the user's: not listed).
const PAUSED_PREFIX: &str = "paused:";

/// Whether a template names a snapshot (the ids this server hands out).
pub fn is_snapshot_id(template: &str) -> bool {
    template.starts_with("snap-")
}

fn trace(headers: &HeaderMap) -> Option<String> {
    crate::traceparent(headers).map(str::to_owned)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SnapshotRequest {
    name: Option<String>,
    memory: Option<bool>,
}

/// A snapshot request's name, checked; `memory: true` (a full snapshot) is refused.
fn parse_snapshot_request(body: &[u8]) -> E2bResult<Option<String>> {
    let req: SnapshotRequest = json_body_or_default(body)?;
    if req.memory == Some(true) {
        return Err(E2bError::bad_request(
            "memory snapshots are not served by agentrun: a snapshot keeps the sandbox's files (mode=\"filesystem\")",
        ));
    }
    match req.name {
        None => Ok(None),
        Some(n) if n.is_empty() || n.len() > MAX_NAME || n.chars().any(char::is_control) => {
            Err(E2bError::bad_request(format!(
                "name must be 1 to {MAX_NAME} bytes without control characters"
            )))
        }
        Some(n) if is_snapshot_id(&n) || n.starts_with(PAUSED_PREFIX) => Err(
            E2bError::bad_request(format!("name {n:?}: snap- and paused: names are reserved")),
        ),
        Some(n) => Ok(Some(n)),
    }
}

fn info_json(id: &str, name: Option<&str>) -> Value {
    json!({"snapshotID": id, "names": name.map(|n| vec![n.to_owned()]).unwrap_or_default()})
}

/// `POST /sandboxes/{id}/snapshots` (`{"name"?, "memory"?}`): 201 `{"snapshotID", "names"}`
/// once the snapshot is in the store; 404 for no such sandbox, 409 while it is paused, 400
/// over `--max-snapshot`.
pub async fn create_snapshot(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> E2bResult<Response> {
    let name = parse_snapshot_request(&body)?;
    let rec = record(&server, &id)?;
    rec.check_running()?;
    rec.check_not_paused()?;
    let snap = lifecycle::snapshots::take_now(&server, &rec, name.clone(), trace(&headers)).await?;
    Ok((StatusCode::CREATED, Json(info_json(&snap, name.as_deref()))).into_response())
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=`: this API key's snapshots (not those
/// of pauses to disk), oldest first, `x-next-token` when more follow.
pub async fn list_snapshots(
    State(server): State<Arc<Server>>,
    RawQuery(q): RawQuery,
) -> E2bResult<Response> {
    let (mut sandbox, mut name, mut limit, mut start) =
        (None, None, crate::paging::DEFAULT_LIMIT, 0usize);
    for (k, v) in form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "sandboxID" | "sandboxId" => sandbox = Some(v.into_owned()),
            "name" => name = Some(v.into_owned()),
            "limit" => limit = crate::paging::page_limit(&v)?,
            "nextToken" => start = crate::paging::page_start(&v)?,
            _ => {}
        }
    }
    let srv = server.clone();
    let all = tokio::task::spawn_blocking(move || srv.store.snapshots(Some(&srv.owner)))
        .await
        .map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let mut matching: Vec<_> = all
        .into_iter()
        .filter(|s| {
            !s.name
                .as_deref()
                .is_some_and(|n| n.starts_with(PAUSED_PREFIX))
        })
        .filter(|s| sandbox.as_ref().is_none_or(|id| *id == s.sandbox_id))
        .filter(|s| {
            name.as_ref()
                .is_none_or(|n| *n == s.id || s.name.as_ref() == Some(n))
        })
        .collect();
    matching.sort_by(|a, b| a.created.cmp(&b.created));
    let page: Vec<Value> = matching
        .iter()
        .skip(start)
        .take(limit)
        .map(|s| info_json(&s.id, s.name.as_deref()))
        .collect();
    let next = start + page.len();
    let mut resp = Json(Value::Array(page)).into_response();
    if next < matching.len() {
        if let Ok(v) = next.to_string().parse() {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}

/// `DELETE /templates/{id}` (the SDK's `delete_snapshot`): 204; 404 for no snapshot of this
/// API key by that id (a template is an image: not deleted here). Sandboxes made from it
/// keep running.
pub async fn delete_snapshot(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    if !is_snapshot_id(&id) {
        return Err(E2bError::not_found(format!(
            "no snapshot {id} (templates are images of agentrun's store: agentrun image rm)"
        )));
    }
    let srv = server.clone();
    let sid = id.clone();
    let removed = tokio::task::spawn_blocking(move || {
        // One of this key's, and not the snapshot of a pause to disk.
        let s = srv.store.snapshot(&sid, Some(&srv.owner))?;
        if s.name
            .as_deref()
            .is_some_and(|n| n.starts_with(PAUSED_PREFIX))
        {
            return Err(agentrun_image::ImageError::NotFound(sid));
        }
        srv.store.remove_snapshot(&sid, Some(&srv.owner))
    })
    .await
    .map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    match removed {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(agentrun_image::ImageError::NotFound(_)) => {
            Err(E2bError::not_found(format!("no snapshot {id}")))
        }
        Err(e) => Err(E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            e.to_string(),
        )),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ForkRequest {
    timeout: Option<i64>,
    count: Option<u64>,
}

/// A fork body: (copies, their timeout in seconds if given).
fn parse_fork(body: &[u8]) -> E2bResult<(usize, Option<i64>)> {
    let req: ForkRequest = json_body_or_default(body)?;
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORK_COUNT).contains(&count) {
        return Err(E2bError::bad_request(format!(
            "count must be between 1 and {MAX_FORK_COUNT}"
        )));
    }
    if let Some(t) = req.timeout {
        if !(1..=MAX_TIMEOUT_S).contains(&t) {
            return Err(E2bError::bad_request(format!(
                "timeout must be between 1 and {MAX_TIMEOUT_S} seconds"
            )));
        }
    }
    Ok((count as usize, req.timeout))
}

/// `POST /sandboxes/{id}/fork` (`{"count"?, "timeout"?}`): 201 with one
/// `{"sandbox": ...}` a copy (the parent's files; its metadata, template, environment,
/// limits, network and lifecycle; `timeout` seconds, else the parent's end). 404 for no such sandbox,
/// 409 while it is paused.
pub async fn fork(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> E2bResult<Response> {
    let (count, timeout) = parse_fork(&body)?;
    let parent = record(&server, &id)?;
    let made = lifecycle::fork::fork_records(&server, &id, count, trace(&headers))
        .await?
        .made;
    // Its timeout, else the parent's end (an auto-pause parent's is kept apart from its
    // record: the copies, auto-pause too, get it here).
    let end = match timeout {
        Some(t) => Utc::now() + chrono::Duration::seconds(t),
        None => end_of(&parent),
    };
    let out: Vec<Value> = made
        .iter()
        .map(|r| {
            set_end(r, end);
            json!({"sandbox": created_json(r, &template_of(r))})
        })
        .collect();
    Ok((StatusCode::CREATED, Json(Value::Array(out))).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_requests() {
        assert_eq!(parse_snapshot_request(b"").unwrap(), None);
        assert_eq!(parse_snapshot_request(b"{}").unwrap(), None);
        assert_eq!(
            parse_snapshot_request(br#"{"name":"mine","memory":false}"#).unwrap(),
            Some("mine".into())
        );
        for bad in [
            &br#"{"memory":true}"#[..],
            br#"{"name":""}"#,
            br#"{"name":"snap-x"}"#,
            br#"{"name":"a\u0000b"}"#,
            br#"{"other":1}"#,
            b"[",
        ] {
            let e = parse_snapshot_request(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
        let long = format!(r#"{{"name":"{}"}}"#, "x".repeat(MAX_NAME + 1));
        assert!(parse_snapshot_request(long.as_bytes()).is_err());
    }

    #[test]
    fn fork_requests() {
        assert_eq!(parse_fork(b"").unwrap(), (1, None));
        assert_eq!(
            parse_fork(br#"{"count":3,"timeout":60}"#).unwrap(),
            (3, Some(60))
        );
        for bad in [
            &br#"{"count":0}"#[..],
            br#"{"count":21}"#,
            br#"{"count":-1}"#,
            br#"{"timeout":0}"#,
            br#"{"count":"2"}"#,
            br#"{"memory":true}"#,
        ] {
            assert_eq!(parse_fork(bad).unwrap_err().status, StatusCode::BAD_REQUEST);
        }
    }
}
