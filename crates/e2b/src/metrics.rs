//! E2B's sandbox metrics, from the sandbox's cgroup (the OpenSandbox front end's execd
//! metrics, [`metrics_sample`]): `GET /sandboxes/{id}/metrics` (`get_metrics`: one sample,
//! now) and `GET /sandboxes/metrics?sandbox_ids=a,b` (the latest sample of each). CPU use is
//! measured since the sandbox's previous sample (its start for the first); memory is the
//! cgroup's use and limit (the host's memory without a limit); disk is the sandbox's
//! writable layer (its changed files), its total the `--max-snapshot` bound on what a
//! snapshot keeps.

use std::sync::Arc;

use agentrun_opensandbox::execd::metrics::metrics_sample;
use agentrun_opensandbox::{Record, SandboxState, Server};
use agentrun_pool::lock;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use chrono::Utc;
use serde_json::{json, Map, Value};

use crate::error::{E2bError, E2bResult};
use crate::record::record;

/// Most sandboxes one `/sandboxes/metrics` asks for.
const MAX_IDS: usize = 100;

/// The host's memory, bytes.
fn host_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            let l = t.lines().find(|l| l.starts_with("MemTotal:"))?.to_owned();
            l.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}

/// One `SandboxMetric` of a running sandbox (`None` when it is paused or gone).
fn sample(server: &Server, rec: &Record) -> E2bResult<Option<Value>> {
    if rec.check_running().is_err() || rec.state().0 == SandboxState::Paused {
        return Ok(None);
    }
    let m = {
        let mut s = lock(&rec.cpu_sample);
        metrics_sample(rec, &mut s)?
    };
    let mib = (1u64 << 20) as f64;
    let mem_used = (m["mem_used_mib"].as_f64().unwrap_or(0.0) * mib) as u64;
    let mem_total = match (m["mem_total_mib"].as_f64().unwrap_or(0.0) * mib) as u64 {
        0 => host_memory(),
        t if t >= u64::MAX / 4 => host_memory(),
        t => t,
    };
    let disk_used = rec.sandbox.writable_layer_bytes().unwrap_or(0);
    let now = Utc::now();
    Ok(Some(json!({
        "timestamp": agentrun_opensandbox::rfc3339(now),
        "timestampUnix": now.timestamp(),
        "cpuCount": m["cpu_count"].as_f64().map_or(1, |c| c.ceil().max(1.0) as i64),
        "cpuUsedPct": m["cpu_used_pct"].as_f64().unwrap_or(0.0),
        "memUsed": mem_used,
        "memTotal": mem_total,
        "memCache": 0,
        "diskUsed": disk_used,
        "diskTotal": server.limits.max_snapshot,
    })))
}

/// `GET /sandboxes/{id}/metrics?start=&end=`: `[sample]` now (`[]` while it is paused);
/// `start`/`end` are Unix seconds, checked (a past window holds nothing: samples are not kept).
pub async fn one(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> E2bResult<Json<Value>> {
    let (mut start, mut end) = (None, None);
    for (k, v) in form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes()) {
        let t = || {
            v.parse::<i64>()
                .ok()
                .filter(|t| *t >= 0)
                .ok_or_else(|| E2bError::bad_request(format!("{k} must be Unix seconds")))
        };
        match k.as_ref() {
            "start" => start = Some(t()?),
            "end" => end = Some(t()?),
            _ => {}
        }
    }
    if let (Some(s), Some(e)) = (start, end) {
        if s > e {
            return Err(E2bError::bad_request("start is after end"));
        }
    }
    let rec = record(&server, &id)?;
    let now = Utc::now().timestamp();
    if end.is_some_and(|e| e < now - 1) || start.is_some_and(|s| s > now + 1) {
        return Ok(Json(json!([])));
    }
    let srv = server.clone();
    let s = tokio::task::spawn_blocking(move || sample(&srv, &rec))
        .await
        .map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    Ok(Json(Value::Array(s.into_iter().collect())))
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: `{"sandboxes": {id: sample}}` of those running
/// (unknown ids are left out, as E2B does); 1 to 100 ids.
pub async fn many(
    State(server): State<Arc<Server>>,
    RawQuery(q): RawQuery,
) -> E2bResult<Json<Value>> {
    let mut ids: Vec<String> = Vec::new();
    for (k, v) in form_urlencoded::parse(q.as_deref().unwrap_or("").as_bytes()) {
        if k == "sandbox_ids" {
            ids.extend(
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    if ids.is_empty() || ids.len() > MAX_IDS {
        return Err(E2bError::bad_request(format!(
            "sandbox_ids: 1 to {MAX_IDS} sandbox ids, comma-separated"
        )));
    }
    let srv = server.clone();
    let out = tokio::task::spawn_blocking(move || {
        let mut out = Map::new();
        for id in ids {
            if let Ok(rec) = srv.record(&id) {
                if let Ok(Some(s)) = sample(&srv, &rec) {
                    out.insert(id, s);
                }
            }
        }
        out
    })
    .await
    .map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Json(json!({"sandboxes": out})))
}
