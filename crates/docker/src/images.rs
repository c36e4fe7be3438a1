//! Image endpoints: list, inspect, tag, remove, pull (`POST /images/create`) and the legacy
//! builder (`POST /build`), all over agentrun's image store.

use std::path::{Component, PathBuf};
use std::sync::Arc;

use agentrun_image::reference::{familiar, normalize};
use agentrun_image::{ImageError, ImageRecord, ImageStore, PullOptions};
use hyper::StatusCode;
use serde_json::json;

use crate::error::DockerError;
use crate::http::{json, json_line, streaming, DockerResult, Query};
use crate::pull_progress::PullStream;
use crate::ApiState;

/// The answer to an image store error about the image `name`.
pub fn image_error(name: &str, e: &ImageError) -> DockerError {
    match e {
        ImageError::NotFound(_) => DockerError::no_such_image(name),
        ImageError::InvalidName(..) => DockerError::bad_request(e.to_string()),
        ImageError::Ambiguous(_) | ImageError::InUse { .. } | ImageError::BuiltIn(_) => {
            DockerError::conflict(e.to_string())
        }
        _ => DockerError::internal(e.to_string()),
    }
}

fn repo_tags(store: &ImageStore, rec: &ImageRecord) -> Vec<String> {
    store
        .names_of(&rec.id)
        .unwrap_or_default()
        .iter()
        .map(|n| familiar(n))
        .collect()
}

fn created_secs(rec: &ImageRecord) -> i64 {
    rec.created
        .as_deref()
        .and_then(|c| chrono::DateTime::parse_from_rfc3339(c).ok())
        .map(|d| d.timestamp())
        .unwrap_or(rec.added as i64)
}

fn config_json(rec: &ImageRecord) -> serde_json::Value {
    let c = &rec.config;
    let ports: serde_json::Map<String, serde_json::Value> = c
        .exposed_ports
        .iter()
        .map(|p| (p.clone(), json!({})))
        .collect();
    json!({
        "Cmd": c.cmd,
        "Entrypoint": c.entrypoint,
        "Env": c.env,
        "WorkingDir": c.working_dir,
        "User": c.user,
        "ExposedPorts": ports,
        "Labels": c.labels,
        "StopSignal": c.stop_signal,
    })
}

/// `GET /images/{name}/json`
pub fn inspect(api: &ApiState, name: &str) -> DockerResult {
    let rec = api.store.find(name).map_err(|e| image_error(name, &e))?;
    let tags = repo_tags(&api.store, &rec);
    // A commit's author and message (`docker commit -a -m`), as the config says.
    let doc = api.store.config_document(&rec).unwrap_or_default();
    let author = doc["author"].as_str().unwrap_or_default();
    let comment = doc["history"]
        .as_array()
        .and_then(|h| h.last())
        .and_then(|h| h["comment"].as_str())
        .unwrap_or_default();
    Ok(json(
        StatusCode::OK,
        &json!({
            "Id": rec.id,
            "RepoTags": tags,
            "RepoDigests": [],
            "Parent": "",
            "Comment": comment,
            "Created": rec.created.clone().unwrap_or_default(),
            "DockerVersion": "",
            "Author": author,
            "Config": config_json(&rec),
            "Architecture": rec.architecture,
            "Os": rec.os,
            "Size": rec.size,
            "VirtualSize": rec.size,
            "GraphDriver": {"Name": "overlay2", "Data": null},
            "RootFS": {
                "Type": "layers",
                "Layers": rec.layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>(),
            },
            "Metadata": {"LastTagTime": "0001-01-01T00:00:00Z"},
        }),
    ))
}

/// `GET /images/json`
pub fn list(api: &ApiState) -> DockerResult {
    let mut out = Vec::new();
    let images = api
        .store
        .list()
        .map_err(|e| DockerError::internal(e.to_string()))?;
    for info in images.into_iter().filter(|i| !i.id.is_empty()) {
        let Ok(rec) = api.store.record(&info.id) else {
            continue;
        };
        out.push(json!({
            "Id": rec.id,
            "ParentId": "",
            "RepoTags": info.names.iter().map(|n| familiar(n)).collect::<Vec<_>>(),
            "RepoDigests": [],
            "Created": created_secs(&rec),
            "Size": rec.size,
            "VirtualSize": rec.size,
            "SharedSize": -1,
            "Labels": rec.config.labels,
            "Containers": -1,
        }));
    }
    Ok(json(StatusCode::OK, &serde_json::Value::Array(out)))
}

/// `POST /images/{name}/tag?repo=&tag=`
pub fn tag(api: &ApiState, name: &str, q: &Query) -> DockerResult {
    let Some(repo) = q.get("repo").filter(|r| !r.is_empty()) else {
        return Err(DockerError::bad_request(
            "repository name (repo) is required",
        ));
    };
    let target = match q.get("tag").filter(|t| !t.is_empty()) {
        Some(t) => format!("{repo}:{t}"),
        None => repo.to_owned(),
    };
    api.store
        .tag(name, &target)
        .map_err(|e| image_error(name, &e))?;
    Ok(crate::http::empty(StatusCode::CREATED))
}

/// `DELETE /images/{name}?force=`
pub fn remove(api: &ApiState, name: &str, q: &Query) -> DockerResult {
    let lines = api
        .store
        .remove(name, q.bool("force"))
        .map_err(|e| image_error(name, &e))?;
    let items: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| {
            l.strip_prefix("Untagged: ")
                .map(|n| json!({"Untagged": n}))
                .or_else(|| l.strip_prefix("Deleted: ").map(|d| json!({"Deleted": d})))
        })
        .collect();
    Ok(json(StatusCode::OK, &serde_json::Value::Array(items)))
}

/// `POST /images/create?fromImage=&tag=`: a pull through the store's registry client.
pub async fn pull(api: &ApiState, q: &Query) -> DockerResult {
    let Some(from) = q.get("fromImage").filter(|f| !f.is_empty()) else {
        return Err(DockerError::bad_request(
            "fromImage is required (importing from a tarball is not supported: use `agentrun image import`)",
        ));
    };
    let name = match q.get("tag").filter(|t| !t.is_empty()) {
        Some(t) if t.starts_with("sha256:") => format!("{from}@{t}"),
        Some(t) => format!("{from}:{t}"),
        None => from.to_owned(),
    };
    let full = normalize(&name).map_err(|e| DockerError::bad_request(e.to_string()))?;
    let (repo, tag) = familiar_repo_and_tag(&full);
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let progress = PullStream::new(lines_tx, repo, tag);
    let downloaded = progress.downloaded_flag();
    // The store held by the pull is the only holder of the line sender: `lines` ends when
    // the pull does.
    let store = api.store.clone().with_progress(Arc::new(progress));
    let n = name.clone();
    let mut pull = tokio::task::spawn_blocking(move || store.pull(&n, &PullOptions::default()));
    // A pull failing before its first layer event (no such image, no registry) is answered
    // with an HTTP error; once lines flow, the answer is a 200 stream and a later failure
    // its last line, as dockerd does.
    let (first, finished) = tokio::select! {
        line = lines.recv() => (line, None),
        done = &mut pull => match done {
            Ok(Ok(rec)) => (lines.recv().await, Some(rec)),
            Ok(Err(e)) => return Err(pull_error(&name, &e)),
            Err(e) => return Err(DockerError::join(e)),
        },
    };
    let (reply, tx) = streaming("application/json");
    let image = familiar(&full);
    tokio::spawn(async move {
        if let Some(l) = first {
            let _ = tx.send(l).await;
        }
        // A client gone away does not stop the pull: what it fetched is kept.
        while let Some(l) = lines.recv().await {
            let _ = tx.send(l).await;
        }
        let outcome = match finished {
            Some(rec) => Ok(Ok(rec)),
            None => pull.await,
        };
        let last = match outcome {
            Ok(Ok(rec)) => {
                let status = if downloaded.load(std::sync::atomic::Ordering::SeqCst) {
                    format!("Status: Downloaded newer image for {image}")
                } else {
                    format!("Status: Image is up to date for {image}")
                };
                vec![
                    json!({"status": format!("Digest: {}", rec.manifest_digest)}),
                    json!({ "status": status }),
                ]
            }
            // Midway: the registry knew the image, say what broke.
            Ok(Err(e)) => vec![stream_error(&e.to_string())],
            Err(e) => vec![stream_error(&e.to_string())],
        };
        for l in last {
            let _ = tx.send(json_line(&l)).await;
        }
    });
    Ok(reply)
}

/// What a failed pull answers: 404 when the registry does not know the image.
fn pull_error(name: &str, e: &ImageError) -> DockerError {
    let msg = e.to_string();
    let status = if msg.contains("MANIFEST_UNKNOWN")
        || msg.contains("NAME_UNKNOWN")
        || msg.contains("not found")
        || msg.contains("404")
    {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    DockerError::new(
        status,
        format!("pull access denied for {name}, repository does not exist or may require 'docker login': {msg}"),
    )
}

/// `docker.io/library/busybox:1.36` as the pull stream's first line names it: (`busybox`,
/// `1.36`); a digest reference's "tag" is its digest.
fn familiar_repo_and_tag(full: &str) -> (String, String) {
    let short = familiar(full);
    if let Some((repo, digest)) = short.split_once('@') {
        return (repo.to_owned(), digest.to_owned());
    }
    match short.rsplit_once(':').filter(|(_, t)| !t.contains('/')) {
        Some((repo, tag)) => (repo.to_owned(), tag.to_owned()),
        None => (short.clone(), "latest".to_owned()),
    }
}

/// Why a `POST /build` query is refused (a 400).
#[derive(Debug, thiserror::Error)]
pub enum BuildQueryError {
    #[error("remote build contexts are not supported: send the context as a tar")]
    Remote,
    #[error("dockerfile {0:?}: must be a path inside the build context")]
    DockerfileOutside(String),
    #[error("buildargs: {0}")]
    BuildArgs(serde_json::Error),
    #[error(transparent)]
    Tag(agentrun_image::ImageError),
}

/// The build options `POST /build`'s query asks for (`dockerfile`, `t`, `buildargs`; the
/// context directory is filled in once the body is unpacked); `Err` is the 400.
pub fn build_options(q: &Query) -> Result<agentrun_build::BuildOptions, BuildQueryError> {
    if q.get("remote").is_some_and(|r| !r.is_empty()) {
        return Err(BuildQueryError::Remote);
    }
    let mut opts = agentrun_build::BuildOptions::new(PathBuf::new());
    if let Some(f) = q.get("dockerfile").filter(|f| !f.is_empty()) {
        // Read from inside the context, never from the daemon's file system.
        let p = PathBuf::from(f);
        if !p
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(BuildQueryError::DockerfileOutside(f.into()));
        }
        opts.dockerfile = p;
    }
    opts.tags = q.all("t").into_iter().filter(|t| !t.is_empty()).collect();
    if let Some(args) = q.get("buildargs").filter(|a| !a.is_empty()) {
        let m = serde_json::from_str::<std::collections::BTreeMap<String, Option<String>>>(args)
            .map_err(BuildQueryError::BuildArgs)?;
        for (k, v) in m {
            if let Some(v) = v {
                opts.build_args.insert(k, v);
            }
        }
    }
    for t in &opts.tags {
        normalize(t).map_err(BuildQueryError::Tag)?;
    }
    Ok(opts)
}

/// `POST /build`: the context tar arrives as the body (length or chunked) and is unpacked as
/// it arrives (at most `--max-upload` bytes of it: 413 above); progress streams back as
/// `{"stream": ...}` lines ending with `Successfully built <id>`.
pub async fn build(api: &ApiState, q: &Query, body: axum::body::Body) -> DockerResult {
    let mut opts = build_options(q).map_err(DockerError::bad_request)?;
    let quiet = q.bool("q");
    let dir = tempdir_in(&api.tmp_dir)
        .map_err(|e| DockerError::internal(format!("build context: {e}")))?;
    let limit = api.limits.max_upload;
    let (reader, over_limit) = crate::http::body_reader(body, limit);
    let into = dir.clone();
    let context_store = api.store.clone();
    let unpacked =
        tokio::task::spawn_blocking(move || context_store.unpack_context(reader, &into)).await;
    let failed = match unpacked {
        _ if over_limit.load(std::sync::atomic::Ordering::SeqCst) => {
            Some(DockerError::too_large(limit, "max-upload"))
        }
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(DockerError::bad_request(format!("build context: {e}"))),
        Err(e) => Some(DockerError::join(e)),
    };
    if let Some(e) = failed {
        let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir)).await;
        if let Ok(Err(e)) = removed {
            tracing::warn!(target: crate::LOG, "docker API: removing a build context: {e}");
        }
        return Err(e);
    }
    let (reply, tx) = streaming("application/json");
    let store = api.store.clone();
    let paths = api.runtime_paths.clone();
    let host = api.host.clone();
    tokio::task::spawn_blocking(move || {
        let send = |v: serde_json::Value| {
            let _ = tx.blocking_send(json_line(&v));
        };
        opts.context = dir.clone();
        let build_host = agentrun_build::BuildHost {
            paths: &paths,
            host: &host,
        };
        let result = agentrun_build::build(&store, &build_host, &opts, &mut |ev| {
            if quiet {
                return;
            }
            let text = match ev {
                agentrun_build::BuildEvent::Step { index, total, text } => {
                    format!("Step {index}/{total} : {text}\n")
                }
                agentrun_build::BuildEvent::Output(b) => String::from_utf8_lossy(b).into_owned(),
                agentrun_build::BuildEvent::Note(n) => format!("{n}\n"),
            };
            send(json!({ "stream": text }));
        })
        .map_err(|e| e.to_string());
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(target: "agentrun::docker", "docker API: removing a build context: {e}");
        }
        match result {
            Ok(rec) => {
                send(json!({"aux": {"ID": rec.id}}));
                if quiet {
                    send(json!({ "stream": format!("{}\n", rec.id) }));
                } else {
                    send(
                        json!({ "stream": format!("Successfully built {}\n", agentrun_image::short_id(&rec.id)) }),
                    );
                    for t in &opts.tags {
                        let full = normalize(t).unwrap_or_else(|_| t.clone());
                        send(
                            json!({ "stream": format!("Successfully tagged {}\n", familiar(&full)) }),
                        );
                    }
                }
            }
            Err(msg) => send(stream_error(&msg)),
        }
    });
    Ok(reply)
}

/// The last line of a progress stream that failed (`docker build`, `docker pull`).
fn stream_error(msg: &str) -> serde_json::Value {
    json!({"errorDetail": {"message": msg}, "error": msg})
}

/// A fresh private directory under `parent`.
fn tempdir_in(parent: &std::path::Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::create_dir_all(parent)?;
    for n in 0..1000u32 {
        let p = parent.join(format!(
            "build-{}-{}-{n}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free temp dir name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_options_read_the_query() {
        let q = Query::parse(Some(
            "t=seed%2Fimg%3A1&t=&dockerfile=sub%2FDockerfile&buildargs=%7B%22A%22%3A%221%22%2C%22B%22%3Anull%7D",
        ));
        let o = build_options(&q).unwrap();
        assert_eq!(o.tags, vec!["seed/img:1".to_string()]);
        assert_eq!(o.dockerfile, PathBuf::from("sub/Dockerfile"));
        assert_eq!(o.build_args.get("A").map(String::as_str), Some("1"));
        assert!(!o.build_args.contains_key("B"));
        assert!(build_options(&Query::parse(Some("t=UPPER"))).is_err());
        assert!(build_options(&Query::parse(Some("buildargs=%5B"))).is_err());
        assert!(build_options(&Query::parse(Some("remote=x"))).is_err());
    }

    #[test]
    fn pull_streams_name_the_repository_and_tag_like_dockerd() {
        let rt = |n: &str| familiar_repo_and_tag(&normalize(n).unwrap());
        assert_eq!(rt("busybox"), ("busybox".into(), "latest".into()));
        assert_eq!(rt("busybox:1.36"), ("busybox".into(), "1.36".into()));
        assert_eq!(
            rt("localhost:5000/team/app:7"),
            ("localhost:5000/team/app".into(), "7".into())
        );
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(rt(&format!("busybox@{digest}")), ("busybox".into(), digest));
    }

    #[test]
    fn the_dockerfile_must_be_inside_the_context() {
        for bad in ["/etc/shadow", "../x", "sub/../../x"] {
            let q = Query::parse(Some(&format!("dockerfile={bad}")));
            let err = build_options(&q).unwrap_err().to_string();
            assert!(err.contains("inside the build context"), "{bad}: {err}");
        }
        let q = Query::parse(Some("dockerfile=./docker/Dockerfile.dev"));
        assert_eq!(
            build_options(&q).unwrap().dockerfile,
            PathBuf::from("./docker/Dockerfile.dev")
        );
    }
}
