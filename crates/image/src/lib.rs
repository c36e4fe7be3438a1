//! The images sandboxes run.
//!
//! An [`Image`] is a read-only root filesystem directory (the overlay's lower layer) plus host
//! directories bind-mounted read-only into it. Two kinds exist today:
//! - `host`, built in: a small synthesized rootfs (minimal `/etc`, mount points) over which the
//!   host's `/usr` (and `/bin`, `/lib*` when they are not symlinks into it) are bound read-only.
//!   Nothing is downloaded, and the host's secrets (`/etc/shadow`, `/root`, `/home`, `/run`) are
//!   never part of it. See [`host`].
//! - directory images, copied into the store by `agentrun image add NAME DIR` (see [`store`]).

pub mod host;
mod store;

use std::path::PathBuf;

pub use store::{ImageInfo, ImageStore};

/// Errors of the image store.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("no such image {0:?} (see `agentrun image ls`)")]
    NotFound(String),
    #[error("invalid image name {0:?}: use lowercase letters, digits, '.', '_' and '-'")]
    InvalidName(String),
    #[error("image {0:?} is built in and cannot be replaced or removed")]
    BuiltIn(String),
    #[error("image {0:?} already exists (remove it first with `agentrun image rm`)")]
    Exists(String),
    #[error("{path}: {message}")]
    Source { path: PathBuf, message: String },
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
}

/// A host directory bind-mounted read-only into every sandbox of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBind {
    /// Path on the host.
    pub source: PathBuf,
    /// Path inside the sandbox.
    pub target: PathBuf,
}

/// An image ready to be used as a sandbox's read-only lower layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The name it was resolved from (`host`, `busybox`, ...).
    pub name: String,
    /// The root filesystem directory. Never written by a sandbox.
    pub rootfs: PathBuf,
    /// Host directories mounted read-only into the rootfs.
    pub host_binds: Vec<HostBind>,
}
