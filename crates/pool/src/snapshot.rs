//! Snapshots of long-lived sandboxes: a sandbox's writable layer read while it is frozen
//! ([`LiveSandbox::with_writable_layer`]) and kept in the image store as a layer over its
//! image ([`agentrun_image::snapshot`]). What the front ends (OpenSandbox snapshots, Docker
//! `commit`) call. A fork ([`freeze`]) keeps it instead as a [`FrozenLayer`]: a copy of the
//! upper directory as it is, which the fork's copies mount as a read-only lower layer of
//! their own cells' overlays (no image made, no tar, no unpack), shared by them all and
//! removed when the last sandbox using it is gone. The snapshot of a sandbox that has frozen
//! layers (a fork copy) holds them as layers of their own under its upper's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrun_image::{CommitOptions, Committed, ImageStore, Snapshot, SnapshotMeta, StagedLayer};

pub use crate::frozen::{FrozenLayer, LayerNotMade, PendingLayer};
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
    staged_then(sandbox, store, meta.max_bytes, |staged| {
        store.create_snapshot_staged(sandbox.image_ref(), staged, meta)
    })
}

/// Makes an image of `sandbox`'s writable layer over its image (Docker's `commit`; see
/// [`ImageStore::commit_upper`]).
pub fn commit(
    sandbox: &LiveSandbox,
    store: &ImageStore,
    opts: &CommitOptions,
) -> Result<Taken<Committed>, PoolError> {
    staged_then(sandbox, store, opts.max_bytes, |staged| {
        store.commit_staged(sandbox.image_ref(), staged, opts)
    })
}

/// Stages `sandbox`'s writable layer over its frozen lowers (at most `max_bytes`; frozen only
/// while it is read and written as a blob), then `make`s the image or snapshot of it.
fn staged_then<T>(
    sandbox: &LiveSandbox,
    store: &ImageStore,
    max_bytes: Option<u64>,
    make: impl FnOnce(StagedLayer) -> Result<T, agentrun_image::ImageError>,
) -> Result<Taken<T>, PoolError> {
    let start = Instant::now();
    let mut frozen = Duration::ZERO;
    let lowers = sandbox.frozen_dirs();
    let lowers: Vec<&Path> = lowers.iter().rev().map(PathBuf::as_path).collect();
    let staged = sandbox.with_writable_layer(|upper| {
        let t = Instant::now();
        let r = store.stage_upper_over(&lowers, upper, max_bytes);
        frozen = t.elapsed();
        r
    })??;
    let made = make(staged)?;
    Ok(Taken {
        made,
        frozen,
        total: start.elapsed(),
    })
}

/// Freezes `sandbox`'s writable layer for a fork: its upper directory copied as it is
/// ([`agentrun_image::frozen`]) while the sandbox is frozen, into a [`FrozenLayer`] `dir/id`
/// (`dir`: [`crate::live::LiveManager::frozen_dir`]) over the sandbox's own frozen layers. Refused over `max_bytes` (the sandbox's layers
/// all together) before anything is written. The sandbox keeps running, whatever the
/// outcome.
pub fn freeze(
    sandbox: &LiveSandbox,
    dir: &Path,
    id: &str,
    max_bytes: Option<u64>,
) -> Result<Taken<Arc<FrozenLayer>>, PoolError> {
    let start = Instant::now();
    let below = sandbox.frozen_layer();
    let below_bytes: u64 = {
        let mut n = 0;
        let mut at = below.as_deref();
        while let Some(l) = at {
            n += l.bytes;
            at = l.below.as_deref();
        }
        n
    };
    let room = max_bytes.map(|m| m.saturating_sub(below_bytes));
    let mut frozen = Duration::ZERO;
    let made = sandbox.with_writable_layer(|upper| {
        let t = Instant::now();
        let r = agentrun_image::frozen::freeze_upper(dir, upper.path, id, room);
        frozen = t.elapsed();
        r
    })?;
    let (dir, copy) = match made {
        Ok(m) => m,
        Err(agentrun_image::ImageError::SnapshotTooLarge { bytes, max }) => {
            return Err(agentrun_image::ImageError::SnapshotTooLarge {
                bytes: bytes + below_bytes,
                max: max + below_bytes,
            }
            .into())
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Taken {
        made: Arc::new(FrozenLayer {
            id: id.to_owned(),
            dir,
            bytes: copy.bytes,
            below,
        }),
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

/// Work reported once done (a snapshot, a restore, a fork), as its audit record says it.
pub struct WorkDone<'a> {
    /// The record's kind: `snapshot`, `restore`, `fork`.
    pub kind: &'a str,
    /// Its span's name.
    pub action: &'a str,
    pub sandbox_id: &'a str,
    /// What was made or used (a snapshot's id, a fork's layer).
    pub resource: &'a str,
    /// Why it failed.
    pub error: Option<(&'a str, &'a str)>,
    pub profile: &'a str,
}

impl WorkDone<'_> {
    /// Its audit record, under `span`: decision `ok` and `done()` as the reason, or `error`
    /// and the failure's message.
    pub fn record(
        &self,
        span: &agentrun_telemetry::RunSpan,
        done: impl FnOnce() -> String,
    ) -> agentrun_telemetry::AuditRecord {
        agentrun_telemetry::AuditRecord {
            time: agentrun_telemetry::audit::now_rfc3339(),
            kind: self.kind.into(),
            sandbox_id: self.sandbox_id.into(),
            trace_id: span.context().trace_id_hex(),
            action: self.action.into(),
            resource: self.resource.into(),
            decision: if self.error.is_some() { "error" } else { "ok" }.into(),
            reason: match self.error {
                Some((_, msg)) => msg.to_owned(),
                None => done(),
            },
            profile: self.profile.into(),
            ..Default::default()
        }
    }
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
    let mut span = agentrun_telemetry::RunSpan::started_ago(name, r.traceparent, r.duration);
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
        let work = WorkDone {
            kind: if name == SNAPSHOT_SPAN {
                "snapshot"
            } else {
                "restore"
            },
            action: name,
            sandbox_id: r.sandbox_id,
            resource: r.snapshot_id,
            error: r.error,
            profile: r.profile,
        };
        let record = work.record(&span, || {
            let ms = r.duration.as_millis();
            format!("image {} bytes {} in {ms} ms", r.image, r.bytes)
        });
        if let Err(e) = audit.append(&record) {
            tracing::error!(target: "agentrun::pool::snapshot", sandbox = %r.sandbox_id, "audit log: {e}");
        }
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(name: &str, below: Option<Arc<FrozenLayer>>) -> Arc<FrozenLayer> {
        let dir = std::env::temp_dir().join(format!(
            "agentrun-pending-test-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        Arc::new(FrozenLayer {
            id: name.into(),
            dir,
            bytes: 0,
            below,
        })
    }

    #[test]
    fn a_create_waits_for_the_layer_and_the_last_holder_removes_it() {
        let pending = PendingLayer::new();
        let waiter = {
            let p = pending.clone();
            std::thread::spawn(move || p.wait().map(|l| l.dirs()))
        };
        let first = layer("a", None);
        let top = layer("b", Some(first.clone()));
        let dirs = vec![top.dir.clone(), first.dir.clone()];
        drop(first);
        pending.set(Ok(top.clone()));
        assert_eq!(waiter.join().unwrap().unwrap(), dirs);
        pending.clear();
        assert!(dirs.iter().all(|d| d.is_dir()), "held by `top`");
        drop(top);
        assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?} left");
    }

    #[test]
    fn a_layer_that_was_not_made_fails_the_wait() {
        let pending = PendingLayer::new();
        pending.set(Err(Arc::from(
            Box::<dyn std::error::Error + Send + Sync>::from("too large"),
        )));
        let e = pending.wait().unwrap_err().to_string();
        assert!(e.contains("too large"), "{e}");
    }
}
