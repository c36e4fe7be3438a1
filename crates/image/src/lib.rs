//! The images sandboxes run.
//!
//! An [`Image`] is a stack of read-only layer directories (the overlay's lower layers, top
//! first), the image's run configuration (Entrypoint, Cmd, Env, ...) and host directories
//! bind-mounted read-only into it. Two kinds exist:
//! - `host`, built in: a small synthesized rootfs (minimal `/etc`, mount points) over which the
//!   host's `/usr` (and `/bin`, `/lib*` when they are not symlinks into it) are bound read-only.
//!   Nothing is downloaded, and the host's secrets (`/etc/shadow`, `/root`, `/home`, `/run`) are
//!   never part of it. See [`host`].
//! - OCI images in the content-addressed [`ImageStore`]: imported from OCI layouts or `docker
//!   save` tars, pulled from registries, or made from a root filesystem directory. Layers are
//!   unpacked once into their own directories and shared by every image that has them.
//!
//! Every tar the store unpacks is read under [`UnpackLimits`] (bytes, entries, expansion
//! ratio, depth): a decompression bomb or an archive made to fill the disk is refused in one
//! line, and what the failed operation had written is removed.

mod archive;
mod blobs;
mod config;
mod digest;
pub mod frozen;
pub mod host;
mod layer;
mod limits;
mod progress;
mod pull;
pub mod reference;
pub mod snapshot;
mod store;

use std::path::PathBuf;

pub use archive::for_each_tar_entry;
pub use config::ImageConfig;
pub use digest::short_id;
pub use layer::{
    sorted_entries, tar_upper, tar_upper_mapped, unpack, IdMap, LayerLease, UnpackReport,
};
pub use limits::{docker_size, Budget, Limit, UnpackLimits};
pub use progress::{NoProgress, Phase, Progress};
pub use pull::PullOptions;
pub use snapshot::{CommitOptions, Committed, Snapshot, SnapshotMeta, StagedLayer, UpperDir};
pub use store::{
    rfc3339_now, ImageInfo, ImageRecord, ImageStore, LayerRecord, PruneReport, WriteGuard,
    HOST_IMAGE,
};

/// Errors of the image store.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("no such image {0:?} (see `agentrun image ls`)")]
    NotFound(String),
    #[error("invalid image reference {0:?}: {1}")]
    InvalidName(String, String),
    #[error("image {0:?} is built in and cannot be replaced or removed")]
    BuiltIn(String),
    #[error("{0:?} matches several images: use more of the id")]
    Ambiguous(String),
    #[error("image {name:?} is used by {count} tag(s); remove those first or use --force")]
    InUse { name: String, count: usize },
    #[error("{path}: {message}")]
    Source { path: PathBuf, message: String },
    #[error("layer {layer}: {message}")]
    Layer { layer: String, message: String },
    #[error("content digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    /// An archive or layer over one of the [`UnpackLimits`]: nothing of it is kept.
    #[error("{what}: {detail}; {}", limit.how_to_raise())]
    Limit {
        what: String,
        limit: Limit,
        detail: String,
    },
    /// A sandbox's writable layer over the snapshot (commit) size limit: nothing was written.
    #[error(
        "the sandbox's writable layer holds {bytes} bytes, over the snapshot limit of {max} bytes"
    )]
    SnapshotTooLarge { bytes: u64, max: u64 },
    #[error("pulling {reference}: {message}")]
    Pull { reference: String, message: String },
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl ImageError {
    pub(crate) fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| ImageError::Io {
            context,
            path,
            source,
        }
    }

    pub(crate) fn source(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        ImageError::Source {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// A host directory bind-mounted read-only into every sandbox of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBind {
    /// Path on the host.
    pub source: PathBuf,
    /// Path inside the sandbox.
    pub target: PathBuf,
}

/// An image ready to be used as a sandbox's read-only lower layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The name it was resolved from (`host`, `busybox`, ...).
    pub name: String,
    /// The image id (`sha256:` of its config), empty for the built-in image.
    pub id: String,
    /// Layer directories, topmost first (overlayfs `lowerdir` order). Never written.
    pub layers: Vec<PathBuf>,
    /// Host directories mounted read-only into the rootfs.
    pub host_binds: Vec<HostBind>,
    /// What the image says about running it.
    pub config: ImageConfig,
}

impl Image {
    /// Takes a shared lock on every layer for as long as the lease lives, so `image prune`
    /// never deletes a layer a sandbox has mounted.
    pub fn lease(&self) -> Result<LayerLease, ImageError> {
        LayerLease::take(&self.layers)
    }
}

/// A fresh, empty directory for a test, named `tag` (unique per test process; tags begin with
/// the test's module).
#[cfg(test)]
fn test_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("agentrun-{tag}-{}", std::process::id()));
    // A directory left by an earlier process of the same pid, if any.
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
