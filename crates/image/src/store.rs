//! The local image store.
//!
//! ```text
//! <root>/blobs/sha256/<hex>     manifests, configs and layer tarballs, by content digest
//! <root>/layers/<hex>/fs        unpacked layers, by diff id (shared by every image having them)
//! <root>/records/<hex>.json     one record per image, by image id (= config digest)
//! <root>/refs.json              names -> image ids ("docker.io/library/busybox:latest")
//! <root>/images/host/           the built-in host image
//! <root>/tmp/                   in-progress writes (blobs, layers), renamed into place
//! ```
//! Locking: writers of content (import, pull, add) hold `gc.lock` shared for their whole run
//! and take `refs.lock` exclusively for the moment they change records or names; `rm` and
//! `prune` hold `gc.lock` exclusively, so they never delete what a writer is about to
//! reference. A sandbox holds a shared lock on each of its layer directories
//! ([`crate::LayerLease`]): prune skips those.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg};
use oci_spec::image::{ImageConfiguration, ImageManifest};
use serde::{Deserialize, Serialize};

use crate::blobs::{temp_path, BlobStore};
use crate::config::ImageConfig;
use crate::digest::hex_of;
use crate::layer::LayerStore;
use crate::limits::{Budget, CappedWriter, UnpackLimits};
use crate::progress::{Observer, Phase, Progress};
use crate::reference;
use crate::{host, Image, ImageError};

/// The name of the built-in image.
pub const HOST_IMAGE: &str = "host";

/// Label of an image made over the built-in `host` image: its value is `host`, and the image's
/// own layers go over the host image when it is resolved.
pub const BASE_LABEL: &str = "org.agentrun.base";

pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub(crate) const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub(crate) const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// One layer of an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRecord {
    /// Digest of the blob as stored (compressed or not).
    pub digest: String,
    pub media_type: String,
    pub size: u64,
    /// Digest of the uncompressed tar: names the unpacked layer.
    pub diff_id: String,
}

/// Everything the store knows about one image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// `sha256:` of the config blob, as Docker's image ID.
    pub id: String,
    pub manifest_digest: String,
    pub manifest_media_type: String,
    pub manifest_size: u64,
    pub config_size: u64,
    /// Bottom layer first, as in the manifest.
    pub layers: Vec<LayerRecord>,
    pub config: ImageConfig,
    pub architecture: String,
    pub os: String,
    /// The image's own creation time (RFC 3339), if it says.
    #[serde(default)]
    pub created: Option<String>,
    /// When this store got it, seconds since the epoch.
    pub added: u64,
    /// Bytes of the unpacked layers' files.
    pub size: u64,
}

/// A row of `agentrun image ls`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    /// Full names pointing at this image (none: a dangling image).
    pub names: Vec<String>,
    /// Empty for the built-in image.
    pub id: String,
    /// `builtin` or `oci`.
    pub kind: String,
    pub layers: usize,
    pub size: u64,
    pub added: u64,
}

/// What `prune` freed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneReport {
    pub images: Vec<String>,
    pub layers: usize,
    pub blobs: usize,
    pub bytes: u64,
    /// Layers kept because a sandbox is using them.
    pub layers_in_use: usize,
}

/// The store rooted at `AGENTRUN_ROOT` (default `/var/lib/agentrun`).
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
    pub(crate) blobs: BlobStore,
    pub(crate) layers: LayerStore,
    limits: UnpackLimits,
    pub(crate) progress: Observer,
}

type Refs = BTreeMap<String, String>;

/// See [`ImageStore::write_guard`].
pub struct WriteGuard {
    _lock: Flock<File>,
}

impl ImageStore {
    /// Opens (and creates if needed) the store under `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ImageError> {
        let root = root.into();
        for d in ["images", "records"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(ImageError::io("create", &p))?;
        }
        Ok(ImageStore {
            blobs: BlobStore::open(&root)?,
            layers: LayerStore::open(&root)?,
            root,
            limits: UnpackLimits::default(),
            progress: Observer::default(),
        })
    }

    /// Removes what earlier builds of the host image moved aside and no mount uses any more
    /// (a host update rebuilds it while shells and sandboxes still use the old tree).
    pub fn collect_host_image(&self) {
        host::remove_unused_old_trees(&self.root.join("images").join(HOST_IMAGE));
    }

    /// The store with every unpack it does held to `limits` (default:
    /// [`UnpackLimits::default`]).
    pub fn with_limits(mut self, limits: UnpackLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The store reporting the progress of pulls, imports, exports and layer unpacking to
    /// `progress` (default: [`crate::NoProgress`]).
    pub fn with_progress(mut self, progress: std::sync::Arc<dyn Progress>) -> Self {
        self.progress = Observer(progress);
        self
    }

    pub fn limits(&self) -> UnpackLimits {
        self.limits
    }

    /// A fresh budget for one operation.
    pub(crate) fn budget(&self) -> Budget {
        Budget::new(self.limits)
    }

    /// After a failed write: what it stored that no image refers to (blobs, unpacked
    /// layers) is removed, unless another writer is at work (then `prune` or the next `rm`
    /// removes it). Call with the writer lock released.
    pub(crate) fn discard_unreferenced(&self) {
        let Ok(_gc) = self.lock("gc.lock", FlockArg::LockExclusiveNonblock) else {
            return;
        };
        // Garbage collection is best effort here: `image prune` reports its errors.
        let _ = self.collect_garbage(&mut PruneReport::default());
    }

    pub(crate) fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn lock(&self, name: &str, arg: FlockArg) -> Result<Flock<File>, ImageError> {
        let p = self.root.join(name);
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(ImageError::io("open", &p))?;
        Flock::lock(f, arg).map_err(|(_, e)| ImageError::io("lock", &p)(e.into()))
    }

    /// Held (shared) while content is written; prune and rm take it exclusively.
    pub(crate) fn writer_lock(&self) -> Result<Flock<File>, ImageError> {
        self.lock("gc.lock", FlockArg::LockShared)
    }

    fn gc_lock(&self) -> Result<Flock<File>, ImageError> {
        self.lock("gc.lock", FlockArg::LockExclusive)
    }

    /// `gc.lock` exclusively, unless a writer holds it.
    pub(crate) fn try_gc_lock(&self) -> Result<Flock<File>, ImageError> {
        self.lock("gc.lock", FlockArg::LockExclusiveNonblock)
    }

    pub(crate) fn refs_lock(&self) -> Result<Flock<File>, ImageError> {
        self.lock("refs.lock", FlockArg::LockExclusive)
    }

    pub(crate) fn refs(&self) -> Result<Refs, ImageError> {
        let p = self.root.join("refs.json");
        match fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| ImageError::source(&p, format!("corrupt name table: {e}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Refs::new()),
            Err(e) => Err(ImageError::io("read", &p)(e)),
        }
    }

    /// Writes the name table atomically (call with `refs.lock` held).
    pub(crate) fn write_refs(&self, refs: &Refs) -> Result<(), ImageError> {
        let p = self.root.join("refs.json");
        write_atomic(
            &self.tmp_dir(),
            &p,
            &serde_json::to_vec_pretty(refs).expect("json"),
        )
    }

    pub(crate) fn record_file(&self, id: &str) -> Result<PathBuf, ImageError> {
        self.record_path(id)
    }

    fn record_path(&self, id: &str) -> Result<PathBuf, ImageError> {
        Ok(self
            .root
            .join("records")
            .join(format!("{}.json", hex_of(id)?)))
    }

    /// The record of an image id.
    pub fn record(&self, id: &str) -> Result<ImageRecord, ImageError> {
        let p = self.record_path(id)?;
        let b = fs::read(&p).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                ImageError::NotFound(id.to_owned())
            } else {
                ImageError::io("read", &p)(e)
            }
        })?;
        serde_json::from_slice(&b).map_err(|e| ImageError::source(&p, format!("corrupt: {e}")))
    }

    fn records(&self) -> Result<Vec<ImageRecord>, ImageError> {
        let dir = self.root.join("records");
        let mut out = Vec::new();
        for e in fs::read_dir(&dir).map_err(ImageError::io("read", &dir))? {
            let e = e.map_err(ImageError::io("read", &dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(hex) = name.strip_suffix(".json") {
                if let Ok(r) = self.record(&format!("sha256:{hex}")) {
                    out.push(r);
                }
            }
        }
        Ok(out)
    }

    /// Finds the image a name, digest reference or (short) id means.
    pub fn find(&self, name: &str) -> Result<ImageRecord, ImageError> {
        let refs = self.refs()?;
        if let Some(id) = reference::normalize_plain(name).and_then(|full| refs.get(&full)) {
            return self.record(id);
        }
        if let Ok(r) = reference::parse(name) {
            let full = r.whole();
            if let Some(id) = refs.get(&full) {
                return self.record(id);
            }
            if let Some(digest) = r.digest() {
                // repo@sha256:...: any image of that repository with that manifest digest.
                let repo = format!("{}/{}", r.registry(), r.repository());
                let owned = |id: &String| {
                    refs.iter().any(|(n, i)| {
                        i == id
                            && reference::parse(n).is_ok_and(|p| {
                                format!("{}/{}", p.registry(), p.repository()) == repo
                            })
                    })
                };
                for rec in self.records()? {
                    if rec.manifest_digest == digest
                        && (owned(&rec.id) || name.starts_with("sha256"))
                    {
                        return Ok(rec);
                    }
                }
            }
        }
        if let Some(prefix) = reference::id_prefix(name) {
            let hits: Vec<ImageRecord> = self
                .records()?
                .into_iter()
                .filter(|r| r.id["sha256:".len()..].starts_with(prefix))
                .collect();
            match hits.len() {
                0 => {}
                1 => return Ok(hits.into_iter().next().expect("one")),
                _ => return Err(ImageError::Ambiguous(name.to_owned())),
            }
        }
        Err(ImageError::NotFound(name.to_owned()))
    }

    /// Resolves a name to an image a sandbox can run.
    pub fn resolve(&self, name: &str) -> Result<Image, ImageError> {
        if name == HOST_IMAGE {
            return host::ensure(&self.root.join("images").join(HOST_IMAGE));
        }
        let rec = self.find(name)?;
        let mut layers = rec
            .layers
            .iter()
            .rev()
            .map(|l| self.layers.fs_path(&l.diff_id))
            .collect::<Result<Vec<_>, _>>()?;
        let mut host_binds = Vec::new();
        // Made over the built-in image (a snapshot or commit of a `host` sandbox): its layers
        // go over the host image's.
        if rec.config.labels.get(BASE_LABEL).map(String::as_str) == Some(HOST_IMAGE) {
            let host = host::ensure(&self.root.join("images").join(HOST_IMAGE))?;
            layers.extend(host.layers);
            host_binds = host.host_binds;
        }
        Ok(Image {
            name: name.to_owned(),
            id: rec.id,
            layers,
            host_binds,
            config: rec.config,
        })
    }

    /// Full names of an image.
    pub fn names_of(&self, id: &str) -> Result<Vec<String>, ImageError> {
        Ok(self
            .refs()?
            .into_iter()
            .filter(|(_, i)| i == id)
            .map(|(n, _)| n)
            .collect())
    }

    /// Makes an image record from a stored manifest: unpacks its layers (once per store),
    /// charging `budget`, and names it. Call with the writer lock held.
    pub(crate) fn commit(
        &self,
        manifest_digest: &str,
        names: &[String],
        budget: &Budget,
    ) -> Result<ImageRecord, ImageError> {
        let bytes = self.blobs.read(manifest_digest)?;
        let manifest = ImageManifest::from_reader(&bytes[..]).map_err(|e| {
            ImageError::source(
                self.blobs.path(manifest_digest).unwrap_or_default(),
                format!("not an image manifest: {e}"),
            )
        })?;
        let media_type = manifest
            .media_type()
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_else(|| OCI_MANIFEST.into());
        let config_digest = manifest.config().digest().to_string();
        let config_bytes = self.blobs.read(&config_digest)?;
        let config = ImageConfiguration::from_reader(&config_bytes[..]).map_err(|e| {
            ImageError::source(
                self.blobs.path(&config_digest).unwrap_or_default(),
                format!("not an image config: {e}"),
            )
        })?;
        let diff_ids = config.rootfs().diff_ids();
        if diff_ids.len() != manifest.layers().len() {
            return Err(ImageError::source(
                self.blobs.path(&config_digest).unwrap_or_default(),
                format!(
                    "config lists {} layers, manifest {}",
                    diff_ids.len(),
                    manifest.layers().len()
                ),
            ));
        }
        let mut layers = Vec::new();
        let mut size = 0;
        for (desc, diff_id) in manifest.layers().iter().zip(diff_ids) {
            let digest = desc.digest().to_string();
            self.ensure_layer(&digest, desc.size(), diff_id, budget)?;
            size += self.layers.size(diff_id);
            layers.push(LayerRecord {
                digest,
                media_type: desc.media_type().to_string(),
                size: desc.size(),
                diff_id: diff_id.clone(),
            });
        }
        let rec = ImageRecord {
            id: config_digest,
            manifest_digest: manifest_digest.to_owned(),
            manifest_media_type: media_type,
            manifest_size: bytes.len() as u64,
            config_size: config_bytes.len() as u64,
            layers,
            config: ImageConfig::from_oci(&config),
            architecture: config.architecture().to_string(),
            os: config.os().to_string(),
            created: config.created().clone(),
            added: now(),
            size,
        };
        let _refs_lock = self.refs_lock()?;
        let path = self.record_path(&rec.id)?;
        let rec = match self.record(&rec.id) {
            // Same image again: keep when it first came.
            Ok(old) => ImageRecord {
                added: old.added,
                ..rec
            },
            Err(_) => rec,
        };
        write_atomic(
            &self.tmp_dir(),
            &path,
            &serde_json::to_vec_pretty(&rec).expect("json"),
        )?;
        let mut refs = self.refs()?;
        for n in names {
            refs.insert(reference::normalize(n)?, rec.id.clone());
        }
        self.write_refs(&refs)?;
        Ok(rec)
    }

    /// Unpacks the layer blob `digest` (`size` bytes) unless it is unpacked already,
    /// reporting it as [`Phase::Extract`], then as ready.
    pub(crate) fn ensure_layer(
        &self,
        digest: &str,
        size: u64,
        diff_id: &str,
        budget: &Budget,
    ) -> Result<(), ImageError> {
        if !self.layers.fs_path(diff_id)?.is_dir() {
            self.progress
                .phase(digest, Phase::Extract, Some(size), |tick| {
                    self.layers
                        .ensure(&self.blobs, digest, diff_id, budget, tick)
                })?;
        }
        self.progress.0.ready(digest);
        Ok(())
    }

    /// Stores `config` and an OCI manifest over `layers` (stored blobs: digest, size, media
    /// type); returns the manifest's digest.
    pub(crate) fn put_manifest(
        &self,
        config: &[u8],
        layers: &[(String, u64, &str)],
    ) -> Result<String, ImageError> {
        let (config_digest, config_size) = self.blobs.put_bytes(config, "image config")?;
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size},
            "layers": layers.iter().map(|(d, s, t)| serde_json::json!({
                "mediaType": t, "digest": d, "size": s,
            })).collect::<Vec<_>>(),
        });
        let (manifest_digest, _) = self
            .blobs
            .put_bytes(&serde_json::to_vec(&manifest).expect("json"), "manifest")?;
        Ok(manifest_digest)
    }

    /// Holds off `rm`/`prune` while a multi-step writer (a build) adds layers that no record
    /// names yet. Drop it when done.
    pub fn write_guard(&self) -> Result<WriteGuard, ImageError> {
        Ok(WriteGuard {
            _lock: self.writer_lock()?,
        })
    }

    /// Stores an uncompressed layer tar produced by `write` and unpacks it (call with a
    /// [`WriteGuard`] held). Both are held to the store's limits.
    pub fn put_layer(
        &self,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<LayerRecord, ImageError> {
        let (digest, size) = self.put_layer_blob(write)?;
        self.ensure_layer(&digest, size, &digest, &self.budget())?;
        Ok(LayerRecord {
            digest: digest.clone(),
            media_type: OCI_LAYER_TAR.into(),
            size,
            diff_id: digest,
        })
    }

    /// Stores the layer tar `write` produces as a blob, refusing one over `max_bytes`.
    pub(crate) fn put_layer_blob(
        &self,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<(String, u64), ImageError> {
        let max = self.limits.max_bytes;
        let over = std::cell::Cell::new(false);
        let result = self.blobs.put_with(None, "layer", |w| {
            write(&mut CappedWriter::new(w, max, &over))
        });
        if over.get() {
            return Err(CappedWriter::exceeded(max).into_error("layer"));
        }
        result
    }

    /// A runnable image from layers (bottom first) and a run configuration that no record
    /// holds yet: a build's intermediate state.
    pub fn image_from_layers(
        &self,
        name: &str,
        layers: &[LayerRecord],
        config: &ImageConfig,
    ) -> Result<Image, ImageError> {
        Ok(Image {
            name: name.to_owned(),
            id: String::new(),
            layers: layers
                .iter()
                .rev()
                .map(|l| self.layers.fs_path(&l.diff_id))
                .collect::<Result<_, _>>()?,
            host_binds: Vec::new(),
            config: config.clone(),
        })
    }

    /// The image's OCI config document, as stored.
    pub fn config_document(&self, rec: &ImageRecord) -> Result<serde_json::Value, ImageError> {
        let bytes = self.blobs.read(&rec.id)?;
        serde_json::from_slice(&bytes).map_err(|e| {
            ImageError::source(self.blobs.path(&rec.id).unwrap_or_default(), e.to_string())
        })
    }

    /// Stores a new image from its OCI config document and stored layers, naming it `names`.
    pub fn commit_image(
        &self,
        config: &serde_json::Value,
        layers: &[LayerRecord],
        names: &[String],
    ) -> Result<ImageRecord, ImageError> {
        let refs: Vec<(String, u64, &str)> = layers
            .iter()
            .map(|l| (l.digest.clone(), l.size, l.media_type.as_str()))
            .collect();
        let manifest = self.put_manifest(&serde_json::to_vec(config).expect("json"), &refs)?;
        self.commit(&manifest, names, &self.budget())
    }

    /// Makes a one-layer image from a root filesystem directory (like `docker import`), with
    /// `config` as its run configuration.
    pub fn add_dir(
        &self,
        name: &str,
        src: &Path,
        config: &ImageConfig,
    ) -> Result<ImageRecord, ImageError> {
        if name == HOST_IMAGE {
            return Err(ImageError::BuiltIn(name.to_owned()));
        }
        reference::normalize(name)?;
        let meta = fs::metadata(src).map_err(ImageError::io("cannot read", src))?;
        if !meta.is_dir() {
            return Err(ImageError::source(src, "not a directory"));
        }
        let result = self.add_dir_locked(name, src, config);
        if result.is_err() {
            self.discard_unreferenced();
        }
        result
    }

    fn add_dir_locked(
        &self,
        name: &str,
        src: &Path,
        config: &ImageConfig,
    ) -> Result<ImageRecord, ImageError> {
        let _w = self.writer_lock()?;
        let (digest, size) = self.put_layer_blob(|w| crate::layer::tar_dir(src, w))?;
        let oci_config = serde_json::json!({
            "created": rfc3339_now(),
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": config.entrypoint,
                "Cmd": config.cmd,
                "Env": config.env,
                "WorkingDir": config.working_dir,
                "User": config.user,
                "Labels": config.labels,
            },
            "rootfs": {"type": "layers", "diff_ids": [digest]},
            "history": [{"created_by": format!("agentrun image add {}", src.display())}],
        });
        let manifest = self.put_manifest(
            &serde_json::to_vec(&oci_config).expect("json"),
            &[(digest, size, OCI_LAYER_TAR)],
        )?;
        self.commit(&manifest, &[name.to_owned()], &self.budget())
    }

    /// Lists the images, the built-in one first, then by name.
    pub fn list(&self) -> Result<Vec<ImageInfo>, ImageError> {
        let mut out = vec![ImageInfo {
            names: vec![HOST_IMAGE.into()],
            id: String::new(),
            kind: "builtin".into(),
            layers: 1,
            size: 0,
            added: 0,
        }];
        let refs = self.refs()?;
        let mut found: Vec<ImageInfo> = self
            .records()?
            .into_iter()
            .map(|r| ImageInfo {
                names: refs
                    .iter()
                    .filter(|(_, i)| **i == r.id)
                    .map(|(n, _)| n.clone())
                    .collect(),
                id: r.id,
                kind: "oci".into(),
                layers: r.layers.len(),
                size: r.size,
                added: r.added,
            })
            .collect();
        found.sort_by(|a, b| a.names.first().cmp(&b.names.first()).then(a.id.cmp(&b.id)));
        out.extend(found);
        Ok(out)
    }

    /// Gives the image `src` names another name.
    pub fn tag(&self, src: &str, name: &str) -> Result<String, ImageError> {
        if name == HOST_IMAGE {
            return Err(ImageError::BuiltIn(name.to_owned()));
        }
        let full = reference::normalize(name)?;
        if reference::parse(name)?.digest().is_some() {
            return Err(ImageError::InvalidName(
                name.to_owned(),
                "a tag cannot contain a digest".into(),
            ));
        }
        let rec = self.find(src)?;
        let _l = self.refs_lock()?;
        let mut refs = self.refs()?;
        refs.insert(full.clone(), rec.id);
        self.write_refs(&refs)?;
        Ok(full)
    }

    /// `image rm`: a name is untagged (the image goes when its last name does); an id removes
    /// the image, which must have at most one name unless `force`. Content no image needs any
    /// more is deleted, except layers a sandbox is using. Returns what was untagged/deleted.
    pub fn remove(&self, name: &str, force: bool) -> Result<Vec<String>, ImageError> {
        if name == HOST_IMAGE {
            return Err(ImageError::BuiltIn(name.to_owned()));
        }
        let _gc = self.gc_lock()?;
        let rec = self.find(name)?;
        let mut done = Vec::new();
        {
            let _l = self.refs_lock()?;
            let mut refs = self.refs()?;
            let by_name = reference::normalize(name)
                .ok()
                .filter(|full| refs.get(full) == Some(&rec.id));
            let names: Vec<String> = refs
                .iter()
                .filter(|(_, i)| **i == rec.id)
                .map(|(n, _)| n.clone())
                .collect();
            match by_name {
                Some(full) if names.len() > 1 => {
                    refs.remove(&full);
                    done.push(format!("Untagged: {}", reference::familiar(&full)));
                }
                _ => {
                    if names.len() > 1 && !force {
                        return Err(ImageError::InUse {
                            name: name.to_owned(),
                            count: names.len(),
                        });
                    }
                    for n in &names {
                        refs.remove(n);
                        done.push(format!("Untagged: {}", reference::familiar(n)));
                    }
                    let p = self.record_path(&rec.id)?;
                    // The reference is gone (the image is untagged); a record left is swept by prune.
                    let _ = fs::remove_file(&p);
                    done.push(format!("Deleted: {}", rec.id));
                }
            }
            self.write_refs(&refs)?;
        }
        self.collect_garbage(&mut PruneReport::default())?;
        Ok(done)
    }

    /// `image prune`: removes dangling images (no name), then content no image needs.
    pub fn prune(&self) -> Result<PruneReport, ImageError> {
        let _gc = self.gc_lock()?;
        let mut report = PruneReport::default();
        {
            let _l = self.refs_lock()?;
            let named: BTreeSet<String> = self.refs()?.into_values().collect();
            for r in self.records()? {
                if !named.contains(&r.id) {
                    // Listed again (and tried again) by the next prune.
                    let _ = fs::remove_file(self.record_path(&r.id)?);
                    report.images.push(r.id);
                }
            }
        }
        self.collect_garbage(&mut report)?;
        Ok(report)
    }

    /// Deletes blobs and layers no record refers to, and leftovers of interrupted writes.
    /// Call with `gc.lock` held exclusively.
    pub(crate) fn collect_garbage(&self, report: &mut PruneReport) -> Result<(), ImageError> {
        let mut blobs = BTreeSet::new();
        let mut layers = BTreeSet::new();
        for r in self.records()? {
            blobs.insert(r.manifest_digest.clone());
            blobs.insert(r.id.clone());
            for l in &r.layers {
                blobs.insert(l.digest.clone());
                layers.insert(l.diff_id.clone());
            }
        }
        for l in self.layers.list()? {
            if !layers.contains(&l) {
                let size = self.layers.size(&l);
                if self.layers.remove_unless_leased(&l)? {
                    report.layers += 1;
                    report.bytes += size;
                } else {
                    report.layers_in_use += 1;
                }
            }
        }
        for b in self.blobs.list()? {
            if !blobs.contains(&b) {
                report.bytes += self.blobs.remove(&b)?;
                report.blobs += 1;
            }
        }
        // No writer holds the lock: whatever is in tmp/ was left by one that died.
        let tmp = self.tmp_dir();
        if let Ok(rd) = fs::read_dir(&tmp) {
            for e in rd.flatten() {
                let p = e.path();
                // Tried again at the next garbage collection.
                let _ = fs::remove_dir_all(&p).or_else(|_| fs::remove_file(&p));
            }
        }
        Ok(())
    }
}

/// Writes a file by rename, so readers see the old or the new content, never a part.
pub(crate) fn write_atomic(tmp_dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let tmp = temp_path(tmp_dir, "write");
    let result = (|| {
        let mut f = File::create(&tmp).map_err(ImageError::io("create", &tmp))?;
        f.write_all(bytes).map_err(ImageError::io("write", &tmp))?;
        f.sync_all().map_err(ImageError::io("fsync", &tmp))?;
        fs::rename(&tmp, path).map_err(ImageError::io("rename", &tmp))
    })();
    if result.is_err() {
        // Best effort: a leftover in tmp/ is swept by the next garbage collection.
        let _ = fs::remove_file(&tmp);
    }
    result
}

pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The current time as RFC 3339 (UTC, seconds).
pub fn rfc3339_now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    #[test]
    fn add_resolve_tag_remove_prune() {
        let root = test_dir("store-root");
        let src = test_dir("store-src");
        fs::create_dir_all(src.join("bin")).unwrap();
        fs::write(src.join("bin/tool"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(src.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
        symlink("tool", src.join("bin/alias")).unwrap();
        let store = ImageStore::open(&root).unwrap();
        let cfg = ImageConfig {
            cmd: Some(vec!["/bin/tool".into()]),
            env: vec!["A=1".into()],
            ..ImageConfig::default()
        };
        let rec = store.add_dir("tiny", &src, &cfg).unwrap();
        assert_eq!(rec.config.cmd, cfg.cmd);
        let img = store.resolve("tiny").unwrap();
        assert_eq!(img.layers.len(), 1);
        let m = fs::metadata(img.layers[0].join("bin/tool")).unwrap();
        assert_eq!(m.mode() & 0o777, 0o755);
        assert_eq!(
            fs::read_link(img.layers[0].join("bin/alias")).unwrap(),
            Path::new("tool")
        );
        // By full name, by short id, by tag.
        assert_eq!(
            store.find("docker.io/library/tiny:latest").unwrap().id,
            rec.id
        );
        assert_eq!(store.find(&rec.id[7..19]).unwrap().id, rec.id);
        store.tag("tiny", "other:1").unwrap();
        assert_eq!(store.find("other:1").unwrap().id, rec.id);
        let names: Vec<_> = store.list().unwrap().into_iter().map(|i| i.names).collect();
        assert_eq!(
            names,
            vec![
                vec!["host".to_string()],
                vec![
                    "docker.io/library/other:1".to_string(),
                    "docker.io/library/tiny:latest".to_string()
                ]
            ]
        );
        // Removing by id with two names needs force; by name only untags.
        assert!(matches!(
            store.remove(&rec.id, false),
            Err(ImageError::InUse { .. })
        ));
        store.remove("other:1", false).unwrap();
        assert!(store.find("tiny").is_ok());
        // A leased layer survives rm until the lease ends; prune then takes it.
        let lease = img.lease().unwrap();
        store.remove("tiny", false).unwrap();
        assert!(matches!(store.find("tiny"), Err(ImageError::NotFound(_))));
        assert!(img.layers[0].exists(), "a leased layer was deleted");
        drop(lease);
        let r = store.prune().unwrap();
        assert_eq!(r.layers, 1);
        assert!(!img.layers[0].exists());
        assert!(store.blobs.list().unwrap().is_empty());
        assert!(matches!(
            store.remove("host", false),
            Err(ImageError::BuiltIn(_))
        ));
        assert!(store.resolve("../etc").is_err());
        fs::remove_dir_all(&root).unwrap();
        fs::remove_dir_all(&src).unwrap();
    }

    #[test]
    fn rfc3339_is_well_formed() {
        let s = rfc3339_now();
        assert_eq!(s.len(), 20, "{s}");
        assert!(s.starts_with("20") && s.ends_with('Z'), "{s}");
    }
}
