//! `image pull`: fetching an image from an OCI/Docker registry with `oci-client`.
//!
//! The manifest is fetched raw (so its digest, and an export of it, stay exact); an index or
//! manifest list is resolved to its linux/amd64 image. Blobs already in the store are not
//! fetched again. Each blob is downloaded into the store's `tmp/`, checked against its digest
//! and renamed into place, so concurrent pulls of one image are safe and an interrupted pull
//! leaves nothing half-written behind a name.
//!
//! Credentials come from the Docker config (`$DOCKER_CONFIG/config.json` or
//! `~/.docker/config.json`, credential helpers included); the registry's token auth is
//! handled by the client. Registries on loopback (`localhost`, `127.0.0.0/8`, `[::1]`) and those
//! in `insecure` are spoken to over plain HTTP, like Docker's insecure-registries.

use std::path::PathBuf;
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_spec::image::{ImageIndex, ImageManifest};

use crate::archive::pick_platform;
use crate::blobs::temp_path;
use crate::digest::of_bytes;
use crate::limits::{human_size, Exceeded, Limit};
use crate::progress::{NoProgress, Phase, Progress, Tick};
use crate::reference;
use crate::store::{ImageStore, DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST};
use crate::{ImageError, ImageRecord};

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Registries (`host:port`) spoken to over HTTP besides loopback ones.
    pub insecure_registries: Vec<String>,
    /// Network timeout per request.
    pub timeout: Option<Duration>,
}

fn is_loopback(registry: &str) -> bool {
    let host = registry
        .rsplit_once(':')
        .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
        .map(|(h, _)| h)
        .unwrap_or(registry);
    host == "localhost" || host.starts_with("127.") || host == "[::1]"
}

fn auth_for(registry: &str) -> RegistryAuth {
    let keys: Vec<&str> = if registry == "docker.io" {
        vec![
            "https://index.docker.io/v1/",
            "index.docker.io",
            "docker.io",
        ]
    } else {
        vec![registry]
    };
    for k in keys {
        match docker_credential::get_credential(k) {
            Ok(docker_credential::DockerCredential::UsernamePassword(u, p)) => {
                return RegistryAuth::Basic(u, p)
            }
            Ok(docker_credential::DockerCredential::IdentityToken(t)) => {
                return RegistryAuth::Bearer(t)
            }
            Err(_) => {}
        }
    }
    RegistryAuth::Anonymous
}

impl ImageStore {
    /// Pulls `name` and stores it under its full name. On failure, what it had stored is
    /// removed (see [`ImageStore::discard_unreferenced`]).
    pub fn pull(&self, name: &str, opts: &PullOptions) -> Result<ImageRecord, ImageError> {
        let result = self.pull_locked(name, opts);
        if result.is_err() {
            self.discard_unreferenced();
        }
        result
    }

    fn pull_locked(&self, name: &str, opts: &PullOptions) -> Result<ImageRecord, ImageError> {
        let parsed = reference::parse(name)?;
        let full = parsed.whole();
        let perr = |message: String| ImageError::Pull {
            reference: full.clone(),
            message,
        };
        let registry = parsed.registry().to_owned();
        let mut insecure = opts.insecure_registries.clone();
        if is_loopback(&registry) {
            insecure.push(registry.clone());
        }
        let client = Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(insecure),
            read_timeout: opts.timeout.or(Some(Duration::from_secs(60))),
            connect_timeout: Some(Duration::from_secs(15)),
            ..ClientConfig::default()
        });
        let auth = auth_for(&registry);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| perr(format!("starting the I/O runtime: {e}")))?;
        let _w = self.writer_lock()?;
        let manifest_digest = runtime.block_on(async {
            let accepted = [OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST];
            let (mut raw, mut digest) = client
                .pull_manifest_raw(&parsed, &auth, &accepted)
                .await
                .map_err(|e| perr(e.to_string()))?;
            let media = |raw: &[u8]| {
                serde_json::from_slice::<serde_json::Value>(raw)
                    .ok()
                    .and_then(|v| {
                        v.get("mediaType")
                            .and_then(|m| m.as_str())
                            .map(str::to_owned)
                    })
                    .unwrap_or_default()
            };
            let media_type = media(&raw);
            if media_type == OCI_INDEX
                || media_type == DOCKER_LIST
                || (media_type.is_empty() && is_index(&raw))
            {
                let index = ImageIndex::from_reader(&raw[..])
                    .map_err(|e| perr(format!("bad index: {e}")))?;
                let (child, _) = pick_platform(&index)
                    .ok_or_else(|| perr("no linux/amd64 image in its index".into()))?;
                let child_ref = parsed.clone_with_digest(child.clone());
                (raw, digest) = client
                    .pull_manifest_raw(&child_ref, &auth, &accepted)
                    .await
                    .map_err(|e| perr(e.to_string()))?;
                if digest != child {
                    return Err(perr(format!(
                        "registry sent manifest {digest}, asked for {child}"
                    )));
                }
            }
            if of_bytes(&raw) != digest {
                return Err(ImageError::DigestMismatch {
                    what: format!("manifest of {full}"),
                    expected: digest,
                    actual: of_bytes(&raw),
                });
            }
            let manifest = ImageManifest::from_reader(&raw[..])
                .map_err(|e| perr(format!("bad manifest: {e}")))?;
            let mut wanted = vec![(
                manifest.config().digest().to_string(),
                manifest.config().size(),
            )];
            wanted.extend(
                manifest
                    .layers()
                    .iter()
                    .map(|l| (l.digest().to_string(), l.size())),
            );
            // Compressed blobs are never larger than what they unpack to: a manifest
            // declaring more than max_bytes is refused before anything is downloaded.
            let declared = wanted.iter().fold(0u64, |t, (_, n)| t.saturating_add(*n));
            let max = self.limits().max_bytes;
            if max != 0 && declared > max {
                let detail = format!(
                    "its manifest declares {} of blobs, over max_bytes ({})",
                    human_size(declared),
                    human_size(max)
                );
                return Err(Exceeded {
                    limit: Limit::Bytes,
                    detail,
                }
                .into_error(full.clone()));
            }
            // The config first (not reported: Docker shows layers only), then the layers.
            for (i, (blob, size)) in wanted.into_iter().enumerate() {
                let is_layer = i > 0;
                if self.blobs.has(&blob) {
                    if is_layer {
                        self.progress.exists(&blob);
                    }
                    continue;
                }
                let observer: &dyn Progress = if is_layer {
                    &*self.progress.0
                } else {
                    &NoProgress
                };
                observer.start(&blob, Phase::Download, Some(size));
                let tick = Tick::new(observer, &blob);
                self.fetch_blob(&client, &parsed, &blob, size, &tick)
                    .await
                    .map_err(|e| match e {
                        ImageError::Io { .. } | ImageError::DigestMismatch { .. } => e,
                        other => perr(other.to_string()),
                    })?;
                observer.finish(&blob, Phase::Download);
            }
            self.blobs.put_reader(Some(&digest), "manifest", &raw[..])?;
            Ok::<String, ImageError>(digest)
        })?;
        self.commit(&manifest_digest, &[full], &self.budget())
    }

    /// Downloads a blob into `tmp/`, refusing more bytes than the manifest declares for it
    /// (a registry cannot fill the disk with an endless blob), then stores it by digest.
    async fn fetch_blob(
        &self,
        client: &Client,
        image: &Reference,
        digest: &str,
        size: u64,
        tick: &Tick<'_>,
    ) -> Result<(), ImageError> {
        let tmp: PathBuf = temp_path(&self.tmp_dir(), "pull");
        let result = async {
            let file = tokio::fs::File::create(&tmp)
                .await
                .map_err(ImageError::io("create", &tmp))?;
            let mut file = SizedWriter {
                inner: tokio::io::BufWriter::new(file),
                written: 0,
                size,
                tick,
            };
            client
                .pull_blob(image, digest, &mut file)
                .await
                .map_err(|e| ImageError::Pull {
                    reference: image.whole(),
                    message: if file.written > size {
                        format!(
                            "blob {digest}: the registry sent more than the {size} bytes the manifest declares"
                        )
                    } else {
                        format!("blob {digest}: {e}")
                    },
                })?;
            tokio::io::AsyncWriteExt::flush(&mut file)
                .await
                .map_err(ImageError::io("write", &tmp))?;
            let f = std::fs::File::open(&tmp).map_err(ImageError::io("open", &tmp))?;
            self.blobs.put_reader(Some(digest), "blob", f)?;
            Ok(())
        }
        .await;
        // Best effort: a leftover in tmp/ is swept by the next garbage collection.
        let _ = std::fs::remove_file(&tmp);
        result
    }
}

/// A file being downloaded, refusing to grow past the size its descriptor declares, and
/// reporting the bytes written to `tick`.
struct SizedWriter<'a> {
    inner: tokio::io::BufWriter<tokio::fs::File>,
    written: u64,
    size: u64,
    tick: &'a Tick<'a>,
}

impl tokio::io::AsyncWrite for SizedWriter<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.written + buf.len() as u64 > self.size {
            self.written += buf.len() as u64;
            return std::task::Poll::Ready(Err(std::io::Error::other(
                "more bytes than the manifest declares",
            )));
        }
        let poll = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = poll {
            self.written += n as u64;
            self.tick.advance(n as u64);
        }
        poll
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn is_index(raw: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(raw)
        .ok()
        .is_some_and(|v| v.get("manifests").is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::OCI_MANIFEST;

    /// A registry on loopback that serves one image whose layer is longer than its
    /// manifest says (each request answered on its own connection).
    fn lying_registry(
        layer: Vec<u8>,
        declared: u64,
    ) -> (
        String,
        std::sync::Arc<std::sync::atomic::AtomicBool>,
        std::thread::JoinHandle<()>,
    ) {
        use std::io::{Read, Write};
        let config = br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:0000000000000000000000000000000000000000000000000000000000000000"]}}"#.to_vec();
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": of_bytes(&config), "size": config.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": of_bytes(&layer), "size": declared}],
        }))
        .unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let t = std::thread::spawn(move || {
            l.set_nonblocking(true).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while std::time::Instant::now() < deadline
                && !stop2.load(std::sync::atomic::Ordering::SeqCst)
            {
                let Ok((mut c, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                c.set_nonblocking(false).unwrap();
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && c.read(&mut b).unwrap_or(0) == 1 {
                    head.push(b[0]);
                }
                let line = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_owned();
                let path = line.split(' ').nth(1).unwrap_or("");
                let (ctype, body): (&str, &[u8]) = if path.contains("/manifests/") {
                    (OCI_MANIFEST, &manifest)
                } else if path.ends_with(&of_bytes(&config)) {
                    ("application/octet-stream", &config)
                } else if path.ends_with(&of_bytes(&layer)) {
                    ("application/octet-stream", &layer)
                } else {
                    ("application/json", b"{}")
                };
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = c.write_all(body);
                if path.ends_with(&of_bytes(&layer)) {
                    return;
                }
            }
        });
        (addr, stop, t)
    }

    #[test]
    fn a_blob_longer_than_its_manifest_says_is_refused_and_not_kept() {
        let root = std::env::temp_dir().join(format!("agentrun-pull-lie-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let store = ImageStore::open(&root).unwrap();
        let (registry, _, server) = lying_registry(vec![7u8; 1 << 20], 10);
        let err = store
            .pull(&format!("{registry}/lie/img:1"), &PullOptions::default())
            .unwrap_err()
            .to_string();
        server.join().unwrap();
        assert!(
            err.contains("the registry sent more than the 10 bytes the manifest declares"),
            "{err}"
        );
        for d in ["blobs/sha256", "layers", "records", "tmp"] {
            assert_eq!(std::fs::read_dir(root.join(d)).unwrap().count(), 0, "{d}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_manifest_declaring_more_than_max_bytes_is_refused_before_any_download() {
        let root = std::env::temp_dir().join(format!("agentrun-pull-big-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let store = ImageStore::open(&root)
            .unwrap()
            .with_limits(crate::UnpackLimits {
                max_bytes: 1 << 20,
                ..Default::default()
            });
        let (registry, stop, server) = lying_registry(vec![7u8; 10], 5 << 20);
        let err = store
            .pull(&format!("{registry}/big/img:1"), &PullOptions::default())
            .unwrap_err()
            .to_string();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        server.join().unwrap();
        assert!(
            err.contains("its manifest declares 5.0 MiB of blobs, over max_bytes (1.0 MiB)")
                && err.contains("--max-bytes"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_dir(root.join("blobs/sha256"))
                .unwrap()
                .count(),
            0
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn loopback_registries_are_insecure() {
        assert!(is_loopback("localhost:5000"));
        assert!(is_loopback("127.0.0.1:39211"));
        assert!(is_loopback("localhost"));
        assert!(!is_loopback("docker.io"));
        assert!(!is_loopback("registry.example.com:5000"));
    }
}
