//! The OpenSandbox file API's owners, modes and line-based reading, driven by the official
//! Python SDK (`tests/opensandbox/sdk_files.py`), sync and async clients: what `stat` shows
//! inside the sandbox and what `get_file_info` answers, the 400s, and that no chown or chmod
//! reaches a host file.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use agentrun_e2e::osb::*;
use agentrun_e2e::*;

#[test]
fn owners_and_modes_are_the_sandboxs_users() {
    let Some(_lock) = setup() else { return };
    let dir = tempdir();
    let host_file = dir.path().join("host-file");
    std::fs::write(&host_file, "host").unwrap();
    std::fs::set_permissions(&host_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = std::fs::metadata(&host_file).unwrap();
    let (d, domain) = start(&[], &[]);
    let env = [("OSB_HOST_FILE", host_file.display().to_string())];
    scenario(&d, &domain, "files:owners", &env);
    scenario(&d, &domain, "files:owners_async", &env);
    let after = std::fs::metadata(&host_file).unwrap();
    assert_eq!(
        (after.uid(), after.gid(), after.mode()),
        (before.uid(), before.gid(), before.mode()),
        "a host file's owner or mode changed"
    );
    stop_clean(d);
}

/// An upload whose last bytes come after the answer leaves the connection usable (issue 36:
/// the SDK's next call on it failed with "Server disconnected without sending a response").
#[test]
fn an_upload_answered_before_its_last_bytes_keeps_the_connection() {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start(&[], &[]);
    scenario(&d, &domain, "files:upload_keeps_the_connection", &[]);
    stop_clean(d);
}

#[test]
fn offset_and_limit_read_lines_as_execd() {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start(&[], &[]);
    scenario(&d, &domain, "files:lines", &[]);
    scenario(&d, &domain, "files:lines_async", &[]);
    stop_clean(d);
}
