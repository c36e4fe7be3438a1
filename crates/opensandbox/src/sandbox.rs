//! The API's state: every sandbox it serves, as a [`Record`] (the OpenSandbox view of one of
//! the pool's live sandboxes: its tokens, state, metadata, expiry, commands, sessions and
//! code contexts), kept by the [`Server`]; and a sandbox's lifecycle [`SandboxState`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use agentrun_pool::live::{LiveManager, LiveSandbox};
use agentrun_pool::lock;
use agentrun_pool::output_log::LogBudget;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{not_json, ApiError, ApiResult, JsonBody};
use crate::held::{CodeState, Command, PendingSnapshot, SandboxEgress, Session};
use crate::Limits;

/// A sandbox's lifecycle state, as the lifecycle API spells it (`SandboxState` of the
/// OpenSandbox spec; agentrun has no transitional states: pause, resume and delete are done
/// before they answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxState {
    Running,
    Paused,
    /// Deleted, or its entrypoint exited with code 0.
    Terminated,
    /// Its entrypoint exited with another code.
    Failed,
}

impl SandboxState {
    /// The wire name (`"Running"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Running => "Running",
            SandboxState::Paused => "Paused",
            SandboxState::Terminated => "Terminated",
            SandboxState::Failed => "Failed",
        }
    }
}

/// Shared state of the API.
pub struct Server {
    pub live: Arc<LiveManager>,
    pub store: agentrun_image::ImageStore,
    pub api_key: Option<String>,
    pub listen: SocketAddr,
    /// The `Host`/`Origin` checks of the listener.
    pub guard: Arc<agentrun_webguard::HostGuard>,
    pub limits: Limits,
    /// The profile of every sandbox ([`crate::OpenSandboxOptions::profile`]).
    pub profile: String,
    /// Where host volumes may come from ([`crate::OpenSandboxOptions::volume_roots`]).
    pub volume_roots: agentrun_runtime::volume::VolumeRoots,
    /// Extra upstream roots of intercepting egress proxies ([`crate::OpenSandboxOptions::upstream_roots`]).
    pub upstream_roots: Vec<std::path::PathBuf>,
    /// The named volumes (`$AGENTRUN_ROOT/volumes`).
    pub volume_store: agentrun_runtime::volume::VolumeStore,
    /// The runtime reading process output (see [`execd`]).
    pub output: tokio::runtime::Handle,
    pub audit: agentrun_telemetry::AuditLog,
    pub(crate) records: Mutex<HashMap<String, Arc<Record>>>,
    /// Snapshots being taken or failed (the ready ones are in the store).
    pub snapshots: Mutex<HashMap<String, PendingSnapshot>>,
    /// Who this server's snapshots belong to: the API key's fingerprint (empty without a
    /// key).
    pub owner: String,
}

impl Server {
    pub(crate) fn records_lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Record>>> {
        lock(&self.records)
    }

    pub fn record(&self, id: &str) -> ApiResult<Arc<Record>> {
        self.records_lock()
            .get(id)
            .cloned()
            .ok_or_else(|| ApiError::not_found("SANDBOX::NOT_FOUND", format!("no sandbox {id}")))
    }

    pub fn insert(&self, rec: Arc<Record>) {
        self.records_lock().insert(rec.id.clone(), rec);
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Record>> {
        self.records_lock().remove(id)
    }

    pub fn all(&self) -> Vec<Arc<Record>> {
        let mut v: Vec<_> = self.records_lock().values().cloned().collect();
        v.sort_by_key(|r| r.created_at);
        v
    }
}

/// The OpenSandbox view of one live sandbox.
/// Least time between two renewals on access of one sandbox (upstream's default
/// `min_interval_seconds`).
pub const ACCESS_RENEW_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

pub struct Record {
    pub id: String,
    pub sandbox: Arc<LiveSandbox>,
    /// The execd token (`X-EXECD-ACCESS-TOKEN`) and the egress one.
    pub execd_token: String,
    pub egress_token: String,
    pub image: String,
    /// The snapshot it was made from (its `image` is then the snapshot's image).
    pub snapshot_id: Option<String>,
    /// Its create request as sent: a pause to disk makes it again from this (and its
    /// snapshot) when it resumes.
    pub create_body: axum::body::Bytes,
    /// Paused to disk: the snapshot holding its files (its processes and shell are gone).
    pub on_disk: Mutex<Option<String>>,
    pub entrypoint: Vec<String>,
    /// The shell commands run under (`/bin/bash` if the image has it), found once.
    pub shell: std::sync::OnceLock<&'static str>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Mutex<Option<DateTime<Utc>>>,
    pub metadata: Mutex<BTreeMap<String, String>>,
    pub network_policy: Option<serde_json::Value>,
    /// The enforced network policy and its proxy (`None`: no networkPolicy, no network).
    pub egress: Option<SandboxEgress>,
    pub extensions: Option<serde_json::Value>,
    /// Its state and when it entered it.
    pub state: Mutex<(SandboxState, DateTime<Utc>)>,
    /// Why the sandbox ended by itself (its entrypoint exited): status reason and message.
    pub ended: Mutex<Option<(&'static str, String)>>,
    /// The thread that makes sockets in its network namespace (the port proxy), once needed.
    pub netns: std::sync::OnceLock<agentrun_runtime::netns::NetnsSockets>,
    /// Set once its processes are killed and its teardown is under way.
    pub torn_down: std::sync::atomic::AtomicBool,
    pub commands: Mutex<HashMap<String, Arc<Command>>>,
    /// What all its command logs hold together (bounded: `SANDBOX_LOG_BUDGET`).
    pub log_budget: Arc<LogBudget>,
    /// How many finished commands (not the entrypoint) `commands` holds.
    pub finished_commands: std::sync::atomic::AtomicUsize,
    pub sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// The stdin pipes of its running processes that were started with one, by process id
    /// (the E2B API's `SendInput`; closed by dropping).
    pub stdin: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<agentrun_pool::stdio::StdioStream>>>>,
    pub code: Mutex<CodeState>,
    /// Last CPU sample (wall time, cgroup CPU ns) for `cpu_used_pct`.
    pub cpu_sample: Mutex<(Instant, u64)>,
    /// `extensions["access.renew.extend.seconds"]` ([`Record::renew_on_access`]).
    pub access_renew_s: Option<i64>,
    /// When traffic last renewed it.
    pub access_renewed: Mutex<Option<Instant>>,
    /// The named volumes it holds (in use until it is torn down).
    pub volumes: Mutex<Vec<crate::lifecycle::volumes::HeldVolume>>,
}

impl Record {
    /// Its state and when it entered it.
    pub fn state(&self) -> (SandboxState, DateTime<Utc>) {
        *lock(&self.state)
    }

    pub fn set_state(&self, s: SandboxState) {
        *lock(&self.state) = (s, Utc::now());
    }

    /// `Err` (409) while the sandbox is paused: nothing new starts in it, no file is touched.
    pub fn check_not_paused(&self) -> ApiResult<()> {
        if self.state().0 == SandboxState::Paused {
            return Err(ApiError::conflict("the sandbox is paused"));
        }
        Ok(())
    }

    /// Kills every process of the sandbox now and tears it down (mounts, cgroups, state) in
    /// the background; once only, whoever asks first (delete, expiry, the entrypoint's exit).
    pub fn tear_down(&self, live: &Arc<LiveManager>) {
        if self
            .torn_down
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let proxy = self.egress.as_ref().and_then(SandboxEgress::take_proxy);
        let volumes = std::mem::take(&mut *lock(&self.volumes));
        // The egress proxy goes first: its socket lives in the state dir the delete removes;
        // the volumes last, once no process of the sandbox has them mounted.
        live.tear_down(
            &self.sandbox,
            move || {
                if let Some(p) = proxy {
                    p.stop();
                }
            },
            move || crate::lifecycle::volumes::release(volumes, false),
        );
    }

    /// The sandbox's main process exited with `code`: like a container whose main process
    /// ends, the sandbox stops (every process killed, torn down). It stays listed, as
    /// `Terminated` (code 0) or `Failed`, until deleted or expired.
    pub fn entrypoint_exited(&self, live: &Arc<LiveManager>, code: i32) {
        if self.torn_down.load(std::sync::atomic::Ordering::SeqCst) {
            return; // deleted or expired: that is why it exited
        }
        let (state, reason) = if code == 0 {
            (SandboxState::Terminated, "ENTRYPOINT_EXITED")
        } else {
            (SandboxState::Failed, "ENTRYPOINT_FAILED")
        };
        *lock(&self.ended) = Some((reason, format!("the entrypoint exited with code {code}")));
        self.set_state(state);
        self.tear_down(live);
    }

    /// Traffic reached it through the server proxy: with an `access.renew.extend.seconds`
    /// extension and an expiry, the expiry becomes at least now + that many seconds, as
    /// upstream's renew-on-access does (at most once per [`ACCESS_RENEW_INTERVAL`]).
    pub fn renew_on_access(&self) {
        let Some(extend) = self.access_renew_s else {
            return;
        };
        let mut last = lock(&self.access_renewed);
        if last.is_some_and(|t| t.elapsed() < ACCESS_RENEW_INTERVAL) {
            return;
        }
        let mut expires = lock(&self.expires_at);
        if let Some(current) = *expires {
            let candidate = Utc::now() + chrono::Duration::seconds(extend);
            *expires = Some(candidate.max(current));
            *last = Some(Instant::now());
        }
    }

    /// `Err` (409) once the sandbox has ended by itself.
    pub fn check_running(&self) -> ApiResult<()> {
        match &*lock(&self.ended) {
            Some((_, why)) => Err(ApiError::conflict(format!(
                "sandbox {} is not running: {why}",
                self.id
            ))),
            None => Ok(()),
        }
    }
}

/// A [`JsonBody`] is read within this server's `max_request_body` (413 above it), and only as
/// JSON (415 otherwise).
impl FromRequest<Arc<Server>> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, server: &Arc<Server>) -> Result<Self, ApiError> {
        let json = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(agentrun_webguard::is_json);
        let empty = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() == b"0");
        if !json && !empty && req.headers().contains_key(axum::http::header::CONTENT_TYPE) {
            return Err(not_json());
        }
        let body = Bytes::from_request(req, server).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(format!(
                    "request body larger than {} bytes (agentrun serve --max-request-body)",
                    server.limits.max_request_body
                ))
            } else {
                ApiError::new(r.status(), "INVALID_REQUEST_BODY", r.body_text())
            }
        })?;
        // No Content-Type at all: only an empty body (a browser always sends one with a
        // body it posts).
        if !json && !body.is_empty() {
            return Err(not_json());
        }
        Ok(JsonBody(body))
    }
}
