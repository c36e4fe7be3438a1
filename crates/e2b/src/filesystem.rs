//! envd's `filesystem.Filesystem` service: `Stat`, `ListDir` (to a depth), `MakeDir`
//! (`already_exists` for a directory already there, as the SDK's `make_dir` expects), `Move`
//! and `Remove`. Watching (`WatchDir`, `CreateWatcher`, ...) is [`crate::watch`]'s.
//!
//! Every path is resolved inside the sandbox by the OpenSandbox front end's file machinery
//! ([`agentrun_opensandbox::files::with_fs`], over [`agentrun_runtime::fsroot`]), with the
//! sandbox root's credentials; a relative path is relative to the user's home (`/root` for
//! root, `/home/USER` for another user), as envd resolves it.

use std::path::PathBuf;
use std::sync::Arc;

use agentrun_opensandbox::accounts::Accounts;
use agentrun_opensandbox::files::{errno, rel, with_fs};
use agentrun_opensandbox::{ApiError, Record};
use agentrun_runtime::fsroot::{sandbox_id, Entry, SandboxFs};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use axum::{Extension, Router};
use chrono::{TimeZone, Utc};
use rustix::fs::FileType;
use rustix::io::Errno;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::connect::{self, Unary};
use crate::error::{RpcError, RpcResult};

/// Deepest `ListDir`.
const MAX_DEPTH: usize = 64;
/// Most entries a `ListDir` answers.
const MAX_ENTRIES: usize = 100_000;
/// The id the kernel shows inside the sandbox for a host id it does not map.
const OVERFLOW_ID: u32 = 65534;

/// The service's routes; [`crate::router`] puts them behind the sandbox's access token.
pub fn routes() -> Router {
    Router::new()
        .route("/filesystem.Filesystem/Stat", post(stat))
        .route("/filesystem.Filesystem/ListDir", post(list_dir))
        .route("/filesystem.Filesystem/MakeDir", post(make_dir))
        .route("/filesystem.Filesystem/Move", post(move_entry))
        .route("/filesystem.Filesystem/Remove", post(remove))
}

/// `path` as an absolute path in the sandbox: a relative one is relative to `user`'s home.
pub fn absolute(path: &str, user: Option<&str>) -> String {
    if path.starts_with('/') {
        return path.to_owned();
    }
    let home = match user {
        None => "/root".to_owned(),
        Some(u) => format!("/home/{u}"),
    };
    let path = path.strip_prefix("./").unwrap_or(path);
    if path.is_empty() || path == "." {
        home
    } else {
        format!("{home}/{path}")
    }
}

/// A request's path, checked: (the absolute path shown in answers and errors, the path
/// relative to the sandbox's root).
pub fn resolve(path: &str, headers: &HeaderMap) -> RpcResult<(String, PathBuf)> {
    if path.is_empty() {
        return Err(RpcError::invalid("path is required"));
    }
    let user = crate::auth::user_of(headers).map_err(RpcError::invalid)?;
    let abs = absolute(path, user.as_deref());
    let r = rel(&abs).map_err(RpcError::from)?;
    Ok((abs, r))
}

fn permissions(mode: u32) -> String {
    let kind = match FileType::from_raw_mode(mode) {
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// The `EntryInfo` JSON of an entry (proto3 JSON: `size` an int64, so a string).
/// The `EntryInfo` of the entry at `r` (shown as `shown` in errors), as it is now.
fn entry_at(fs: &SandboxFs, r: &std::path::Path, shown: &str) -> Result<Value, ApiError> {
    let e = fs.stat(r).map_err(|e| errno(e, shown))?;
    Ok(entry_info(fs, &e, &Accounts::read(fs)))
}

fn entry_info(fs: &SandboxFs, e: &Entry, accounts: &Accounts) -> Value {
    let mode = e.stat.st_mode;
    let kind = match FileType::from_raw_mode(mode) {
        FileType::RegularFile => "FILE_TYPE_FILE",
        FileType::Directory => "FILE_TYPE_DIRECTORY",
        FileType::Symlink => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    };
    let name = std::path::Path::new(&e.path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "/".into());
    let modified = Utc
        .timestamp_opt(e.stat.st_mtime, e.stat.st_mtime_nsec as u32)
        .single()
        .unwrap_or_default();
    let mut v = json!({
        "name": name,
        "type": kind,
        "path": e.path,
        "size": e.stat.st_size.to_string(),
        "mode": mode & 0o7777,
        "permissions": permissions(mode),
        "owner": accounts.user_name(sandbox_id(e.stat.st_uid).unwrap_or(OVERFLOW_ID)),
        "group": accounts.group_name(sandbox_id(e.stat.st_gid).unwrap_or(OVERFLOW_ID)),
        "modifiedTime": modified.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
    });
    if FileType::from_raw_mode(mode) == FileType::Symlink {
        if let Ok(r) = rel(&e.path) {
            if let Ok(t) = fs.readlink(&r) {
                v["symlinkTarget"] = json!(t.to_string_lossy());
            }
        }
    }
    v
}

#[derive(Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: u32,
}

async fn stat(
    Extension(rec): Extension<Arc<Record>>,
    headers: HeaderMap,
    Unary(req): Unary<PathRequest>,
) -> RpcResult<Response> {
    let (shown, r) = resolve(&req.path, &headers)?;
    let entry = fs_call(&rec, move |fs| entry_at(fs, &r, &shown)).await?;
    Ok(connect::unary_response(&json!({ "entry": entry })))
}

async fn list_dir(
    Extension(rec): Extension<Arc<Record>>,
    headers: HeaderMap,
    Unary(req): Unary<PathRequest>,
) -> RpcResult<Response> {
    let depth = (req.depth.max(1) as usize).min(MAX_DEPTH);
    let (shown, r) = resolve(&req.path, &headers)?;
    let entries = fs_call(&rec, move |fs| {
        let top = fs.stat(&r).map_err(|e| errno(e, &shown))?;
        if !top.is_dir() {
            return Err(ApiError::bad_request(format!("{shown}: not a directory")));
        }
        let accounts = Accounts::read(fs);
        let entries = fs.walk(&r, depth).map_err(|e| errno(e, &shown))?;
        Ok(entries
            .iter()
            .take(MAX_ENTRIES)
            .map(|e| entry_info(fs, e, &accounts))
            .collect::<Vec<_>>())
    })
    .await?;
    Ok(connect::unary_response(&json!({ "entries": entries })))
}

async fn make_dir(
    Extension(rec): Extension<Arc<Record>>,
    headers: HeaderMap,
    Unary(req): Unary<PathRequest>,
) -> RpcResult<Response> {
    let (shown, r) = resolve(&req.path, &headers)?;
    let entry = fs_call(&rec, move |fs| {
        match fs.stat(&r) {
            Ok(_) => return Err(errno(Errno::EXIST, &shown)),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(errno(e, &shown)),
        }
        fs.mkdir_p(&r, 0o755).map_err(|e| errno(e, &shown))?;
        entry_at(fs, &r, &shown)
    })
    .await?;
    Ok(connect::unary_response(&json!({ "entry": entry })))
}

#[derive(Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

async fn move_entry(
    Extension(rec): Extension<Arc<Record>>,
    headers: HeaderMap,
    Unary(req): Unary<MoveRequest>,
) -> RpcResult<Response> {
    let (from_shown, from) = resolve(&req.source, &headers)?;
    let (to_shown, to) = resolve(&req.destination, &headers)?;
    let entry = fs_call(&rec, move |fs| {
        fs.rename(&from, &to).map_err(|e| errno(e, &from_shown))?;
        entry_at(fs, &to, &to_shown)
    })
    .await?;
    Ok(connect::unary_response(&json!({ "entry": entry })))
}

async fn remove(
    Extension(rec): Extension<Arc<Record>>,
    headers: HeaderMap,
    Unary(req): Unary<PathRequest>,
) -> RpcResult<Response> {
    let (shown, r) = resolve(&req.path, &headers)?;
    fs_call(&rec, move |fs| {
        fs.stat(&r).map_err(|e| errno(e, &shown))?;
        fs.remove_all(&r).map_err(|e| errno(e, &shown))
    })
    .await?;
    Ok(connect::unary_response(&json!({})))
}

/// [`with_fs`], its errors as Connect errors.
async fn fs_call<T: Send + 'static>(
    rec: &Record,
    f: impl FnOnce(&SandboxFs) -> Result<T, ApiError> + Send + 'static,
) -> RpcResult<T> {
    with_fs(rec, f).await.map_err(RpcError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_in_the_users_home() {
        assert_eq!(absolute("/etc/hosts", None), "/etc/hosts");
        assert_eq!(absolute("a.txt", None), "/root/a.txt");
        assert_eq!(absolute("./a.txt", Some("user")), "/home/user/a.txt");
        assert_eq!(absolute(".", None), "/root");
    }

    #[test]
    fn permissions_read_like_ls() {
        assert_eq!(permissions(0o100644), "-rw-r--r--");
        assert_eq!(permissions(0o040755), "drwxr-xr-x");
    }
}
