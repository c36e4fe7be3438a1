//! The runtime's error type.

use std::path::PathBuf;

/// Errors creating, running or tearing down a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{context} {}: {source}", path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {errno}")]
    Sys {
        what: &'static str,
        errno: nix::Error,
    },
    #[error("{0}")]
    InvalidInput(String),
    #[error("not supported on this host: {0}")]
    Unsupported(String),
    #[error("container runtime: {0}")]
    Container(String),
    #[error(transparent)]
    Seccomp(#[from] crate::confine::seccomp::SeccompError),
    #[error("building OCI spec: {0}")]
    Spec(#[from] oci_spec::OciSpecError),
    #[error(transparent)]
    Image(#[from] agentrun_image::ImageError),
    #[error(transparent)]
    Preflight(#[from] crate::host::preflight::PreflightError),
    #[error(transparent)]
    Random(#[from] crate::random::RandomError),
}

impl RuntimeError {
    pub(crate) fn io(
        context: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        RuntimeError::Io {
            context,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn sys(what: &'static str, errno: nix::Error) -> Self {
        RuntimeError::Sys { what, errno }
    }

    /// A short machine-friendly kind, for `error.type` on spans.
    pub fn kind(&self) -> &'static str {
        match self {
            RuntimeError::Io { .. } | RuntimeError::Sys { .. } => "io",
            RuntimeError::InvalidInput(_) => "invalid_input",
            RuntimeError::Unsupported(_) => "unsupported",
            RuntimeError::Container(_) => "container",
            RuntimeError::Seccomp(_) => "seccomp",
            RuntimeError::Spec(_) => "spec",
            RuntimeError::Image(agentrun_image::ImageError::NotFound(_)) => "image_not_found",
            RuntimeError::Image(_) => "image",
            RuntimeError::Random(_) => "random",
            RuntimeError::Preflight(_) => "unsupported",
        }
    }
}
