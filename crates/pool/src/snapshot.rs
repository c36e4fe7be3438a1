//! Snapshots of long-lived sandboxes: a sandbox's writable layer read while it is frozen
//! ([`LiveSandbox::with_writable_layer`]) and kept in the image store as a layer over its
//! image ([`agentrun_image::snapshot`]). What the front ends (OpenSandbox snapshots, Docker
//! `commit`, fork) call.

use std::time::{Duration, Instant};

use agentrun_image::{CommitOptions, Committed, ImageStore, Snapshot, SnapshotMeta};

use crate::live::LiveSandbox;
use crate::PoolError;

/// A snapshot taken, and how long it took.
#[derive(Debug, Clone)]
pub struct Taken<T> {
    pub made: T,
    /// How long the sandbox was frozen (0 if it was paused already: it stays paused).
    pub frozen: Duration,
    /// From the call to the snapshot's name written.
    pub total: Duration,
}

/// Takes a snapshot of `sandbox` (see [`ImageStore::create_snapshot`]). The sandbox keeps
/// running (it is frozen only while its layer is read and written as a blob), whatever the
/// outcome.
pub fn take(
    sandbox: &LiveSandbox,
    store: &ImageStore,
    meta: &SnapshotMeta,
) -> Result<Taken<Snapshot>, PoolError> {
    let start = Instant::now();
    let mut frozen = Duration::ZERO;
    // Frozen only while its layer is read (written as a blob); unpacked and named after.
    let staged = sandbox.with_writable_layer(|upper| {
        let t = Instant::now();
        let r = store.stage_upper(upper, meta.max_bytes);
        frozen = t.elapsed();
        r
    })??;
    let made = store.create_snapshot_staged(sandbox.image_ref(), staged, meta)?;
    Ok(Taken {
        made,
        frozen,
        total: start.elapsed(),
    })
}

/// Makes an image of `sandbox`'s writable layer over its image (Docker's `commit`; see
/// [`ImageStore::commit_upper`]).
pub fn commit(
    sandbox: &LiveSandbox,
    store: &ImageStore,
    opts: &CommitOptions,
) -> Result<Taken<Committed>, PoolError> {
    let start = Instant::now();
    let mut frozen = Duration::ZERO;
    let staged = sandbox.with_writable_layer(|upper| {
        let t = Instant::now();
        let r = store.stage_upper(upper, opts.max_bytes);
        frozen = t.elapsed();
        r
    })??;
    let made = store.commit_staged(sandbox.image_ref(), staged, opts)?;
    Ok(Taken {
        made,
        frozen,
        total: start.elapsed(),
    })
}

/// The span of a snapshot (or commit) taken.
pub const SNAPSHOT_SPAN: &str = "sandbox.snapshot";
/// The span of a sandbox made from a snapshot (or a committed image).
pub const RESTORE_SPAN: &str = "sandbox.restore";

/// What a snapshot or restore did, for its span and its audit record ([`report`]).
#[derive(Debug, Clone, Default)]
pub struct Report<'a> {
    /// The sandbox snapshotted, or the one made from the snapshot.
    pub sandbox_id: &'a str,
    /// The snapshot's id (or the committed image's id).
    pub snapshot_id: &'a str,
    /// The image made or restored from.
    pub image: &'a str,
    /// Bytes of the sandbox's changed files.
    pub bytes: u64,
    pub duration: Duration,
    /// How long the sandbox was frozen (snapshots).
    pub frozen: Option<Duration>,
    /// Why it failed.
    pub error: Option<(&'a str, &'a str)>,
    /// The caller's `traceparent`.
    pub traceparent: Option<&'a str>,
    /// The profile of the sandbox.
    pub profile: &'a str,
}

/// Makes the span (`sandbox.snapshot` or `sandbox.restore`: `name`) of what `r` says, with
/// its sizes and durations, and appends its audit record (kind `snapshot` or `restore`,
/// decision `ok` or `error`) to `audit`. The span is returned unfinished (the caller exports
/// it off its async threads).
pub fn report(
    name: &'static str,
    audit: Option<&agentrun_telemetry::AuditLog>,
    r: &Report<'_>,
) -> agentrun_telemetry::RunSpan {
    // Started when the work did (`r.duration` ago).
    let fresh = agentrun_telemetry::RunSpan::start(name, r.traceparent);
    let mut span = agentrun_telemetry::RunSpan::resume(
        name,
        fresh.context(),
        fresh.parent(),
        std::time::SystemTime::now()
            .checked_sub(r.duration)
            .unwrap_or_else(std::time::SystemTime::now),
    );
    span.set_attribute("openinference.span.kind", "TOOL");
    span.set_attribute("sandbox.id", r.sandbox_id);
    span.set_attribute("sandbox.snapshot.id", r.snapshot_id);
    span.set_attribute("container.image.name", r.image);
    span.set_attribute("sandbox.snapshot.bytes", r.bytes as i64);
    span.set_attribute("sandbox.duration_ms", r.duration.as_millis() as i64);
    if let Some(f) = r.frozen {
        span.set_attribute("sandbox.frozen_ms", f.as_millis() as i64);
    }
    if !r.profile.is_empty() {
        span.set_attribute("sandbox.profile", r.profile);
    }
    if let Some((kind, msg)) = r.error {
        span.set_error(kind, msg);
    }
    if let Some(audit) = audit {
        let record = agentrun_telemetry::AuditRecord {
            time: agentrun_telemetry::audit::now_rfc3339(),
            kind: if name == SNAPSHOT_SPAN {
                "snapshot"
            } else {
                "restore"
            }
            .into(),
            sandbox_id: r.sandbox_id.into(),
            trace_id: span.context().trace_id_hex(),
            action: name.into(),
            resource: r.snapshot_id.into(),
            decision: if r.error.is_some() { "error" } else { "ok" }.into(),
            reason: match r.error {
                Some((_, msg)) => msg.to_owned(),
                None => format!(
                    "image {} bytes {} in {} ms",
                    r.image,
                    r.bytes,
                    r.duration.as_millis()
                ),
            },
            profile: r.profile.into(),
            ..Default::default()
        };
        if let Err(e) = audit.append(&record) {
            tracing::error!(target: "agentrun::pool::snapshot", sandbox = %r.sandbox_id, "audit log: {e}");
        }
    }
    span
}
