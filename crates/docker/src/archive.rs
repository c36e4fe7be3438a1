//! `/containers/{id}/archive`: `docker cp`, docker-py `put_archive`/`get_archive`.
//!
//! Every path is resolved inside the container's root with the in-root file layer
//! (`openat2(RESOLVE_IN_ROOT)`, run with the sandbox root's fsuid): `..`, absolute symlinks and
//! races never reach the host, and files written get the sandbox's owner. Running, exited and
//! created containers alike: the files are in the container's sandbox, which lives until the
//! container is removed (a created one gets it now). Regular files, directories, symlinks
//! (carried as links, never followed) and hard links within one archive are carried;
//! devices, FIFOs and sockets are left out. Both directions stream: a tar is written and
//! read as it goes, never held whole (a 1 TiB sparse file costs the daemon a 64 KiB chunk).

use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentrun_runtime::fsroot::{as_sandbox_root, relative, SandboxFs};
use axum::extract::{Path as UrlPath, Request, State};
use bytes::Bytes;
use hyper::body::Frame;
use hyper::{Method, Response, StatusCode};
use serde_json::json;

use crate::container_api::find;
use crate::containers::Container;
use crate::error::DockerError;
use crate::http::{DockerResult, Query};
use crate::ApiState;

/// The container's files (its sandbox's root; a sandbox is made now for a container never
/// started).
async fn sandbox_fs(api: Arc<ApiState>, c: Arc<Container>) -> Result<SandboxFs, DockerError> {
    let sb = tokio::task::spawn_blocking(move || crate::containers::ensure_sandbox(&api, &c))
        .await
        .map_err(DockerError::join)??;
    sb.root()
        .map(SandboxFs::new)
        .map_err(|e| DockerError::conflict(e.to_string()))
}

/// `?path=` of the archive endpoints: (absolute path, path relative to the container root).
pub fn path_param(q: &Query) -> Result<(String, PathBuf), DockerError> {
    let p = q
        .get("path")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| DockerError::bad_request("path is required"))?;
    let abs = if p.starts_with('/') {
        p.to_owned()
    } else {
        format!("/{p}")
    };
    let rel = relative(&abs).map_err(DockerError::bad_request)?;
    Ok((abs, rel))
}

/// Go's `os.FileMode` bits for the stat header.
fn go_mode(st_mode: u32) -> u64 {
    let perm = u64::from(st_mode & 0o777);
    let kind = match st_mode & libc::S_IFMT {
        libc::S_IFDIR => 1u64 << 31,
        libc::S_IFLNK => 1u64 << 27,
        _ => 0,
    };
    perm | kind
}

/// A path the container does not have: dockerd's 404 (without a body to `HEAD`: the Go
/// client breaks on a body there).
fn not_found(abs: &str, c: &Container, head: bool) -> DockerResult {
    if head {
        return Ok(crate::http::empty(StatusCode::NOT_FOUND));
    }
    Err(DockerError::not_found(format!(
        "Could not find the file {abs} in container {}",
        c.name
    )))
}

/// Bytes of a `get_archive` tar in flight between the thread writing it and the client.
const TAR_CHUNK: usize = 64 * 1024;

/// `HEAD` / `GET /containers/{id}/archive?path=`: the stat header (and a tar of the path,
/// streamed as it is written: the daemon holds a chunk, never a file; an error midway ends
/// the body short, so the client sees a failed transfer, not a truncated archive).
pub async fn get(
    State(api): State<Arc<ApiState>>,
    UrlPath(key): UrlPath<String>,
    q: Query,
    method: Method,
) -> DockerResult {
    let c = find(&api, &key)?;
    let head = method == Method::HEAD;
    let (abs, rel) = path_param(&q)?;
    let fs = sandbox_fs(api, c.clone()).await?;
    let c2 = c.clone();
    // `link/` or `link/.` means what the link leads to; `link` the link itself.
    let follow = abs.ends_with('/') || abs.ends_with("/.");
    let result = tokio::task::spawn_blocking(move || {
        as_sandbox_root(
            || -> Result<(serde_json::Value, SandboxFs, PathBuf, String, bool), rustix::io::Errno> {
                let mut rel2 = rel;
                if follow && fs.stat(&rel2)?.kind() == "symlink" {
                    rel2 = fs.resolve(&rel2)?;
                }
                let entry = fs.stat(&rel2)?;
                let name = rel2
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "/".into());
                // As dockerd: where the link leads, resolved in the container's root (the
                // CLI follows it with `cp -L`, and copies into a linked directory through it).
                let link_target = if entry.kind() == "symlink" {
                    format!("/{}", fs.resolve(&rel2)?.display())
                } else {
                    String::new()
                };
                let stat = json!({
                    "name": name,
                    "size": entry.stat.st_size,
                    "mode": go_mode(entry.stat.st_mode),
                    "mtime": chrono::DateTime::from_timestamp(entry.stat.st_mtime, 0)
                        .map(|d| d.to_rfc3339()).unwrap_or_default(),
                    "linkTarget": link_target,
                });
                Ok((stat, fs, rel2, name, entry.is_dir()))
            },
        )
    })
    .await;
    let (stat, fs, rel, name, is_dir) = match result {
        Ok(Ok(v)) => v,
        Ok(Err(rustix::io::Errno::NOENT)) => return not_found(&abs, &c2, head),
        Ok(Err(e)) => return Err(DockerError::internal(format!("{abs}: {e}"))),
        Err(e) => return Err(DockerError::join(e)),
    };
    let header = base64_encode(serde_json::to_vec(&stat).expect("json").as_slice());
    let body = if head {
        crate::http::boxed(http_body_util::Empty::<Bytes>::new())
    } else {
        tar_body(fs, rel, name, is_dir)
    };
    let mut r = Response::new(body);
    r.headers_mut()
        .insert("content-type", "application/x-tar".parse().expect("header"));
    if let Ok(v) = header.parse() {
        r.headers_mut().insert("x-docker-container-path-stat", v);
    }
    Ok(r)
}

/// The tar of `rel` (named `name` in it), written on a blocking thread as the client reads it.
fn tar_body(fs: SandboxFs, rel: PathBuf, name: String, is_dir: bool) -> crate::http::Body {
    let (reader, writer) = tokio::io::duplex(TAR_CHUNK);
    let writer = tokio_util::io::SyncIoBridge::new(writer);
    let (outcome_tx, outcome) = tokio::sync::oneshot::channel::<std::io::Error>();
    tokio::task::spawn_blocking(move || {
        let written = as_sandbox_root(|| -> std::io::Result<()> {
            let mut b = tar::Builder::new(writer);
            let base = PathBuf::from(if name == "/" { "." } else { &name });
            append(&fs, &mut b, &rel, &base, is_dir)?;
            b.into_inner()?.flush()
        });
        // The writer is gone by now: the body ends, with this error after what was sent.
        if let Err(e) = written {
            let _ = outcome_tx.send(e);
        }
    });
    use tokio_stream::StreamExt as _;
    let data = tokio_util::io::ReaderStream::with_capacity(reader, TAR_CHUNK)
        .map(|chunk| chunk.map(Frame::data).map_err(crate::http::BoxError::from));
    let failure = tokio_stream::once(outcome).then(|outcome| async move {
        outcome
            .await
            .ok()
            .map(|e| Err(crate::http::BoxError::from(e)))
    });
    let failure = tokio_stream::StreamExt::filter_map(failure, |x| x);
    http_body_util::BodyExt::boxed(http_body_util::StreamBody::new(data.chain(failure)))
}

/// A file's data for the tar: exactly `len` bytes, or an error if the file ends sooner (it
/// shrank since its header was written: the archive would be corrupt).
struct Exactly<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exactly<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file shrank while it was archived",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn append<W: Write>(
    fs: &SandboxFs,
    b: &mut tar::Builder<W>,
    rel: &Path,
    name: &Path,
    is_dir: bool,
) -> std::io::Result<()> {
    let entry = fs.stat(rel)?;
    let mut h = tar::Header::new_gnu();
    h.set_mode(entry.stat.st_mode & 0o7777);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(entry.stat.st_mtime.max(0) as u64);
    if is_dir {
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        b.append_data(&mut h, name, std::io::empty())?;
        for child in fs.walk(rel, 1)? {
            let child_name = child.path.rsplit('/').next().unwrap_or("").to_owned();
            append(
                fs,
                b,
                &rel.join(&child_name),
                &name.join(&child_name),
                child.is_dir(),
            )?;
        }
    } else if entry.kind() == "file" {
        let f = fs.open_regular(rel)?;
        // The size of what is open, read exactly (streamed: never the whole file in memory).
        let len = f.metadata()?.len();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(len);
        b.append_data(
            &mut h,
            name,
            Exactly {
                inner: std::io::BufReader::with_capacity(TAR_CHUNK, f),
                left: len,
            },
        )?;
    } else if entry.kind() == "symlink" {
        // The link itself, as written (not followed).
        let target = fs.readlink(rel)?;
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, name, Path::new(&target))?;
    }
    // Devices, FIFOs and sockets are left out.
    Ok(())
}

/// `PUT /containers/{id}/archive?path=`: unpacks the tar body into `path` (a directory) as
/// it arrives, at most `--max-upload` bytes of it (413 above, with what came before it
/// unpacked, as an interrupted `docker cp` leaves it).
pub async fn put(
    State(api): State<Arc<ApiState>>,
    UrlPath(key): UrlPath<String>,
    q: Query,
    req: Request,
) -> DockerResult {
    let c = find(&api, &key)?;
    let (abs, rel) = path_param(&q)?;
    let limit = api.limits.max_upload;
    let fs = sandbox_fs(api, c.clone()).await?;
    let (body, over_limit) = crate::http::body_reader(req.into_body(), limit);
    let c2 = c.clone();
    let result =
        tokio::task::spawn_blocking(move || as_sandbox_root(|| extract(&fs, &rel, body))).await;
    if over_limit.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(DockerError::too_large(limit, "max-upload"));
    }
    match result.map_err(DockerError::join)? {
        Ok(()) => Ok(crate::http::empty(StatusCode::OK)),
        Err(e) if e.status == StatusCode::NOT_FOUND => not_found(&abs, &c2, false),
        Err(e) => Err(e),
    }
}

/// Unpacks a `PUT .../archive` tar body into the directory `rel` of a container's root (the
/// extraction point may be or go through a link, followed inside the root, as dockerd does).
/// Run it inside [`as_sandbox_root`]. `Err` is the answer (a 404: no such extraction point).
pub fn extract(fs: &SandboxFs, rel: &Path, body: impl std::io::Read) -> Result<(), DockerError> {
    // As dockerd: the extraction point may be (or go through) a link, followed in
    // the container's root.
    let rel = fs
        .resolve(rel)
        .map_err(|e| DockerError::internal(e.to_string()))?;
    match fs.stat(&rel) {
        Ok(e) if e.is_dir() => {}
        Ok(_) => {
            return Err(DockerError::bad_request(
                "extraction point is not a directory",
            ))
        }
        Err(rustix::io::Errno::NOENT) => {
            return Err(DockerError::not_found("no such extraction point"))
        }
        Err(e) => return Err(DockerError::internal(e.to_string())),
    }
    let mut archive = tar::Archive::new(body);
    let entries = archive
        .entries()
        .map_err(|e| DockerError::bad_request(format!("not a tar archive: {e}")))?;
    for entry in entries {
        let mut entry =
            entry.map_err(|e| DockerError::bad_request(format!("corrupt tar archive: {e}")))?;
        let path = entry
            .path()
            .map_err(|e| DockerError::bad_request(e.to_string()))?
            .to_string_lossy()
            .into_owned();
        // Inside `path`, whatever the entry says (`..` cannot climb out of it).
        let inner =
            relative(&format!("/{path}")).map_err(|e| DockerError::bad_request(e.to_string()))?;
        if inner.as_os_str().is_empty() {
            continue;
        }
        let target = rel.join(inner);
        let mode = entry.header().mode().unwrap_or(0o644) & 0o7777;
        let failed =
            |e: rustix::io::Errno| DockerError::internal(format!("{}: {e}", target.display()));
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::Regular
                | tar::EntryType::Continuous
                | tar::EntryType::Symlink
                | tar::EntryType::Link
        ) {
            // As dockerd: what is there is replaced, not written through (a symlink
            // in the way is removed, not followed). Directories stay.
            match fs.stat(&target) {
                Ok(e) if !e.is_dir() => fs.remove_file(&target).map_err(failed)?,
                _ => {}
            }
        }
        match kind {
            tar::EntryType::Directory => fs.mkdir_p(&target, mode.max(0o700)).map_err(failed)?,
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mut f = fs.create_file(&target, mode).map_err(failed)?;
                std::io::copy(&mut entry, &mut f)
                    .and_then(|_| f.flush())
                    .map_err(|e| DockerError::internal(format!("{}: {e}", target.display())))?;
            }
            tar::EntryType::Symlink => {
                let link = entry.link_name_bytes().ok_or_else(|| {
                    DockerError::bad_request(format!("{path}: symlink without a target"))
                })?;
                let link = std::ffi::OsStr::from_bytes(&link).to_owned();
                fs.symlink(&link, &target).map_err(failed)?;
            }
            tar::EntryType::Link => {
                // A name earlier in the archive, under the same extraction point.
                let link = entry.link_name_bytes().ok_or_else(|| {
                    DockerError::bad_request(format!("{path}: hard link without a target"))
                })?;
                let link = String::from_utf8_lossy(&link).into_owned();
                let from = relative(&format!("/{link}"))
                    .map_err(|e| DockerError::bad_request(e.to_string()))?;
                fs.hard_link(&rel.join(from), &target).map_err(failed)?;
            }
            // Devices, FIFOs and sockets are not written.
            _ => {}
        }
    }
    Ok(())
}

fn base64_encode(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}
