//! The OCI command line's errors. Their messages are what runc prints for the same condition
//! where containerd's shim matches on them ("container does not exist", "container not
//! running").

use std::path::PathBuf;

/// An OCI command failed (exit code 1).
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("container does not exist")]
    NotExist,
    #[error("container with id exists: {0}")]
    Exists(String),
    #[error("invalid container id {0:?}: use letters, digits, '_', '-', '.' (not '.' or '..')")]
    InvalidId(String),
    #[error("container not running")]
    NotRunning,
    #[error("cannot {action} a container that is {status}")]
    Status {
        action: &'static str,
        status: String,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Container(#[from] libcontainer::error::LibcontainerError),
    /// CRIU failed (`checkpoint`, `restore`): the message names CRIU's own error.
    #[error("{0}")]
    Criu(String),
    #[error("cgroups: {0}")]
    Cgroup(String),
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Spec(#[from] oci_spec::OciSpecError),
}

impl OciError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        OciError::Io {
            what,
            path: path.into(),
            source,
        }
    }
}

/// An error and its sources, `: `-separated (libcontainer's and oci-spec's own messages are
/// terse, e.g. "io error", "serde failed", and the cause is in the source).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}
