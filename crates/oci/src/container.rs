//! Containers under `--root`: id validation, loading, and runc's view of a container's state
//! (the JSON `state` and `list` print).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use libcontainer::container::{Container, ContainerStatus};
use serde::Serialize;

use crate::OciError;

/// Rejects ids that are not a plain directory name (runc: `^[\w+-\.]+$`).
pub fn validate_id(id: &str) -> Result<(), OciError> {
    let ok = !id.is_empty()
        && id != "."
        && id != ".."
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(OciError::InvalidId(id.to_owned()))
    }
}

/// The container's state directory under `root`.
pub fn dir(root: &Path, id: &str) -> Result<PathBuf, OciError> {
    validate_id(id)?;
    Ok(root.join(id))
}

/// Loads container `id` and refreshes its status; [`OciError::NotExist`] when there is none.
pub fn load(root: &Path, id: &str) -> Result<Container, OciError> {
    let dir = dir(root, id)?;
    if !dir.join("state.json").is_file() {
        return Err(OciError::NotExist);
    }
    Ok(Container::load(dir)?)
}

/// runc's name for a status.
pub fn status_str(status: ContainerStatus) -> &'static str {
    match status {
        ContainerStatus::Creating => "creating",
        ContainerStatus::Created => "created",
        ContainerStatus::Running => "running",
        ContainerStatus::Stopped => "stopped",
        ContainerStatus::Paused => "paused",
    }
}

impl OciError {
    /// A container that is not in a status `action` can be done in.
    pub(crate) fn status(action: &'static str, status: ContainerStatus) -> Self {
        OciError::Status {
            action,
            status: status_str(status).to_owned(),
        }
    }
}

/// A container's state as runc's `state` prints it (and, without annotations, as `list
/// --format json` prints each entry).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuncState {
    pub oci_version: String,
    pub id: String,
    /// 0 once the container has stopped.
    pub pid: i32,
    pub status: &'static str,
    pub bundle: PathBuf,
    pub rootfs: PathBuf,
    /// RFC 3339 with nanoseconds, as Go prints a time.
    pub created: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<HashMap<String, String>>,
    pub owner: String,
}

impl RuncState {
    pub fn of(container: &Container) -> Self {
        let status = container.status();
        let pid = match status {
            ContainerStatus::Stopped => 0,
            _ => container.pid().map_or(0, |p| p.as_raw()),
        };
        let bundle = container.bundle().clone();
        let rootfs = crate::record::Record::load(&container.root)
            .map(|r| r.rootfs)
            .unwrap_or_else(|| bundle.join("rootfs"));
        RuncState {
            oci_version: oci_spec::runtime::VERSION.to_owned(),
            id: container.id().to_owned(),
            pid,
            status: status_str(status),
            bundle,
            rootfs,
            created: container
                .created()
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
                .unwrap_or_default(),
            annotations: container
                .state
                .annotations
                .clone()
                .filter(|a| !a.is_empty()),
            owner: container
                .creator()
                .map(|o| o.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }
}

/// Ids of the containers under `root` (directories with a state file), sorted.
pub fn ids(root: &Path) -> Result<Vec<String>, OciError> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(OciError::io("reading", root, e)),
    };
    let mut ids: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().join("state.json").is_file())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|id| validate_id(id).is_ok())
        .collect();
    ids.sort();
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_plain_names() {
        for good in ["abc", "a.b-c_d+e", "0123456789abcdef"] {
            assert!(validate_id(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "a/b", "../x", "a b", "a\0b"] {
            assert!(validate_id(bad).is_err(), "{bad:?}");
        }
    }
}
