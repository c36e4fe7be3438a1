//! `POST /sandboxes/{id}/fork` (`{"count": N}`), an agentrun extension: a live sandbox
//! copied into N new sandboxes that each start with its files.
//!
//! The parent's writable layer is frozen ([`agentrun_pool::snapshot::freeze`]: its overlay
//! upper directory copied as it is, whiteouts and opaque directories included, while the
//! parent is frozen) into one read-only layer, answered as `layerId`. Each copy is made as a
//! create of the parent's image would make it (a pooled shell of that image when one is
//! ready; the shells are taken while the layer is copied), with that layer between the image and the copy's own fresh writable layer in its
//! cell's overlay, and the parent's entrypoint, environment, CPU and memory limits, network
//! policy, metadata, extensions and remaining timeout. Nothing is copied per copy: the layer
//! is shared read-only by all (copy on write by overlayfs) and removed when the last sandbox
//! using it is gone. Each copy is a sandbox of its own (its own cell: pid, mount and ipc
//! namespaces, its own writable layer; its own shell and cgroup) and independent afterwards.
//! All or nothing: a copy that cannot be made removes those made before it (and with them
//! the layer).
//!
//! Code contexts are carried by a *semantic* fork, not a memory fork
//! ([`super::fork_contexts`]): each live context's driver saves its globals into the parent's
//! writable layer before it is frozen, and each copy gets contexts of the same ids that load
//! them before any execution. The answer says `"carried": ["files", "contexts"]` then, with
//! per context the names carried and those not (`contexts`), else `["files"]`.
//!
//! What is not carried: processes and their memory (threads, open files, sockets, what a
//! context's globals cannot pickle), the parent's volumes. CRIU cannot dump a process of an
//! agentrun cell (its Landlock domain refuses CRIU's parasite: docs/opensandbox-compat.md#fork
//! says what was measured), and no process that can still make namespaces holds a context's
//! memory (the zygote never holds run data).
//!
//! Bounds (400 JSON): `count` from 1 to the room under `--max-sandboxes` (shells not lent
//! out), and to what the host's available memory holds of copies as large as the parent's
//! memory limit (or its use, without one); the layer to `--max-snapshot`. One span
//! `sandbox.fork` (sizes, durations, the copies' ids) and one audit record (kind `fork`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrun_pool::lock;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::fork_contexts::{self, ContextFork};
use super::{create_sandbox, only_field, parse_create, sandbox_json};
use crate::error::{ApiError, ApiResult, JsonBody};
use crate::params::traceparent;
use crate::{finish_span, Record, Server};

/// The span of a fork.
pub const FORK_SPAN: &str = "sandbox.fork";

/// `count`, checked: an integer from 1.
fn parse_count(body: &[u8]) -> ApiResult<usize> {
    match only_field(body, "count")? {
        None => Err(ApiError::bad_request("count is required")),
        Some(c) => match c.as_u64() {
            Some(n) if n >= 1 => Ok(n as usize),
            _ => Err(ApiError::bad_request(format!(
                "count must be an integer of at least 1, not {c}"
            ))),
        },
    }
}

/// The host's available memory (`MemAvailable`), bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Refuses a count the daemon cannot hold: the room under `--max-sandboxes`, the host's
/// memory for copies as large as the parent.
fn check_room(server: &Server, rec: &Record, count: usize) -> ApiResult<()> {
    let status = server.live.pool_status();
    let room = status.max_sandboxes.saturating_sub(status.running);
    if count > room {
        return Err(ApiError::bad_request(format!(
            "count {count} is more than the room for sandboxes: {room} (--max-sandboxes {}, {} in use)",
            status.max_sandboxes, status.running
        )));
    }
    let (_, limit) = rec.sandbox.limits();
    let each = if limit > 0 && limit < u64::MAX / 2 {
        limit
    } else {
        rec.sandbox.usage().map(|u| u.memory_bytes).unwrap_or(0)
    };
    if let Some(avail) = mem_available() {
        let need = each.saturating_mul(count as u64);
        if each > 0 && need > avail {
            return Err(ApiError::bad_request(format!(
                "count {count}: {count} copies of {each} bytes of memory each need {need} bytes, the host has {avail} available"
            )));
        }
    }
    Ok(())
}

/// The create request of a copy: the parent's, of the parent's image (whole, so that a
/// copy paused to disk comes back as it was made: from its own snapshot, which holds the
/// frozen layer too).
fn copy_request(rec: &Record) -> Value {
    let mut body = json!({
        "image": {"uri": rec.image},
        "entrypoint": rec.entrypoint,
        "metadata": *lock(&rec.metadata),
        "env": rec.sandbox.env(),
    });
    let (cpus, memory) = rec.sandbox.limits();
    let mut limits = serde_json::Map::new();
    if cpus > 0.0 {
        limits.insert(
            "cpu".into(),
            json!(format!("{}m", (cpus * 1000.0).round() as u64)),
        );
    }
    if memory > 0 && memory < u64::MAX / 2 {
        limits.insert("memory".into(), json!(memory.to_string()));
    }
    if !limits.is_empty() {
        body["resourceLimits"] = Value::Object(limits);
    }
    // The policy in force (changed since create, perhaps), else the one asked for.
    if let Some(e) = &rec.egress {
        body["networkPolicy"] = e.policy().to_value();
    } else if let Some(p) = &rec.network_policy {
        body["networkPolicy"] = p.clone();
    }
    // A copy intercepts TLS too (its environment points at a CA bundle), with a CA and an
    // empty credential vault of its own: credentials are never copied.
    if rec
        .egress
        .as_ref()
        .is_some_and(crate::egress::SandboxEgress::credential_proxy)
    {
        body["credentialProxy"] = json!({"enabled": true});
    }
    if let Some(x) = &rec.extensions {
        body["extensions"] = x.clone();
    }
    if let Some(expires) = *lock(&rec.expires_at) {
        let left = (expires - chrono::Utc::now()).num_seconds().max(1);
        body["timeout"] = json!(left);
    }
    body
}

struct Outcome<'a> {
    parent: &'a str,
    layer_id: &'a str,
    count: usize,
    bytes: u64,
    freeze: Duration,
    copies: Duration,
    total: Duration,
    ids: &'a [String],
    contexts: &'a [ContextFork],
    error: Option<(&'a str, &'a str)>,
}

/// What a fork made: the shared layer, the copies (in order) and the parent's contexts as
/// carried into each copy.
pub struct Forked {
    pub layer_id: String,
    pub made: Vec<Arc<Record>>,
    pub contexts: Vec<ContextFork>,
}

impl Forked {
    /// What the copies carry: `files`, and `contexts` when a context's globals were.
    pub fn carried(&self) -> Vec<&'static str> {
        carried(&self.contexts)
    }
}

fn carried(contexts: &[ContextFork]) -> Vec<&'static str> {
    if contexts.iter().any(ContextFork::saved) {
        vec!["files", "contexts"]
    } else {
        vec!["files"]
    }
}

fn report(server: &Server, trace: Option<&str>, o: &Outcome<'_>) {
    let mut span = agentrun_telemetry::RunSpan::started_ago(FORK_SPAN, trace, o.total);
    span.set_attribute("openinference.span.kind", "TOOL");
    span.set_attribute("sandbox.id", o.parent);
    span.set_attribute("sandbox.fork.layer.id", o.layer_id);
    span.set_attribute("sandbox.fork.count", o.count as i64);
    span.set_attribute("sandbox.fork.ids", o.ids.join(","));
    span.set_attribute("sandbox.fork.layer.bytes", o.bytes as i64);
    span.set_attribute("sandbox.fork.freeze_ms", o.freeze.as_millis() as i64);
    span.set_attribute("sandbox.fork.copies_ms", o.copies.as_millis() as i64);
    span.set_attribute("sandbox.duration_ms", o.total.as_millis() as i64);
    span.set_attribute("sandbox.fork.memory", false);
    span.set_attribute("sandbox.fork.carried", carried(o.contexts).join(","));
    let not_carried = fork_contexts::not_carried(o.contexts);
    if !o.contexts.is_empty() {
        let saved = o.contexts.iter().filter(|c| c.saved()).count();
        span.set_attribute("sandbox.fork.contexts", saved as i64);
        span.set_attribute("sandbox.fork.contexts.not_carried", not_carried.join(","));
    }
    span.set_attribute("sandbox.profile", server.profile.as_str());
    if let Some((kind, msg)) = o.error {
        span.set_error(kind, msg);
    }
    let work = agentrun_pool::snapshot::WorkDone {
        kind: "fork",
        action: FORK_SPAN,
        sandbox_id: o.parent,
        resource: o.layer_id,
        error: o.error,
        profile: &server.profile,
    };
    let record = work.record(&span, || {
        let (count, ids, ms) = (o.count, o.ids.join(","), o.total.as_millis());
        let mut text = format!(
            "{count} copies ({ids}) of {} bytes of files in {ms} ms",
            o.bytes
        );
        if !o.contexts.is_empty() {
            let saved = o.contexts.iter().filter(|c| c.saved()).count();
            text.push_str(&format!(
                " and {saved} of {} code contexts (not carried: {})",
                o.contexts.len(),
                if not_carried.is_empty() {
                    "none".to_string()
                } else {
                    not_carried.join(",")
                }
            ));
        }
        text
    });
    if let Err(e) = server.audit.append(&record) {
        tracing::error!(target: "agentrun::opensandbox::fork", sandbox = %o.parent, "audit log: {e}");
    }
    finish_span(span);
}

/// `POST /sandboxes/{id}/fork`.
pub async fn fork(
    State(server): State<Arc<Server>>,
    Path(parent_id): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let count = parse_count(&body)?;
    let forked = fork_records(&server, &parent_id, count, traceparent(&headers)).await?;
    let mut answer = json!({
        "sandboxId": parent_id,
        "layerId": forked.layer_id,
        "carried": forked.carried(),
        "sandboxes": forked.made.iter().map(|r| sandbox_json(r)).collect::<Vec<_>>(),
    });
    if !forked.contexts.is_empty() {
        answer["contexts"] = forked.contexts.iter().map(ContextFork::to_json).collect();
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// Forks sandbox `parent_id` into `count` copies (the OpenSandbox API's fork and the E2B
/// API's): the id of the shared layer, the copies' records, in order, and the contexts
/// carried. All or nothing.
pub async fn fork_records(
    server: &Arc<Server>,
    parent_id: &str,
    count: usize,
    trace: Option<String>,
) -> ApiResult<Forked> {
    let start = Instant::now();
    let server = server.clone();
    let parent_id = parent_id.to_owned();
    let rec = server.record(&parent_id)?;
    rec.check_running()?;
    rec.check_not_paused()?;
    check_room(&server, &rec, count)?;

    let layer_id = format!("fork-{}", crate::random_token()?);
    // The fork's span and audit record, failed (`error`) or not.
    let outcome = |bytes,
                   freeze,
                   copies,
                   ids: &[String],
                   contexts: &[ContextFork],
                   error: Option<&ApiError>| {
        report(
            &server,
            trace.as_deref(),
            &Outcome {
                parent: &parent_id,
                layer_id: &layer_id,
                count,
                bytes,
                freeze,
                copies,
                total: start.elapsed(),
                ids,
                contexts,
                error: error.map(|e| (e.code, e.message.as_str())),
            },
        )
    };
    let fail = |error: &ApiError, bytes, freeze, contexts: &[ContextFork]| {
        outcome(bytes, freeze, Duration::ZERO, &[], contexts, Some(error))
    };
    // A first check of the size (not frozen: the freeze holds it again).
    let max = server.limits.max_snapshot;
    let rec2 = rec.clone();
    let (below, now) = tokio::task::spawn_blocking(move || {
        let below: u64 = rec2
            .sandbox
            .frozen_dirs()
            .iter()
            .map(|d| agentrun_image::snapshot::tree_bytes(d))
            .sum();
        (below, rec2.sandbox.writable_layer_bytes())
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    if let Ok(now) = now {
        if now + below > max {
            let e = agentrun_image::ImageError::SnapshotTooLarge {
                bytes: now + below,
                max,
            };
            let err = ApiError::bad_request(format!("{e} (agentrun serve --max-snapshot)"));
            fail(&err, 0, start.elapsed(), &[]);
            return Err(err);
        }
    }

    // The copies are asked for first: each takes its shell (a pooled one of the parent's
    // image, or one made now) while the layer is made, and waits for the layer only to make
    // its cell.
    let pending = agentrun_pool::snapshot::PendingLayer::new();
    let copy_body =
        serde_json::to_vec(&copy_request(&rec)).map_err(|e| ApiError::internal(e.to_string()))?;
    let (cpus, memory) = rec.sandbox.limits();
    let env: Vec<(String, String)> = rec
        .sandbox
        .env()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Made side by side (each its own shell: the copies' creation overlaps).
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..count {
        let (server, copy_body, env, pending) = (
            server.clone(),
            copy_body.clone(),
            env.clone(),
            pending.clone(),
        );
        let trace = trace.clone().unwrap_or_default();
        tasks.spawn(async move {
            let (req, mut v) = parse_create(&copy_body)?;
            v.spec.profile = server.profile.clone();
            v.spec.cpus = (cpus > 0.0).then_some(cpus);
            v.spec.memory_bytes = (memory > 0 && memory < u64::MAX / 2).then_some(memory);
            v.spec.env = env;
            v.spec.frozen = Some(pending);
            let body = axum::body::Bytes::from(copy_body);
            create_sandbox(&server, &req, v, trace, &body, None)
                .await
                .map(|r| (n, r))
        });
    }

    // The parent's code contexts: held (no execution until the freeze is done), each
    // driver saving its globals into the writable layer about to be frozen.
    let contexts = crate::code::contexts(&rec);
    let defaults = lock(&rec.code).defaults.clone();
    let held = fork_contexts::save(&rec, &contexts, &layer_id).await;

    // The parent's files, frozen while they are copied, as one read-only layer.
    let (srv, rec2, id2) = (server.clone(), rec.clone(), layer_id.clone());
    let taken = tokio::task::spawn_blocking(move || {
        let dir = srv.live.frozen_dir();
        agentrun_pool::snapshot::freeze(&rec2.sandbox, dir, &id2, Some(max))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))
    .and_then(|t| {
        t.map_err(|e| match e {
            agentrun_pool::PoolError::Image(agentrun_image::ImageError::SnapshotTooLarge {
                ..
            }) => ApiError::bad_request(format!("{e} (agentrun serve --max-snapshot)")),
            e => ApiError::from(e),
        })
    });
    // The saved globals out of the parent (the frozen layer has them), its contexts let go.
    let mut forks = held.release().await;
    let freeze_time = start.elapsed();
    let (bytes, freeze_failed) = match taken {
        Ok(t) => {
            let bytes = t.made.bytes();
            pending.set(Ok(t.made));
            (bytes, None)
        }
        Err(e) => {
            // The waiting creates say the message (the code is the fork's answer's).
            pending.set(Err(Arc::from(
                Box::<dyn std::error::Error + Send + Sync>::from(e.message.clone()),
            )));
            (0, Some(e))
        }
    };
    let copies_start = Instant::now();
    let mut made: Vec<(usize, Arc<Record>)> = Vec::with_capacity(count);
    let mut failed: Option<ApiError> = freeze_failed;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(r)) => made.push(r),
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Err(e) => failed = failed.or(Some(ApiError::internal(e.to_string()))),
        }
    }
    // The copies hold the layer now (or failed): it goes with the last of them.
    pending.clear();
    made.sort_by_key(|(n, _)| *n);
    // Each copy's contexts, loaded before any execution (side by side).
    if failed.is_none() && !forks.is_empty() {
        let mut loading = tokio::task::JoinSet::new();
        for (n, r) in &made {
            let (server, r, f, d, n) = (
                server.clone(),
                r.clone(),
                forks.clone(),
                defaults.clone(),
                *n,
            );
            loading.spawn(async move {
                fork_contexts::restore(&server, &r, &f, &d)
                    .await
                    .map(|l| (n, l))
            });
        }
        let mut loads = Vec::with_capacity(made.len());
        while let Some(joined) = loading.join_next().await {
            match joined {
                Ok(Ok(l)) => loads.push(l),
                Ok(Err(e)) => failed = failed.or(Some(e)),
                Err(e) => failed = failed.or(Some(ApiError::internal(e.to_string()))),
            }
        }
        loads.sort_by_key(|(n, _)| *n);
        let loads: Vec<_> = loads.into_iter().map(|(_, l)| l).collect();
        fork_contexts::merge_loads(&mut forks, &loads);
    }
    if let Some(e) = failed {
        // All or nothing: the copies made go (and the layer with the last of them).
        for (_, r) in made.drain(..) {
            if let Err(e) = super::delete_sandbox(&server, &r.id).await {
                tracing::warn!(target: "agentrun::opensandbox::lifecycle", "deleting fork copy {} after a failed fork: {e}", r.id);
            }
        }
        fail(&e, bytes, freeze_time, &forks);
        return Err(e);
    }
    let made: Vec<Arc<Record>> = made.into_iter().map(|(_, r)| r).collect();
    let ids: Vec<String> = made.iter().map(|r| r.id.clone()).collect();
    outcome(
        bytes,
        freeze_time,
        copies_start.elapsed(),
        &ids,
        &forks,
        None,
    );
    Ok(Forked {
        layer_id,
        made,
        contexts: forks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_is_checked() {
        assert_eq!(parse_count(br#"{"count": 3}"#).unwrap(), 3);
        for bad in [
            &br#"{"count": 0}"#[..],
            br#"{"count": -1}"#,
            br#"{"count": 1.5}"#,
            br#"{"count": "2"}"#,
            br#"{}"#,
            br#"[]"#,
            br#"{"count": 1, "memory": true}"#,
            b"nope",
        ] {
            let e = parse_count(bad).unwrap_err();
            assert_eq!(
                e.status,
                StatusCode::BAD_REQUEST,
                "{:?}",
                std::str::from_utf8(bad)
            );
        }
    }
}
