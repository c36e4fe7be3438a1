//! Metrics (`/metrics`, `/metrics/watch`): the sandbox's CPU and memory use, from its cgroup.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrun_pool::lock;
use axum::body::Bytes;
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::auth::ExecdSandbox;
use crate::error::ApiResult;
use crate::events::{event_queue, stream_response};
use crate::{now_ms, Record, Server};

pub(super) fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route("/metrics", get(now))
        .route("/metrics/watch", get(watch))
        .with_state(server)
}

async fn now(ExecdSandbox(rec): ExecdSandbox) -> ApiResult<Json<Value>> {
    let mut sample = lock(&rec.cpu_sample);
    Ok(Json(metrics_sample(&rec, &mut sample)?))
}

/// `/metrics/watch`: the metrics JSON every second (each followed by a blank line, as the
/// command streams), until the client goes away or the sandbox ends. CPU use is measured
/// over each interval of this stream.
async fn watch(ExecdSandbox(rec): ExecdSandbox) -> ApiResult<Response> {
    let mut sample = (Instant::now(), rec.sandbox.usage()?.cpu_ns);
    let (tx, rx) = event_queue();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            if rec.check_running().is_err() {
                break;
            }
            let Ok(m) = metrics_sample(&rec, &mut sample) else {
                break;
            };
            let mut line = m.to_string();
            line.push_str("\n\n");
            if tx.send(Bytes::from(line)).await.is_err() {
                break; // the client went away
            }
        }
    });
    Ok(stream_response(rx))
}

/// The sandbox's metrics now; CPU use since `sample` (wall time, cgroup CPU ns), which is
/// updated. Also the E2B API's `get_metrics`.
pub fn metrics_sample(rec: &Record, sample: &mut (Instant, u64)) -> ApiResult<Value> {
    let usage = rec.sandbox.usage()?;
    let (cpus, mem_limit) = rec.sandbox.limits();
    let now = Instant::now();
    let pct = {
        let wall = now.duration_since(sample.0).as_nanos() as f64;
        let used = usage.cpu_ns.saturating_sub(sample.1) as f64;
        *sample = (now, usage.cpu_ns);
        if wall > 0.0 {
            (used / wall / cpus * 100.0).clamp(0.0, 100.0)
        } else {
            0.0
        }
    };
    let limit = if usage.memory_limit_bytes > 0 && usage.memory_limit_bytes < u64::MAX / 2 {
        usage.memory_limit_bytes
    } else {
        mem_limit
    };
    Ok(json!({
        "cpu_count": cpus,
        "cpu_used_pct": (pct * 100.0).round() / 100.0,
        "mem_total_mib": limit as f64 / (1u64 << 20) as f64,
        "mem_used_mib": ((usage.memory_bytes as f64 / (1u64 << 20) as f64) * 100.0).round() / 100.0,
        "timestamp": now_ms(),
    }))
}
