//! agentrun's own record of an OCI container, next to libcontainer's `state.json` in the
//! container's directory under `--root`: what `state` needs that libcontainer does not keep
//! (the rootfs path) and the container's lifetime span.
//!
//! `create` and `delete` are separate processes, so the span (`container.lifetime`) is
//! started at `create` (ids and start time written here) and finished and exported at
//! `delete`, with `container.id`, `container.image.name` (from the image annotations
//! containerd sets), `container.runtime`, `process.pid` and `sandbox.profile`.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentrun_telemetry::{RunSpan, TraceContext};
use oci_spec::runtime::Spec;
use serde::{Deserialize, Serialize};

use crate::OciError;

/// The record's file name in the container's directory.
const FILE: &str = "agentrun.json";
/// The span's name.
pub const SPAN_NAME: &str = "container.lifetime";
/// Annotations that name the container's image, most specific first: CRI's, then
/// containerd's (`ctr run`), then the OCI image spec's.
const IMAGE_ANNOTATIONS: &[&str] = &[
    "io.kubernetes.cri.image-name",
    "io.containerd.image.name",
    "org.opencontainers.image.ref.name",
];

/// What agentrun keeps about a container.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// Absolute path of the container's rootfs.
    pub rootfs: PathBuf,
    /// The image, from annotations.
    pub image: Option<String>,
    /// The profile an annotation asked for.
    pub profile: Option<String>,
    /// The lifetime span's own `traceparent`.
    pub traceparent: String,
    /// Its parent's, when there was one.
    pub parent: Option<String>,
    /// Start of the span, nanoseconds since the epoch.
    pub start_unix_nanos: u64,
}

impl Record {
    /// A record for a container being created from `spec` in `bundle`; starts its span.
    pub fn new(spec: &Spec, bundle: &Path, profile: Option<String>) -> Self {
        let annotations = spec.annotations().clone().unwrap_or_default();
        let parent = std::env::var("TRACEPARENT")
            .ok()
            .or_else(|| annotations.get(crate::annotations::TRACEPARENT).cloned())
            .filter(|t| TraceContext::from_traceparent(t).is_some());
        let span = RunSpan::start(SPAN_NAME, parent.as_deref());
        let root = spec
            .root()
            .as_ref()
            .map_or_else(|| PathBuf::from("rootfs"), |r| r.path().clone());
        let rootfs = if root.is_absolute() {
            root
        } else {
            bundle.join(root)
        };
        let start = span
            .start_time()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Record {
            rootfs,
            image: IMAGE_ANNOTATIONS
                .iter()
                .find_map(|k| annotations.get(*k).cloned()),
            profile,
            traceparent: span.traceparent(),
            parent,
            start_unix_nanos: u64::try_from(start.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Writes the record into the container's directory.
    pub fn save(&self, container_dir: &Path) -> Result<(), OciError> {
        let path = container_dir.join(FILE);
        let text = serde_json::to_vec(self)?;
        std::fs::write(&path, text).map_err(|e| OciError::io("writing", path, e))
    }

    /// The record of the container in `container_dir`, if it has one.
    pub fn load(container_dir: &Path) -> Option<Self> {
        let text = std::fs::read(container_dir.join(FILE)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Ends the lifetime span now and exports it (when OTLP export is configured).
    pub fn finish_span(&self, id: &str, pid: Option<i32>) {
        let Some(context) = TraceContext::from_traceparent(&self.traceparent) else {
            return;
        };
        let parent = self
            .parent
            .as_deref()
            .and_then(TraceContext::from_traceparent);
        let start = UNIX_EPOCH + Duration::from_nanos(self.start_unix_nanos);
        let mut span = RunSpan::resume(SPAN_NAME, context, parent, start);
        span.set_attribute("container.id", id);
        span.set_attribute("container.runtime", "agentrun");
        if let Some(image) = &self.image {
            span.set_attribute("container.image.name", image);
        }
        if let Some(profile) = &self.profile {
            span.set_attribute("sandbox.profile", profile);
        }
        if let Some(pid) = pid.filter(|p| *p > 0) {
            span.set_attribute("process.pid", pid);
        }
        let ms = SystemTime::now()
            .duration_since(start)
            .unwrap_or_default()
            .as_millis();
        span.set_attribute("sandbox.duration_ms", ms);
        span.finish();
    }
}
