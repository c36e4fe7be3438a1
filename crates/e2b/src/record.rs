//! A sandbox's OpenSandbox [`Record`] as the E2B API sees it: looked up by id, its template,
//! when it ends (or pauses) and the `Sandbox` JSON create, connect and fork answer. Below
//! [`crate::control`], [`crate::snapshots`] and [`crate::metrics`], which all use it.

use std::sync::Arc;

use agentrun_opensandbox::{Record, Server};
use agentrun_pool::lock;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::error::{E2bError, E2bResult};

/// Longest timeout (E2B's: 24 hours).
pub const MAX_TIMEOUT_S: i64 = 86_400;

/// Where E2B keeps its template id in the record (its `extensions`).
pub(crate) const TEMPLATE_KEY: &str = "e2b.templateID";

pub(crate) fn record(server: &Server, id: &str) -> E2bResult<Arc<Record>> {
    server
        .record(id)
        .map_err(|_| E2bError::not_found(format!("sandbox {id} not found")))
}

pub(crate) fn template_of(rec: &Record) -> String {
    rec.extensions
        .as_ref()
        .and_then(|x| x.get(TEMPLATE_KEY))
        .and_then(Value::as_str)
        .unwrap_or(&rec.image)
        .to_owned()
}

pub(crate) fn end_of(rec: &Record) -> DateTime<Utc> {
    if let Some(end) = crate::autopause::end_of(&rec.id) {
        return end;
    }
    lock(&rec.expires_at).unwrap_or(rec.created_at + chrono::Duration::seconds(MAX_TIMEOUT_S))
}

/// Sets when a running sandbox ends: killed then (its OpenSandbox expiry), or paused then
/// if it was made with `autoPause`.
pub(crate) fn set_end(rec: &Record, end: DateTime<Utc>) {
    if crate::autopause::Lifecycle::of(rec).is_some() {
        *lock(&rec.expires_at) = None;
        crate::autopause::set_end(&rec.id, end);
    } else {
        *lock(&rec.expires_at) = Some(end);
    }
}

/// The `Sandbox` JSON create and connect answer.
pub(crate) fn created_json(rec: &Record, template: &str) -> Value {
    json!({
        "templateID": template,
        "sandboxID": rec.id,
        "clientID": crate::CLIENT_ID,
        "envdVersion": crate::ENVD_VERSION,
        "envdAccessToken": rec.execd_token,
        // The code interpreter SDK authenticates some requests with this one only.
        "trafficAccessToken": rec.execd_token,
        "domain": null,
    })
}
