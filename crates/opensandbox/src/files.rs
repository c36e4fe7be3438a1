//! The execd file API of one sandbox: upload, download (Range, offset/limit), info, search,
//! move, replace, permissions, mkdir, delete, list. Every path goes through [`agentrun_runtime::fsroot`]
//! (resolved inside the sandbox, with the sandbox root's credentials) on a blocking thread.
//!
//! Owners are the sandbox's own users and groups ([`crate::accounts`]): names from its
//! `/etc/passwd` and `/etc/group`, ids as the sandbox sees them.
//!
//! File contents never sit whole in the daemon's memory: uploads are written as they arrive
//! (into a hidden file renamed over the target once complete; over `--max-upload` the
//! answer is 413 and nothing is left), downloads and `replace` stream in 64 KiB chunks
//! ([`crate::filestream`]).

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::multipart::{MultipartError, MultipartRejection};
use axum::extract::{DefaultBodyLimit, Multipart, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{TimeZone, Utc};
use rustix::io::Errno;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::accounts::{Accounts, UnknownName};
use crate::auth::ExecdSandboxAnyState;
use crate::error::{ApiError, ApiResult, JsonBody};
use crate::params::query_pairs;
use crate::{rfc3339, Record, Server};
use agentrun_runtime::fsroot::{as_sandbox_root, relative, sandbox_id, Entry, SandboxFs};

/// Deepest walk of a search.
const SEARCH_DEPTH: usize = 64;
/// Most entries a search or list returns.
const MAX_ENTRIES: usize = 100_000;

pub fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route(
            "/files/upload",
            post(upload).layer(DefaultBodyLimit::max(
                usize::try_from(server.limits.max_upload).unwrap_or(usize::MAX),
            )),
        )
        .route("/files/download", get(download))
        .route("/files/info", get(info))
        .route("/files", axum::routing::delete(delete_files))
        .route("/files/permissions", post(permissions))
        .route("/files/mv", post(mv))
        .route("/files/search", get(search))
        .route("/files/replace", post(replace))
        .route("/directories/list", get(list_dir))
        .route("/directories", post(mkdirs).delete(delete_dirs))
        .with_state(server)
}

/// A file system error on `path` as the API reports it.
pub fn errno(e: Errno, path: &str) -> ApiError {
    const BAD: StatusCode = StatusCode::BAD_REQUEST;
    let (status, code, what) = match e {
        Errno::NOENT | Errno::NOTDIR => (
            StatusCode::NOT_FOUND,
            "FILE_NOT_FOUND",
            "no such file or directory",
        ),
        Errno::ACCESS | Errno::PERM | Errno::ROFS => (
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            "permission denied",
        ),
        Errno::INVAL => (
            BAD,
            "INVALID_FILE",
            "not a regular file, or not allowed here",
        ),
        Errno::ISDIR => (BAD, "INVALID_FILE", "is a directory"),
        Errno::LOOP => (
            BAD,
            "INVALID_FILE",
            "symbolic link not allowed here (or too many)",
        ),
        Errno::XDEV => (BAD, "INVALID_FILE", "crosses a mount"),
        Errno::NOSPC => (
            StatusCode::INSUFFICIENT_STORAGE,
            "RUNTIME_ERROR",
            "no space left in the sandbox",
        ),
        Errno::NOTEMPTY => (BAD, "INVALID_FILE", "directory not empty"),
        Errno::EXIST => (StatusCode::CONFLICT, "INVALID_FILE", "already exists"),
        e => return ApiError::internal(format!("{path}: {e}")),
    };
    ApiError::new(status, code, format!("{path}: {what}"))
}

/// A request's path as a path relative to the sandbox's root (400 if it is not absolute).
pub fn rel(path: &str) -> ApiResult<PathBuf> {
    relative(path).map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, "INVALID_FILE", m))
}

/// Runs `f` on a blocking thread with the sandbox's root directory and credentials.
pub async fn with_fs<T: Send + 'static>(
    rec: &Record,
    f: impl FnOnce(&SandboxFs) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    rec.check_not_paused()?;
    let root = rec.sandbox.root()?;
    tokio::task::spawn_blocking(move || {
        let fs = SandboxFs::new(root);
        as_sandbox_root(|| f(&fs))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
}

/// The 400 of a file's owner, group or mode that cannot be.
fn invalid_metadata(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "INVALID_FILE_METADATA", message)
}

/// execd's mode: decimal digits that read as octal (755 = 0o755); 0 leaves the mode as it is.
fn mode_from_digits(m: u32) -> ApiResult<Option<u32>> {
    if m == 0 {
        return Ok(None);
    }
    u32::from_str_radix(&m.to_string(), 8)
        .ok()
        .filter(|v| *v <= 0o7777)
        .map(Some)
        .ok_or_else(|| invalid_metadata(format!("mode {m}: expected octal digits such as 644")))
}

fn mode_to_digits(m: u32) -> u32 {
    format!("{:o}", m & 0o7777).parse().unwrap_or(0)
}

/// The id the kernel shows inside the sandbox for a host id it does not map.
const OVERFLOW_ID: u32 = 65534;

fn file_info(e: &Entry, accounts: &Accounts) -> Value {
    let t = |s: i64, ns: i64| rfc3339(Utc.timestamp_opt(s, ns as u32).single().unwrap_or_default());
    json!({
        "path": e.path,
        "type": e.kind(),
        "size": e.stat.st_size,
        "modified_at": t(e.stat.st_mtime, e.stat.st_mtime_nsec as i64),
        "created_at": t(e.stat.st_ctime, e.stat.st_ctime_nsec as i64),
        "owner": accounts.user_name(sandbox_id(e.stat.st_uid).unwrap_or(OVERFLOW_ID)),
        "group": accounts.group_name(sandbox_id(e.stat.st_gid).unwrap_or(OVERFLOW_ID)),
        "mode": mode_to_digits(e.stat.st_mode),
    })
}

/// The `owner` and `group` asked for a file, as sent (an empty one is not asked, as execd).
#[derive(Debug, Clone, Default)]
pub struct Ownership {
    owner: Option<String>,
    group: Option<String>,
}

impl Ownership {
    fn new(owner: Option<String>, group: Option<String>) -> Self {
        Ownership {
            owner: owner.filter(|o| !o.is_empty()),
            group: group.filter(|g| !g.is_empty()),
        }
    }

    fn is_asked(&self) -> bool {
        self.owner.is_some() || self.group.is_some()
    }

    /// The sandbox uid and gid asked (`None`: unchanged), names looked up in the sandbox's
    /// tables; an unknown name is a 400 naming it.
    fn ids(&self, accounts: &Accounts) -> ApiResult<(Option<u32>, Option<u32>)> {
        let id = |name: &Option<String>, of: fn(&Accounts, &str) -> Result<u32, UnknownName>| {
            let id = name.as_deref().map(|n| of(accounts, n)).transpose();
            id.map_err(|e| invalid_metadata(e.to_string()))
        };
        let (uid, gid) = (
            id(&self.owner, Accounts::uid)?,
            id(&self.group, Accounts::gid)?,
        );
        for id in [uid, gid].into_iter().flatten() {
            if agentrun_runtime::fsroot::host_id(id).is_err() {
                return Err(invalid_metadata(format!(
                    "id {id}: not an id of the sandbox (0 to {})",
                    agentrun_runtime::idmap::UID_COUNT - 1
                )));
            }
        }
        Ok((uid, gid))
    }
}

/// Gives `r` the ids asked, then the mode (after the owner: a chown clears set-id bits).
fn set_owner_and_mode(
    fs: &SandboxFs,
    r: &std::path::Path,
    shown: &str,
    (uid, gid): (Option<u32>, Option<u32>),
    mode: Option<u32>,
) -> ApiResult<()> {
    if uid.is_some() || gid.is_some() {
        fs.chown(r, uid, gid).map_err(|e| chown_error(e, shown))?;
    }
    if let Some(m) = mode {
        fs.chmod(r, m).map_err(|e| chown_error(e, shown))?;
    }
    Ok(())
}

/// A chown or chmod error: a file the sandbox's root cannot change is a 403.
fn chown_error(e: Errno, shown: &str) -> ApiError {
    match e {
        Errno::OVERFLOW => invalid_metadata(format!("{shown}: this mount cannot store that owner")),
        e => errno(e, shown),
    }
}

#[derive(Deserialize)]
struct RawFileMeta {
    path: String,
    owner: Option<String>,
    group: Option<String>,
    mode: Option<u32>,
}

/// An upload's `metadata` part, checked: where the next `file` part goes, its mode and owner.
pub struct FileMeta {
    /// As sent (for messages).
    pub path: String,
    /// Relative to the sandbox root.
    pub rel: PathBuf,
    pub mode: u32,
    /// Names or ids, looked up in the sandbox when the file is written.
    pub owner: Ownership,
}

/// Parses and checks an upload's `metadata` part (mode in octal digits, default (or 0) 755).
pub fn parse_file_meta(bytes: &[u8]) -> ApiResult<FileMeta> {
    let m: RawFileMeta =
        serde_json::from_slice(bytes).map_err(|e| invalid_metadata(format!("metadata: {e}")))?;
    Ok(FileMeta {
        rel: rel(&m.path)?,
        mode: mode_from_digits(m.mode.unwrap_or(0))?.unwrap_or(0o755),
        owner: Ownership::new(m.owner, m.group),
        path: m.path,
    })
}

async fn upload(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    State(server): State<Arc<Server>>,
    multipart: Result<Multipart, MultipartRejection>,
) -> ApiResult<StatusCode> {
    let mut multipart =
        multipart.map_err(|r| ApiError::new(r.status(), "INVALID_FILE", r.body_text()))?;
    let result = write_parts(&rec, server.limits, &mut multipart).await;
    if result.is_err() {
        // Read the rest of the body (at most up to the upload limit, and nothing of it is
        // kept) before answering: a client still sending a chunked body would otherwise see
        // the connection closed instead of the error.
        while let Ok(Some(mut field)) = multipart.next_field().await {
            while let Ok(Some(_)) = field.chunk().await {}
        }
    }
    result
}

/// A multipart error as an API error: 413 for a body over the upload limit.
fn multipart_error(e: MultipartError, limits: crate::Limits) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(format!(
            "upload larger than {} bytes (agentrun serve --max-upload)",
            limits.max_upload
        ))
    } else {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_FILE",
            format!("multipart: {e}"),
        )
    }
}

/// Where an upload to `path` is written until it is complete: a hidden name next to it, so
/// an upload cut short (by the client, an error or the limit) never leaves a partial file or
/// clobbers the old one; the complete file is renamed over `path`.
pub fn upload_name(path: &std::path::Path) -> ApiResult<PathBuf> {
    // At most 64 characters of the name: the hidden name must fit NAME_MAX (255) too.
    let name: String = path
        .file_name()
        .map(|n| n.to_string_lossy().chars().take(64).collect())
        .unwrap_or_default();
    Ok(path.with_file_name(format!(".{name}.agentrun-{}", crate::random_token()?)))
}

async fn write_parts(
    rec: &Record,
    limits: crate::Limits,
    multipart: &mut Multipart,
) -> ApiResult<StatusCode> {
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, "INVALID_FILE", m);
    let mut meta: Option<FileMeta> = None;
    while let Some(mut field) = multipart
        .next_field()
        .await
        .map_err(|e| multipart_error(e, limits))?
    {
        match field.name() {
            Some("metadata") => {
                // Metadata is small JSON: read within the JSON limit, not the upload's.
                let mut bytes = Vec::new();
                while let Some(chunk) = field
                    .chunk()
                    .await
                    .map_err(|e| multipart_error(e, limits))?
                {
                    if bytes.len() + chunk.len() > limits.max_request_body {
                        return Err(ApiError::too_large(format!(
                            "a metadata part larger than {} bytes (agentrun serve --max-request-body)",
                            limits.max_request_body
                        )));
                    }
                    bytes.extend_from_slice(&chunk);
                }
                meta = Some(parse_file_meta(&bytes)?);
            }
            Some("file") => {
                let m = meta
                    .take()
                    .ok_or_else(|| bad("a file part must follow its metadata part".into()))?;
                let (path, mode, owner) = (m.rel.clone(), m.mode, m.owner.clone());
                let partial = upload_name(&path)?;
                let (shown, p2) = (m.path.clone(), partial.clone());
                // Names are looked up before anything is written: an unknown one leaves nothing.
                let (file, ids) = with_fs(rec, move |fs| {
                    let ids = if owner.is_asked() {
                        owner.ids(&Accounts::read(fs))?
                    } else {
                        (None, None)
                    };
                    let file = fs.create_file(&p2, mode).map_err(|e| errno(e, &shown))?;
                    Ok((file, ids))
                })
                .await?;
                let written = write_field(&mut field, file, &m.path, limits).await;
                let shown = m.path.clone();
                let done = with_fs(rec, move |fs| {
                    // The complete file gets its owner before it takes the name.
                    let owned = written.and_then(|()| {
                        if ids.0.is_some() || ids.1.is_some() {
                            set_owner_and_mode(fs, &partial, &shown, ids, Some(mode))
                        } else {
                            Ok(())
                        }
                    });
                    let moved = owned
                        .and_then(|()| fs.rename(&partial, &path).map_err(|e| errno(e, &shown)));
                    if moved.is_err() {
                        // The upload already failed (that error is answered); a partial file left is hidden.
                        let _ = fs.remove_file(&partial);
                    }
                    moved
                })
                .await;
                done?;
            }
            other => return Err(bad(format!("unexpected multipart part {other:?}"))),
        }
    }
    Ok(StatusCode::OK)
}

/// Streams a file part into `file`, a chunk at a time.
async fn write_field(
    field: &mut axum::extract::multipart::Field<'_>,
    mut file: std::fs::File,
    shown: &str,
    limits: crate::Limits,
) -> ApiResult<()> {
    // Writing to an open file needs no more permission checks.
    while let Some(chunk) = field
        .chunk()
        .await
        .map_err(|e| multipart_error(e, limits))?
    {
        let (f, res) = tokio::task::spawn_blocking(move || {
            let r = file.write_all(&chunk);
            (file, r)
        })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
        file = f;
        res.map_err(|e| io_error(e, shown))?;
    }
    Ok(())
}

/// An I/O error on an open file, as the API reports it.
pub fn io_error(e: std::io::Error, path: &str) -> ApiError {
    match e.raw_os_error() {
        Some(n) => errno(Errno::from_raw_os_error(n), path),
        None => ApiError::internal(format!("{path}: {e}")),
    }
}

/// The `path` values of a query, as given (for errors) and as paths in the sandbox ([`rel`]).
fn query_paths(q: &Option<String>) -> ApiResult<(Vec<String>, Vec<PathBuf>)> {
    let paths: Vec<String> = query_pairs(q)
        .into_iter()
        .filter(|(k, _)| k == "path")
        .map(|(_, v)| v)
        .collect();
    let rels = paths.iter().map(|p| rel(p)).collect::<ApiResult<_>>()?;
    Ok((paths, rels))
}

fn query_one(pairs: &[(String, String)], key: &str) -> Option<String> {
    pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

/// A query that must name a `path`: its pairs and that path (as sent).
fn with_path(q: &Option<String>) -> ApiResult<(Vec<(String, String)>, String)> {
    let pairs = query_pairs(q);
    let path = query_one(&pairs, "path").ok_or_else(|| ApiError::missing_query("path"))?;
    Ok((pairs, path))
}

/// `bytes=a-b`, `bytes=a-`, `bytes=-n` against a size; `None` if unsatisfiable.
pub fn parse_range(h: &str, size: u64) -> Option<(u64, u64)> {
    let spec = h.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        if n == 0 {
            return None;
        }
        (size.saturating_sub(n), size.checked_sub(1)?)
    } else {
        let start: u64 = a.parse().ok()?;
        let end = if b.is_empty() {
            size.checked_sub(1)?
        } else {
            b.parse::<u64>().ok()?.min(size.checked_sub(1)?)
        };
        (start, end)
    };
    (start <= end && start < size).then_some((start, end))
}

/// Bytes of a download read at a time.
const DOWNLOAD_CHUNK: usize = 64 * 1024;

/// A body streaming `len` bytes of `file` from where it stands, in [`DOWNLOAD_CHUNK`]s: the
/// daemon holds a chunk, never the file. A file that shrinks meanwhile ends the body early
/// (the client sees it short of its length).
pub fn file_body(file: std::fs::File, len: u64) -> Body {
    let reader = tokio::io::AsyncReadExt::take(tokio::fs::File::from_std(file), len);
    Body::from_stream(tokio_util::io::ReaderStream::with_capacity(
        reader,
        DOWNLOAD_CHUNK,
    ))
}

/// A body made by `produce` writing on a blocking thread, streamed as it writes (at most
/// [`DOWNLOAD_CHUNK`] in flight); a client that goes away makes the writes fail.
fn produced_body(
    produce: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()> + Send + 'static,
) -> Body {
    let (reader, writer) = tokio::io::duplex(DOWNLOAD_CHUNK);
    let mut writer = tokio_util::io::SyncIoBridge::new(writer);
    tokio::task::spawn_blocking(move || {
        // Dropping the writer ends the body (after what it wrote).
        // Its error ends the body early; the client sees the body cut, nobody else is told.
        let _ = produce(&mut writer);
    });
    Body::from_stream(tokio_util::io::ReaderStream::with_capacity(
        reader,
        DOWNLOAD_CHUNK,
    ))
}

async fn download(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let (pairs, path) = with_path(&q)?;
    let relp = rel(&path)?;
    let (offset, limit) = (query_one(&pairs, "offset"), query_one(&pairs, "limit"));
    let lines_asked = [&offset, &limit]
        .iter()
        .any(|v| v.as_deref().is_some_and(|v| !v.is_empty()));
    let range = headers
        .get("range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if range.is_some() && lines_asked {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST_BODY",
            "line-based reading (offset/limit) and byte range (Range header) are mutually exclusive",
        ));
    }
    let shown = path.clone();
    let file = with_fs(&rec, move |fs| {
        fs.open_regular(&relp).map_err(|e| errno(e, &shown))
    })
    .await?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    // Checked once the file is open, as execd does (a missing file is a 404 first).
    let window =
        crate::filestream::line_window(offset.as_deref(), limit.as_deref()).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_REQUEST_BODY",
                e.to_string(),
            )
        })?;
    if let Some((skip, take)) = window {
        // Lines `offset` (1-based) to `offset + limit - 1`, streamed as they are read.
        let body = produced_body(move |w| {
            crate::filestream::copy_lines(
                std::io::BufReader::with_capacity(DOWNLOAD_CHUNK, file),
                w,
                skip,
                take,
            )
        });
        return Ok(([("content-type", "text/plain; charset=utf-8")], body).into_response());
    }
    if let Some(r) = range {
        let Some((a, b)) = parse_range(&r, size) else {
            return Ok((
                StatusCode::RANGE_NOT_SATISFIABLE,
                [("content-range", format!("bytes */{size}"))],
            )
                .into_response());
        };
        let mut file = file;
        let file = tokio::task::spawn_blocking(move || file.seek(SeekFrom::Start(a)).map(|_| file))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| io_error(e, &path))?;
        let len = b - a + 1;
        return Ok((
            StatusCode::PARTIAL_CONTENT,
            [
                ("content-type", "application/octet-stream".to_string()),
                ("content-range", format!("bytes {a}-{b}/{size}")),
                ("content-length", len.to_string()),
            ],
            file_body(file, len),
        )
            .into_response());
    }
    Ok((
        [
            ("content-type", "application/octet-stream".to_string()),
            ("content-length", size.to_string()),
        ],
        file_body(file, size),
    )
        .into_response())
}

async fn info(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<Value>> {
    let (paths, rels) = query_paths(&q)?;
    if paths.is_empty() {
        return Err(ApiError::missing_query("path"));
    }
    with_fs(&rec, move |fs| {
        let accounts = Accounts::read(fs);
        let mut out = serde_json::Map::new();
        for (p, r) in paths.iter().zip(rels) {
            let mut e = fs.stat(&r).map_err(|e| errno(e, p))?;
            e.path = p.clone();
            out.insert(p.clone(), file_info(&e, &accounts));
        }
        Ok(Json(Value::Object(out)))
    })
    .await
}

async fn delete_files(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    RawQuery(q): RawQuery,
) -> ApiResult<StatusCode> {
    delete_each(&rec, &q, |fs, r| {
        if fs.stat(r)?.is_dir() {
            return Err(Errno::ISDIR);
        }
        fs.remove_file(r)
    })
    .await
}

/// `remove`s each `path` of the query in turn (the first failure answers, naming its path).
async fn delete_each(
    rec: &Record,
    q: &Option<String>,
    remove: fn(&SandboxFs, &Path) -> Result<(), Errno>,
) -> ApiResult<StatusCode> {
    let (paths, rels) = query_paths(q)?;
    with_fs(rec, move |fs| {
        for (p, r) in paths.iter().zip(rels) {
            remove(fs, &r).map_err(|e| errno(e, p))?;
        }
        Ok(StatusCode::OK)
    })
    .await
}

#[derive(Deserialize)]
struct Perm {
    mode: Option<u32>,
    owner: Option<String>,
    group: Option<String>,
}

fn parse_body<T: for<'de> Deserialize<'de>>(body: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST_BODY",
            format!("invalid request body: {e}"),
        )
    })
}

/// One path's change of a permissions body.
pub struct PermissionChange {
    rel: PathBuf,
    /// As sent (for messages).
    path: String,
    /// `None` (or 0 sent): unchanged.
    mode: Option<u32>,
    owner: Ownership,
}

/// A permissions body, checked (names are looked up in the sandbox when applied).
pub fn parse_permissions(body: &[u8]) -> ApiResult<Vec<PermissionChange>> {
    let req: BTreeMap<String, Perm> = parse_body(body)?;
    let mut todo = Vec::new();
    for (path, perm) in req {
        todo.push(PermissionChange {
            rel: rel(&path)?,
            mode: perm.mode.map(mode_from_digits).transpose()?.flatten(),
            owner: Ownership::new(perm.owner, perm.group),
            path,
        });
    }
    Ok(todo)
}

async fn permissions(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    JsonBody(body): JsonBody,
) -> ApiResult<StatusCode> {
    change_each(&rec, parse_permissions(&body)?, |fs, todo| {
        // Every name is looked up before anything changes.
        let accounts = Accounts::read(fs);
        let ids = todo
            .iter()
            .map(|c| c.owner.ids(&accounts))
            .collect::<ApiResult<Vec<_>>>()?;
        for (c, ids) in todo.iter().zip(ids) {
            fs.stat(&c.rel).map_err(|e| errno(e, &c.path))?;
            set_owner_and_mode(fs, &c.rel, &c.path, ids, c.mode)?;
        }
        Ok(())
    })
    .await
}

/// Makes the changes of a body (checked before: `todo`) in the sandbox's files: 200 once
/// `apply` made them all, else its error.
async fn change_each<T: Send + 'static>(
    rec: &Record,
    todo: T,
    apply: fn(&SandboxFs, T) -> ApiResult<()>,
) -> ApiResult<StatusCode> {
    with_fs(rec, move |fs| apply(fs, todo).map(|()| StatusCode::OK)).await
}

#[derive(Deserialize)]
struct Move {
    src: String,
    dest: String,
}

/// A move body: (from, to, from as sent), both relative to the root.
pub fn parse_moves(body: &[u8]) -> ApiResult<Vec<(PathBuf, PathBuf, String)>> {
    let req: Vec<Move> = parse_body(body)?;
    req.into_iter()
        .map(|m| Ok((rel(&m.src)?, rel(&m.dest)?, m.src)))
        .collect()
}

async fn mv(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    JsonBody(body): JsonBody,
) -> ApiResult<StatusCode> {
    change_each(&rec, parse_moves(&body)?, |fs, todo| {
        for (a, b, shown) in todo {
            fs.rename(&a, &b).map_err(|e| errno(e, &shown))?;
        }
        Ok(())
    })
    .await
}

/// A search's `pattern` as a glob matcher (`*` stays within one path component).
pub fn search_matcher(pattern: &str) -> ApiResult<globset::GlobMatcher> {
    Ok(globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| ApiError::bad_request(format!("pattern {pattern:?}: {e}")))?
        .compile_matcher())
}

async fn search(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<Value>> {
    let (pairs, dir) = with_path(&q)?;
    let pattern = query_one(&pairs, "pattern")
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "**".into());
    let glob = search_matcher(&pattern)?;
    let relp = rel(&dir)?;
    with_fs(&rec, move |fs| {
        let entries = fs.walk(&relp, SEARCH_DEPTH).map_err(|e| errno(e, &dir))?;
        let accounts = Accounts::read(fs);
        let base = format!("{}/", dir.trim_end_matches('/'));
        let found: Vec<Value> = entries
            .iter()
            .filter(|e| !e.is_dir())
            .filter(|e| {
                let sub = e.path.strip_prefix(&base).unwrap_or(&e.path);
                let name = sub.rsplit('/').next().unwrap_or(sub);
                glob.is_match(sub) || (!pattern.contains('/') && glob.is_match(name))
            })
            .take(MAX_ENTRIES)
            .map(|e| file_info(e, &accounts))
            .collect();
        Ok(Json(Value::Array(found)))
    })
    .await
}

#[derive(Deserialize)]
pub struct Replace {
    old: String,
    new: String,
}

/// A replace body: (path relative to the root, path as sent, what to replace), checked.
pub fn parse_replacements(body: &[u8]) -> ApiResult<Vec<(PathBuf, String, Replace)>> {
    let req: BTreeMap<String, Replace> = parse_body(body)?;
    let todo = req
        .into_iter()
        .map(|(path, r)| Ok((rel(&path)?, path, r)))
        .collect::<ApiResult<Vec<_>>>()?;
    if todo.iter().any(|(_, _, r)| r.old.is_empty()) {
        return Err(ApiError::bad_request("old must not be empty"));
    }
    Ok(todo)
}

async fn replace(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    RawQuery(q): RawQuery,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let verbose = query_one(&query_pairs(&q), "verbose").is_some_and(|v| v == "true" || v == "1");
    let todo = parse_replacements(&body)?;
    let counts = with_fs(&rec, move |fs| {
        let mut counts = serde_json::Map::new();
        for (r, p, rep) in todo {
            let n = replace_in_file(fs, &r, &p, &rep)?;
            counts.insert(p, json!({"replacedCount": n}));
        }
        Ok(counts)
    })
    .await?;
    if verbose {
        Ok(Json(Value::Object(counts)).into_response())
    } else {
        Ok(StatusCode::OK.into_response())
    }
}

/// Replaces every `rep.old` in the file `r` by `rep.new`, streaming it into a new file next
/// to it (same mode) that is renamed over it, as `sed -i` does: bounded memory whatever the
/// file's size, and the file is never seen half written. Returns the count.
fn replace_in_file(fs: &SandboxFs, r: &std::path::Path, p: &str, rep: &Replace) -> ApiResult<u64> {
    use std::os::unix::fs::PermissionsExt;
    let src = fs.open_regular(r).map_err(|e| errno(e, p))?;
    let mode = src
        .metadata()
        .map_err(|e| io_error(e, p))?
        .permissions()
        .mode()
        & 0o7777;
    let partial = upload_name(r)?;
    let out = fs.create_file(&partial, mode).map_err(|e| errno(e, p))?;
    let replaced = crate::filestream::replace_all(
        src,
        std::io::BufWriter::with_capacity(64 * 1024, out),
        rep.old.as_bytes(),
        rep.new.as_bytes(),
    );
    let result = match replaced {
        // Nothing to change: the file stays as it is.
        Ok(0) => Ok(0),
        Ok(n) => fs.rename(&partial, r).map(|()| n).map_err(|e| errno(e, p)),
        Err(crate::filestream::ReplaceError::NotUtf8) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "INVALID_FILE_CONTENT",
            format!("{p}: not UTF-8 text"),
        )),
        Err(crate::filestream::ReplaceError::Io(e)) => Err(io_error(e, p)),
    };
    if !matches!(result, Ok(n) if n > 0) {
        // The replace failed or changed nothing; its answer says which.
        let _ = fs.remove_file(&partial);
    }
    result
}

async fn list_dir(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<Value>> {
    let (pairs, dir) = with_path(&q)?;
    let depth: usize = query_one(&pairs, "depth")
        .map(|d| {
            d.parse()
                .map_err(|_| ApiError::bad_request("depth must be a number"))
        })
        .transpose()?
        .unwrap_or(1)
        .clamp(1, SEARCH_DEPTH);
    let relp = rel(&dir)?;
    with_fs(&rec, move |fs| {
        let top = fs.stat(&relp).map_err(|e| errno(e, &dir))?;
        if top.kind() == "symlink" {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_FILE",
                format!("{dir}: is a symbolic link"),
            ));
        }
        if !top.is_dir() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "INVALID_FILE",
                format!("{dir}: not a directory"),
            ));
        }
        let entries = fs.walk(&relp, depth).map_err(|e| errno(e, &dir))?;
        let accounts = Accounts::read(fs);
        Ok(Json(Value::Array(
            entries
                .iter()
                .take(MAX_ENTRIES)
                .map(|e| file_info(e, &accounts))
                .collect(),
        )))
    })
    .await
}

async fn mkdirs(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    JsonBody(body): JsonBody,
) -> ApiResult<StatusCode> {
    let req: BTreeMap<String, Perm> = parse_body(&body)?;
    let mut todo = Vec::new();
    for (path, perm) in req {
        todo.push((
            rel(&path)?,
            path,
            mode_from_digits(perm.mode.unwrap_or(0))?.unwrap_or(0o755),
            Ownership::new(perm.owner, perm.group),
        ));
    }
    with_fs(&rec, move |fs| {
        let accounts = Accounts::read(fs);
        let ids = todo
            .iter()
            .map(|(_, _, _, o)| o.ids(&accounts))
            .collect::<ApiResult<Vec<_>>>()?;
        for ((r, p, m, _), ids) in todo.iter().zip(ids) {
            fs.mkdir_p(r, *m).map_err(|e| errno(e, p))?;
            // The owner goes to the directory named (as execd), not to parents made for it.
            if ids.0.is_some() || ids.1.is_some() {
                set_owner_and_mode(fs, r, p, ids, Some(*m))?;
            }
        }
        Ok(StatusCode::OK)
    })
    .await
}

async fn delete_dirs(
    ExecdSandboxAnyState(rec): ExecdSandboxAnyState,
    RawQuery(q): RawQuery,
) -> ApiResult<StatusCode> {
    delete_each(&rec, &q, |fs, r| fs.remove_all(r)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_octal_digits() {
        assert_eq!(mode_from_digits(755).unwrap(), Some(0o755));
        assert_eq!(mode_from_digits(644).unwrap(), Some(0o644));
        assert_eq!(mode_from_digits(4755).unwrap(), Some(0o4755));
        assert_eq!(mode_from_digits(0).unwrap(), None);
        assert!(mode_from_digits(789).is_err());
        assert!(mode_from_digits(17777).is_err());
        assert_eq!(mode_to_digits(0o100644), 644);
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-3", 10), Some((0, 3)));
        assert_eq!(parse_range("bytes=5-", 10), Some((5, 9)));
        assert_eq!(parse_range("bytes=-4", 10), Some((6, 9)));
        assert_eq!(parse_range("bytes=8-100", 10), Some((8, 9)));
        assert_eq!(parse_range("bytes=10-12", 10), None);
        assert_eq!(parse_range("bytes=0-1,3-4", 10), None);
    }
}
