//! E2B's lifecycle `on_timeout: "pause"` (`autoPause`, with `autoPauseMemory`) and
//! `auto_resume` (`autoResume.enabled`): a sandbox made with `autoPause` is paused at the end
//! of its timeout instead of killed (in memory, or its files to disk with
//! `autoPauseMemory: false`), and one made with `autoResume` too is resumed by the next
//! request to its envd or code interpreter, for its create timeout again.
//!
//! Such a sandbox has no OpenSandbox expiry (its record's `expires_at` stays `None`, so the
//! OpenSandbox expiry loop never kills it); its end is kept here ([`ends`], by sandbox id:
//! ids are unique in the daemon) and [`pause_loop`] pauses it when due. What it was made
//! with is in its record's extensions (`e2b.lifecycle`), read by [`Lifecycle::of`].

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use agentrun_opensandbox::{lifecycle, Record, SandboxState, Server};
use agentrun_pool::lock;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::error::{E2bError, E2bResult};

/// The key of the lifecycle in a record's extensions.
pub const LIFECYCLE_KEY: &str = "e2b.lifecycle";

/// The end of every running auto-pause sandbox, by id.
pub fn ends() -> &'static Mutex<HashMap<String, DateTime<Utc>>> {
    static ENDS: LazyLock<Mutex<HashMap<String, DateTime<Utc>>>> =
        LazyLock::new(|| Mutex::new(HashMap::new()));
    &ENDS
}

/// Resumes one at a time: two requests to a paused sandbox resume it once.
static RESUMING: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(|| tokio::sync::Mutex::new(()));

/// What an auto-pause sandbox was made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifecycle {
    /// Paused with its memory (frozen), else its files to disk.
    pub memory: bool,
    /// Resumed by a request to it.
    pub auto_resume: bool,
    /// Its create timeout, seconds (what a resume gives it again).
    pub timeout_s: i64,
}

impl Lifecycle {
    /// The extension value of a lifecycle.
    pub fn to_value(self) -> Value {
        json!({"memory": self.memory, "autoResume": self.auto_resume, "timeout": self.timeout_s})
    }

    /// The lifecycle of an auto-pause sandbox (`None`: killed at its timeout).
    pub fn of(rec: &Record) -> Option<Lifecycle> {
        let v = rec.extensions.as_ref()?.get(LIFECYCLE_KEY)?;
        Some(Lifecycle {
            memory: v["memory"].as_bool()?,
            auto_resume: v["autoResume"].as_bool()?,
            timeout_s: v["timeout"].as_i64()?,
        })
    }
}

/// Sets the end of an auto-pause sandbox.
pub fn set_end(id: &str, end: DateTime<Utc>) {
    lock(ends()).insert(id.to_owned(), end);
}

/// Its end, if it is an auto-pause sandbox that runs.
pub fn end_of(id: &str) -> Option<DateTime<Utc>> {
    lock(ends()).get(id).copied()
}

/// Forgets a sandbox (killed, or paused: a paused sandbox does not expire).
pub fn forget(id: &str) {
    lock(ends()).remove(id);
}

/// Pauses a running sandbox (in memory: its processes frozen; else its files to disk and
/// the sandbox torn down); a paused sandbox does not end. `pause` and the auto-pause.
pub async fn pause(
    server: &Arc<Server>,
    rec: &Arc<Record>,
    memory: bool,
    trace: Option<String>,
) -> E2bResult<()> {
    if memory {
        rec.sandbox
            .pause()
            .map_err(|e| E2bError::from(agentrun_opensandbox::ApiError::from(e)))?;
        rec.set_state(SandboxState::Paused);
    } else {
        lifecycle::pause_to_disk(server, rec, trace).await?;
    }
    forget(&rec.id);
    *lock(&rec.expires_at) = None;
    Ok(())
}

/// Pauses every auto-pause sandbox whose end has come (every 250 ms, until the listener
/// ends); one that cannot be paused is killed, as E2B's timeout would.
pub async fn pause_loop(server: Arc<Server>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let now = Utc::now();
        let due: Vec<String> = lock(ends())
            .iter()
            .filter(|(_, end)| **end <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            let Ok(rec) = server.record(&id) else {
                forget(&id); // gone
                continue;
            };
            let memory = Lifecycle::of(&rec).is_none_or(|l| l.memory);
            if rec.state().0 == SandboxState::Paused {
                forget(&id);
                continue;
            }
            if let Err(e) = pause(&server, &rec, memory, None).await {
                tracing::warn!(target: "agentrun::e2b", sandbox = %id, "auto-pause failed, killing it: {}", e.message);
                forget(&id);
                if let Err(e) = lifecycle::delete_sandbox(&server, &id).await {
                    tracing::warn!(target: "agentrun::e2b", "deleting sandbox {id} after a failed auto-pause: {e}");
                }
            }
        }
    }
}

/// The sandbox of an envd or code interpreter request, resumed first if it is paused and
/// was made with `autoResume` (for its create timeout again). Others are handed back as
/// they are.
pub async fn resume_if_asked(server: &Arc<Server>, rec: Arc<Record>) -> E2bResult<Arc<Record>> {
    let Some(l) = Lifecycle::of(&rec).filter(|l| l.auto_resume) else {
        return Ok(rec);
    };
    if rec.state().0 != SandboxState::Paused {
        return Ok(rec);
    }
    let _one = RESUMING.lock().await;
    // Resumed by another request meanwhile (perhaps made again from disk: a new record).
    let rec = server
        .record(&rec.id)
        .map_err(|_| E2bError::not_found(format!("sandbox {} not found", rec.id)))?;
    if rec.state().0 != SandboxState::Paused {
        return Ok(rec);
    }
    let on_disk = lock(&rec.on_disk).clone();
    let rec = match on_disk {
        Some(snapshot_id) => {
            lifecycle::resume_from_disk(server, &rec, &snapshot_id, &Default::default()).await?;
            server
                .record(&rec.id)
                .map_err(|_| E2bError::not_found(format!("sandbox {} not found", rec.id)))?
        }
        None => {
            rec.sandbox
                .resume()
                .map_err(|e| E2bError::from(agentrun_opensandbox::ApiError::from(e)))?;
            rec.set_state(SandboxState::Running);
            rec
        }
    };
    *lock(&rec.expires_at) = None;
    set_end(&rec.id, Utc::now() + chrono::Duration::seconds(l.timeout_s));
    Ok(rec)
}
