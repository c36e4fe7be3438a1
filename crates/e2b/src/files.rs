//! envd's HTTP API: `GET /files?path=` (a file's bytes, streamed), `POST /files` (uploads,
//! `multipart/form-data` with one `file` part a file, named by `path` or the part's file
//! name, or `application/octet-stream` to `path`; parents are made; the answer lists what
//! was written), and `GET /health` (204; 502 for a sandbox that is not there).
//!
//! Files are written as the OpenSandbox front end writes them: into a hidden name next to the
//! target, renamed over it once complete, so an upload cut short never leaves a partial file;
//! at most `--max-upload` bytes (413 above). Paths resolve inside the sandbox
//! ([`crate::filesystem::absolute`]: relative to the home of `username`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentrun_opensandbox::files::{errno, file_body, io_error, rel, upload_name, with_fs};
use agentrun_opensandbox::{Record, Server};
use axum::body::Bytes;
use axum::extract::multipart::Multipart;
use axum::extract::{DefaultBodyLimit, FromRequest, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::error::{E2bError, E2bResult};

pub fn routes(server: Arc<Server>) -> Router {
    let upload_limit = usize::try_from(server.limits.max_upload).unwrap_or(usize::MAX);
    Router::new()
        .route(
            "/files",
            get(download)
                .post(upload)
                .layer(DefaultBodyLimit::max(upload_limit)),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            server.clone(),
            crate::auth::require_access_token,
        ))
        .route("/health", get(health))
        .with_state(server)
}

/// envd's health: 204, or, for a sandbox that is not (or no longer) there, 502 "was not
/// found" (what the SDK's `is_running` takes as "not running"). It needs no token, and says
/// no more than whether a sandbox of that id runs.
async fn health(
    State(server): State<Arc<Server>>,
    headers: axum::http::HeaderMap,
) -> E2bResult<StatusCode> {
    if let Some(id) = crate::auth::sandbox_id(&headers) {
        if server.record(&id).is_err() {
            return Err(E2bError::new(
                StatusCode::BAD_GATEWAY,
                format!("sandbox {id} was not found"),
            ));
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The `path` and `username` of a `/files` query.
fn query(q: Option<&str>) -> (Option<String>, Option<String>) {
    let mut path = None;
    let mut user = None;
    for (k, v) in form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
        match &*k {
            "path" => path = Some(v.into_owned()),
            "username" => user = Some(v.into_owned()).filter(|u| !u.is_empty() && u != "root"),
            _ => {}
        }
    }
    (path, user)
}

/// A path of a `/files` request: (absolute, relative to the sandbox's root).
fn resolve(path: &str, user: Option<&str>) -> E2bResult<(String, PathBuf)> {
    if path.is_empty() {
        return Err(E2bError::bad_request("path is required"));
    }
    let abs = crate::filesystem::absolute(path, user);
    let r = rel(&abs).map_err(E2bError::from)?;
    Ok((abs, r))
}

async fn download(
    Extension(rec): Extension<Arc<Record>>,
    RawQuery(q): RawQuery,
) -> E2bResult<Response> {
    let (path, user) = query(q.as_deref());
    let path = path.ok_or_else(|| E2bError::bad_request("missing query parameter path"))?;
    let (shown, r) = resolve(&path, user.as_deref())?;
    let file = with_fs(&rec, move |fs| {
        fs.open_regular(&r).map_err(|e| errno(e, &shown))
    })
    .await?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok((
        [
            ("content-type", "application/octet-stream".to_string()),
            ("content-length", size.to_string()),
        ],
        file_body(file, size),
    )
        .into_response())
}

/// What an upload answers per file written.
fn written(abs: &str) -> Value {
    let name = Path::new(abs)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    json!({"name": name, "type": "file", "path": abs})
}

async fn upload(
    State(server): State<Arc<Server>>,
    Extension(rec): Extension<Arc<Record>>,
    RawQuery(q): RawQuery,
    req: Request,
) -> E2bResult<Json<Value>> {
    let (path, user) = query(q.as_deref());
    let ctype = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let gzip = match req
        .headers()
        .get("content-encoding")
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
    {
        None => false,
        Some(e) if e == "identity" || e.is_empty() => false,
        Some(e) if e == "gzip" => true,
        Some(e) => {
            return Err(E2bError::bad_request(format!(
                "Content-Encoding {e} is not served: upload uncompressed or gzip"
            )))
        }
    };
    let limit = server.limits.max_upload;
    if ctype.starts_with("application/octet-stream") {
        let path = path.ok_or_else(|| E2bError::bad_request("missing query parameter path"))?;
        let (abs, r) = resolve(&path, user.as_deref())?;
        let mut chunks = req
            .into_body()
            .into_data_stream()
            .map(|c| c.map_err(|e| E2bError::bad_request(format!("request body: {e}"))));
        write_file(&rec, &abs, r, &mut chunks, limit, gzip).await?;
        return Ok(Json(json!([written(&abs)])));
    }
    if gzip {
        return Err(E2bError::bad_request(
            "Content-Encoding gzip is served for application/octet-stream uploads only",
        ));
    }
    if !ctype.starts_with("multipart/form-data") {
        return Err(E2bError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "upload as multipart/form-data or application/octet-stream",
        ));
    }
    let mut multipart = Multipart::from_request(req, &server)
        .await
        .map_err(|r| E2bError::new(r.status(), r.body_text()))?;
    let mut out = Vec::new();
    loop {
        let field = multipart.next_field().await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                too_large(limit)
            } else {
                E2bError::bad_request(format!("multipart: {e}"))
            }
        })?;
        let Some(mut field) = field else { break };
        if field.name() != Some("file") {
            continue;
        }
        let target = match (&path, field.file_name()) {
            (Some(p), _) if out.is_empty() => p.clone(),
            (_, Some(f)) if !f.is_empty() => f.to_owned(),
            _ => {
                return Err(E2bError::bad_request(
                    "a file part needs a path (the path parameter or its file name)",
                ))
            }
        };
        let (abs, r) = resolve(&target, user.as_deref())?;
        // The part's chunks, as they arrive (never the whole part in memory).
        let chunks = futures_util::stream::unfold(&mut field, |f| async move {
            let next = f.chunk().await.map_err(|e| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    too_large(limit)
                } else {
                    E2bError::bad_request(format!("multipart: {e}"))
                }
            });
            next.transpose().map(|c| (c, f))
        });
        let mut chunks = Box::pin(chunks);
        write_file(&rec, &abs, r, &mut chunks, limit, false).await?;
        out.push(written(&abs));
    }
    if out.is_empty() {
        return Err(E2bError::bad_request("no file part in the upload"));
    }
    Ok(Json(Value::Array(out)))
}

fn too_large(limit: u64) -> E2bError {
    E2bError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("upload larger than {limit} bytes (agentrun serve --max-upload)"),
    )
}

/// Writes the chunks of `chunks` (gzip-compressed if `gzip`) to `r` in the sandbox (shown as
/// `abs`): into a hidden name next to it, renamed over it once complete (removed on any
/// error); parents are made. At most `limit` bytes are written (and, compressed, read).
async fn write_file(
    rec: &Record,
    abs: &str,
    r: PathBuf,
    chunks: &mut (impl futures_util::Stream<Item = E2bResult<Bytes>> + Unpin),
    limit: u64,
    gzip: bool,
) -> E2bResult<()> {
    let partial = upload_name(&r)?;
    let (p2, r2, shown) = (partial.clone(), r.clone(), abs.to_owned());
    let file = with_fs(rec, move |fs| {
        if let Some(parent) = r2.parent() {
            fs.mkdir_p(parent, 0o755).map_err(|e| errno(e, &shown))?;
        }
        fs.create_file(&p2, 0o644).map_err(|e| errno(e, &shown))
    })
    .await?;
    let file = Limited {
        inner: file,
        left: limit,
    };
    let result = if gzip {
        match copy(
            flate2::write::GzDecoder::new(file),
            chunks,
            abs,
            limit,
            true,
        )
        .await
        {
            Ok(mut w) => tokio::task::spawn_blocking(move || w.try_finish())
                .await
                .map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
                .and_then(|r| r.map_err(|e| write_error(e, abs, limit, true))),
            Err(e) => Err(e),
        }
    } else {
        copy(file, chunks, abs, limit, false).await.map(drop)
    };
    let shown = abs.to_owned();
    let done = with_fs(rec, move |fs| {
        let moved = result
            .map_err(|e| agentrun_opensandbox::ApiError::new(e.status, "UPLOAD", e.message))
            .and_then(|()| fs.rename(&partial, &r).map_err(|e| errno(e, &shown)));
        if moved.is_err() {
            // The upload already failed (that error is answered); a partial file left is hidden.
            let _ = fs.remove_file(&partial);
        }
        moved
    })
    .await;
    done.map_err(E2bError::from)
}

/// A writer that takes at most `left` more bytes (then fails with `FileTooLarge`).
struct Limited<W> {
    inner: W,
    left: u64,
}

impl<W: Write> Write for Limited<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(std::io::ErrorKind::FileTooLarge.into());
        }
        let n = self.inner.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The error of writing an upload: too large past `limit`; the file system's own errors;
/// for a gzip one (`gzip`), anything else is its data.
fn write_error(e: std::io::Error, abs: &str, limit: u64, gzip: bool) -> E2bError {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::FileTooLarge => too_large(limit),
        K::StorageFull | K::QuotaExceeded | K::PermissionDenied | K::ReadOnlyFilesystem => {
            E2bError::from(io_error(e, abs))
        }
        _ if gzip => E2bError::bad_request(format!("{abs}: the upload is not valid gzip: {e}")),
        _ => E2bError::from(io_error(e, abs)),
    }
}

/// Writes `chunks` to `file` (counting what is read against `limit`); gives the writer back.
async fn copy<W: Write + Send + 'static>(
    mut file: W,
    chunks: &mut (impl futures_util::Stream<Item = E2bResult<Bytes>> + Unpin),
    abs: &str,
    limit: u64,
    gzip: bool,
) -> E2bResult<W> {
    let mut size = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        size += chunk.len() as u64;
        if size > limit {
            return Err(too_large(limit));
        }
        let (f, res) = tokio::task::spawn_blocking(move || {
            let r = file.write_all(&chunk);
            (file, r)
        })
        .await
        .map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        file = f;
        res.map_err(|e| write_error(e, abs, limit, gzip))?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        assert_eq!(
            query(Some("path=%2Ftmp%2Fa&username=user")),
            (Some("/tmp/a".into()), Some("user".into()))
        );
        assert_eq!(
            query(Some("path=a&username=root")),
            (Some("a".into()), None)
        );
        assert_eq!(query(None), (None, None));
    }
}
