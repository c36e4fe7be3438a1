//! Snapshots: a sandbox's writable layer kept as a content-addressed image layer on top of
//! the image it runs, so that the store, `image ls`, `image export` and GC treat it as any
//! image, and a sandbox can be made from it.
//!
//! This module owns the on-disk form of "a snapshot of a sandbox's writable layer"; reading
//! a live sandbox's layer consistently (its cgroup frozen while it is read) is the pool's
//! (`agentrun_pool::live::LiveSandbox::with_writable_layer`), the front ends (OpenSandbox
//! snapshots, Docker `commit`, the CLI, fork) build on both.
//!
//! - [`ImageStore::commit_upper`] writes an overlayfs upper directory (whiteouts and opaque
//!   directories as OCI whiteouts, sandbox ids shifted back to image ids) as one layer over a
//!   base image and records the new image (Docker's `commit`). The base's config is kept, with
//!   the caller's labels and config changes on top. A base of the built-in `host` image (whose
//!   programs are the host's, bound in) is recorded as an image with only the new layers and
//!   the label [`BASE_LABEL`]` = host`: [`ImageStore::resolve`] puts the host image under it.
//! - A *snapshot* is such an image named [`snapshot_ref`]`(id)` (`agentrun.local/snapshot:<id>`)
//!   whose config labels say what it is ([`labels`]): the ref is written last, so an
//!   interrupted snapshot is never listed; [`ImageStore::collect_interrupted`] (at daemon
//!   start) removes what one left (temp files, unnamed snapshot images).
//! - Size: a snapshot over the caller's limit is refused before anything is written
//!   ([`ImageError::SnapshotTooLarge`], with the layer's size); a failed write (a full disk)
//!   leaves nothing of it behind (every write goes to `tmp/` and is renamed into place).
//! - Ownership: each snapshot has an `owner` (for the OpenSandbox API: a fingerprint of the
//!   API key that made it); lookups by another owner see no such snapshot. Unowned ones
//!   (`agentrun snapshot create`, by the local root) are everyone's.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::store::rfc3339_now;
use crate::{reference, ImageConfig, ImageError, ImageRecord, ImageStore, LayerRecord};

/// The repository every snapshot image is named in (`agentrun.local/snapshot:<id>`).
pub const SNAPSHOT_REPO: &str = "agentrun.local/snapshot";

pub use crate::store::BASE_LABEL;

/// The config labels that make an image a snapshot.
pub mod labels {
    /// The snapshot's id (also the tag of its ref).
    pub const ID: &str = "org.agentrun.snapshot.id";
    /// The sandbox it was taken of.
    pub const SANDBOX: &str = "org.agentrun.snapshot.sandbox";
    /// Its optional human-readable name.
    pub const NAME: &str = "org.agentrun.snapshot.name";
    /// Who may see it (empty: anyone).
    pub const OWNER: &str = "org.agentrun.snapshot.owner";
    /// The image the sandbox ran (as it was named).
    pub const BASE_IMAGE: &str = "org.agentrun.snapshot.base-image";
    /// When it was taken (RFC 3339).
    pub const CREATED: &str = "org.agentrun.snapshot.created";
    /// Apparent bytes of the files of its layer (what the size limit is held to).
    pub const SIZE: &str = "org.agentrun.snapshot.size";
    /// The sandbox's entrypoint (JSON array), restored when a create names none.
    pub const ENTRYPOINT: &str = "org.agentrun.snapshot.entrypoint";
}

/// The ref a snapshot's image is named by.
pub fn snapshot_ref(id: &str) -> String {
    format!("{SNAPSHOT_REPO}:{id}")
}

/// Whether `id` has the form of a snapshot id (it must be a valid tag: `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`).
pub fn valid_snapshot_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// An overlayfs upper directory to make a layer of.
#[derive(Debug, Clone)]
pub struct UpperDir<'a> {
    /// The directory (for a live sandbox, a path through `/proc/<pid>/fd/<n>`).
    pub path: &'a Path,
    /// The sandbox's host ids and the image ids they are (root's: its uid range from 0; a
    /// rootless sandbox's: the user is 0, its subordinate ids 1..); anything else is written
    /// as 65534.
    pub ids: crate::layer::IdMap,
}

/// How [`ImageStore::commit_upper`] makes the image.
#[derive(Debug, Clone, Default)]
pub struct CommitOptions {
    /// Names given to the new image (none: an unnamed image, found by its id).
    pub names: Vec<String>,
    /// Labels added to the base's.
    pub labels: BTreeMap<String, String>,
    /// Most bytes the upper directory's files may hold (apparent sizes); `None`: only the
    /// store's own limits.
    pub max_bytes: Option<u64>,
    /// Changes to the run configuration (`docker commit --change`, `container.commit(conf=)`):
    /// the OCI config's `config` keys (`Cmd`, `Entrypoint`, `Env`, `WorkingDir`, `User`,
    /// `Labels`, `ExposedPorts`), replacing the base's.
    pub config: Option<serde_json::Map<String, serde_json::Value>>,
    /// The history entry's `created_by` (`docker history`).
    pub created_by: String,
    /// The history entry's `comment` and the config's `author` (Docker's commit message and
    /// author), if any.
    pub comment: Option<String>,
    pub author: Option<String>,
}

/// What [`ImageStore::commit_upper`] made.
#[derive(Debug, Clone)]
pub struct Committed {
    pub record: ImageRecord,
    /// The new layer.
    pub layer: LayerRecord,
    /// Apparent bytes of the upper directory's files (what the size limit is held to).
    pub upper_bytes: u64,
}

/// A snapshot, as its image's labels tell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub id: String,
    pub sandbox_id: String,
    pub name: Option<String>,
    pub owner: String,
    /// Its image's id and ref ([`snapshot_ref`]).
    pub image_id: String,
    pub image: String,
    /// The image the sandbox ran.
    pub base_image: String,
    /// RFC 3339.
    pub created: String,
    /// Apparent bytes of its layer's files.
    pub size: u64,
    /// The sandbox's entrypoint, if it was recorded.
    pub entrypoint: Option<Vec<String>>,
}

impl Snapshot {
    fn from_record(rec: &ImageRecord) -> Option<Snapshot> {
        let l = &rec.config.labels;
        let id = l.get(labels::ID)?.clone();
        Some(Snapshot {
            image: snapshot_ref(&id),
            id,
            sandbox_id: l.get(labels::SANDBOX).cloned().unwrap_or_default(),
            name: l.get(labels::NAME).cloned(),
            owner: l.get(labels::OWNER).cloned().unwrap_or_default(),
            image_id: rec.id.clone(),
            base_image: l.get(labels::BASE_IMAGE).cloned().unwrap_or_default(),
            created: l.get(labels::CREATED).cloned().unwrap_or_default(),
            size: l
                .get(labels::SIZE)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            entrypoint: l
                .get(labels::ENTRYPOINT)
                .and_then(|e| serde_json::from_str(e).ok()),
        })
    }
}

/// What a new snapshot says about itself ([`ImageStore::create_snapshot`]).
#[derive(Debug, Clone, Default)]
pub struct SnapshotMeta {
    /// Its id: [`valid_snapshot_id`], unique (the caller makes it random).
    pub id: String,
    pub sandbox_id: String,
    pub name: Option<String>,
    pub owner: String,
    pub entrypoint: Option<Vec<String>>,
    /// Most bytes the writable layer's files may hold.
    pub max_bytes: Option<u64>,
}

/// A sandbox's writable layer written as a layer blob, not yet part of an image
/// ([`ImageStore::stage_upper`]); `rm`/`prune` wait while it lives.
pub struct StagedLayer {
    digest: String,
    size: u64,
    /// Layers staged under it, bottom first (a fork copy's frozen layers: see
    /// [`ImageStore::stage_upper_over`]).
    below: Vec<(String, u64)>,
    /// Apparent bytes of the upper directory's files.
    pub upper_bytes: u64,
    _guard: crate::WriteGuard,
}

fn check_snapshot_id(id: &str) -> Result<(), ImageError> {
    if valid_snapshot_id(id) {
        return Ok(());
    }
    Err(ImageError::InvalidName(
        id.to_owned(),
        "a snapshot id is letters, digits, '_', '.' and '-'".into(),
    ))
}

/// Apparent bytes of the files under `dir` (`dir` itself may be a symlink, such as
/// `/proc/self/fd/N`; nothing under it is followed).
pub fn tree_bytes(dir: &Path) -> u64 {
    match fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(Result::ok)
            .map(|e| crate::layer::tree_size(&e.path()))
            .sum(),
        Err(_) => crate::layer::tree_size(dir),
    }
}

impl ImageStore {
    /// Makes an image of `base` (an image name or id, or `host`) with `upper` as one more
    /// layer on top (see the module doc). Nothing is written when the upper directory holds
    /// more than `opts.max_bytes`; nothing of a failed write is left.
    pub fn commit_upper(
        &self,
        base: &str,
        upper: &UpperDir<'_>,
        opts: &CommitOptions,
    ) -> Result<Committed, ImageError> {
        let staged = self.stage_upper(upper, opts.max_bytes)?;
        self.commit_staged(base, staged, opts)
    }

    /// The part of a commit that reads the upper directory (what must happen while the
    /// sandbox is frozen): refused over `max_bytes`; else written as a layer blob. The rest
    /// ([`ImageStore::commit_staged`]: unpacking it, the image's record and name) needs the
    /// sandbox no more. Holds off `rm`/`prune` until it is committed or dropped.
    pub fn stage_upper(
        &self,
        upper: &UpperDir<'_>,
        max_bytes: Option<u64>,
    ) -> Result<StagedLayer, ImageError> {
        self.stage_upper_over(&[], upper, max_bytes)
    }

    /// [`ImageStore::stage_upper`] of a sandbox whose overlay has frozen layers
    /// ([`crate::frozen`]: a fork copy's) between its image and its upper directory:
    /// `lowers` (bottom first, upper form, the same host ids as `upper`) become layers of
    /// their own under the upper's, so that the image holds what the sandbox sees. The size
    /// limit holds for them all together.
    pub fn stage_upper_over(
        &self,
        lowers: &[&Path],
        upper: &UpperDir<'_>,
        max_bytes: Option<u64>,
    ) -> Result<StagedLayer, ImageError> {
        let upper_bytes =
            tree_bytes(upper.path) + lowers.iter().map(|l| tree_bytes(l)).sum::<u64>();
        if let Some(max) = max_bytes {
            if upper_bytes > max {
                return Err(ImageError::SnapshotTooLarge {
                    bytes: upper_bytes,
                    max,
                });
            }
        }
        let guard = self.write_guard()?;
        let blob = (|| {
            let mut below = Vec::with_capacity(lowers.len());
            for l in lowers {
                below.push(
                    self.put_layer_blob(|w| crate::layer::tar_upper_mapped(l, &upper.ids, w))?,
                );
            }
            let top =
                self.put_layer_blob(|w| crate::layer::tar_upper_mapped(upper.path, &upper.ids, w))?;
            Ok::<_, ImageError>((top, below))
        })();
        match blob {
            Ok(((digest, size), below)) => Ok(StagedLayer {
                digest,
                size,
                below,
                upper_bytes,
                _guard: guard,
            }),
            Err(e) => {
                drop(guard);
                self.discard_unreferenced();
                Err(e)
            }
        }
    }

    /// Makes an image of `base` with a staged layer on top (see
    /// [`ImageStore::commit_upper`]); nothing of it is left when it fails.
    pub fn commit_staged(
        &self,
        base: &str,
        staged: StagedLayer,
        opts: &CommitOptions,
    ) -> Result<Committed, ImageError> {
        let result = self.commit_staged_locked(base, &staged, opts);
        drop(staged);
        if result.is_err() {
            self.discard_unreferenced();
        }
        result
    }

    fn commit_staged_locked(
        &self,
        base: &str,
        staged: &StagedLayer,
        opts: &CommitOptions,
    ) -> Result<Committed, ImageError> {
        for n in &opts.names {
            reference::normalize(n)?;
        }
        let on_host = base == crate::HOST_IMAGE;
        let (mut doc, mut layers) = if on_host {
            (host_document(), Vec::new())
        } else {
            let rec = self.find(base)?;
            (self.config_document(&rec)?, rec.layers.clone())
        };
        for (digest, size) in &staged.below {
            self.ensure_layer(digest, *size, digest, &self.budget())?;
            layers.push(LayerRecord {
                digest: digest.clone(),
                media_type: crate::store::OCI_LAYER_TAR.into(),
                size: *size,
                diff_id: digest.clone(),
            });
        }
        self.ensure_layer(&staged.digest, staged.size, &staged.digest, &self.budget())?;
        let layer = LayerRecord {
            digest: staged.digest.clone(),
            media_type: crate::store::OCI_LAYER_TAR.into(),
            size: staged.size,
            diff_id: staged.digest.clone(),
        };
        layers.push(layer.clone());
        let obj = doc
            .as_object_mut()
            .ok_or_else(|| ImageError::source(base, "the image's config is not an object"))?;
        obj.insert("created".into(), rfc3339_now().into());
        if let Some(a) = &opts.author {
            obj.insert("author".into(), a.clone().into());
        }
        let config = obj.entry("config").or_insert_with(|| serde_json::json!({}));
        if !config.is_object() {
            *config = serde_json::json!({});
        }
        let config = config.as_object_mut().expect("an object");
        if let Some(changes) = &opts.config {
            for (k, v) in changes {
                config.insert(k.clone(), v.clone());
            }
        }
        let mut all_labels: BTreeMap<String, String> = config
            .get("Labels")
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default();
        if on_host {
            all_labels.insert(BASE_LABEL.into(), crate::HOST_IMAGE.into());
        }
        all_labels.extend(opts.labels.clone());
        config.insert(
            "Labels".into(),
            serde_json::to_value(&all_labels).expect("json"),
        );
        let rootfs = obj
            .entry("rootfs")
            .or_insert_with(|| serde_json::json!({"type": "layers"}));
        rootfs["diff_ids"] = layers
            .iter()
            .map(|l| l.diff_id.clone())
            .collect::<Vec<_>>()
            .into();
        let history = obj
            .entry("history")
            .or_insert_with(|| serde_json::json!([]));
        if !history.is_array() {
            *history = serde_json::json!([]);
        }
        for _ in &staged.below {
            history
                .as_array_mut()
                .expect("an array")
                .push(serde_json::json!({
                    "created": rfc3339_now(),
                    "created_by": "agentrun fork (the files the sandbox was forked with)",
                }));
        }
        let mut entry = serde_json::json!({
            "created": rfc3339_now(),
            "created_by": opts.created_by,
        });
        if let Some(c) = &opts.comment {
            entry["comment"] = c.clone().into();
        }
        history.as_array_mut().expect("an array").push(entry);
        let record = self.commit_image(&doc, &layers, &opts.names)?;
        Ok(Committed {
            record,
            layer,
            upper_bytes: staged.upper_bytes,
        })
    }

    /// Takes a snapshot: [`ImageStore::commit_upper`] of `upper` over `base`, labelled and
    /// named as a snapshot ([`snapshot_ref`]). The name is written last: a snapshot that did
    /// not finish is never listed.
    pub fn create_snapshot(
        &self,
        base: &str,
        upper: &UpperDir<'_>,
        meta: &SnapshotMeta,
    ) -> Result<Snapshot, ImageError> {
        check_snapshot_id(&meta.id)?;
        let staged = self.stage_upper(upper, meta.max_bytes)?;
        self.create_snapshot_staged(base, staged, meta)
    }

    /// [`ImageStore::create_snapshot`] of a layer staged with [`ImageStore::stage_upper`]
    /// (while the sandbox was frozen; this part needs it no more).
    pub fn create_snapshot_staged(
        &self,
        base: &str,
        staged: StagedLayer,
        meta: &SnapshotMeta,
    ) -> Result<Snapshot, ImageError> {
        check_snapshot_id(&meta.id)?;
        let mut l = BTreeMap::new();
        l.insert(labels::ID.into(), meta.id.clone());
        l.insert(labels::SANDBOX.into(), meta.sandbox_id.clone());
        if let Some(n) = &meta.name {
            l.insert(labels::NAME.into(), n.clone());
        }
        l.insert(labels::OWNER.into(), meta.owner.clone());
        l.insert(labels::BASE_IMAGE.into(), base.to_owned());
        l.insert(labels::CREATED.into(), rfc3339_now());
        if let Some(e) = &meta.entrypoint {
            l.insert(
                labels::ENTRYPOINT.into(),
                serde_json::to_string(e).expect("json"),
            );
        }
        // The name is given in the same commit: the image is named when its record is
        // complete.
        l.insert(labels::SIZE.into(), staged.upper_bytes.to_string());
        let committed = self.commit_staged(
            base,
            staged,
            &CommitOptions {
                names: vec![snapshot_ref(&meta.id)],
                labels: l,
                max_bytes: meta.max_bytes,
                config: None,
                created_by: format!("agentrun snapshot of sandbox {}", meta.sandbox_id),
                comment: meta.name.clone(),
                author: None,
            },
        )?;
        Snapshot::from_record(&committed.record)
            .ok_or_else(|| ImageError::NotFound(snapshot_ref(&meta.id)))
    }

    /// Every snapshot of `owner` (`None`: every owner's), oldest first.
    pub fn snapshots(&self, owner: Option<&str>) -> Result<Vec<Snapshot>, ImageError> {
        let mut out = Vec::new();
        for info in self.list()? {
            let Some(name) = info
                .names
                .iter()
                .find(|n| n.starts_with(&format!("{SNAPSHOT_REPO}:")))
            else {
                continue;
            };
            let Ok(rec) = self.record(&info.id) else {
                continue;
            };
            if let Some(s) = Snapshot::from_record(&rec) {
                if name == &snapshot_ref(&s.id) && visible_to(&s, owner) {
                    out.push(s);
                }
            }
        }
        out.sort_by(|a, b| a.created.cmp(&b.created).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// The snapshot `id` of `owner` (`None`: any owner); [`ImageError::NotFound`] when there
    /// is none, or it is another owner's.
    pub fn snapshot(&self, id: &str, owner: Option<&str>) -> Result<Snapshot, ImageError> {
        let missing = || ImageError::NotFound(format!("snapshot {id}"));
        if !valid_snapshot_id(id) {
            return Err(missing());
        }
        let rec = match self.find(&snapshot_ref(id)) {
            Ok(r) => r,
            Err(ImageError::NotFound(_)) => return Err(missing()),
            Err(e) => return Err(e),
        };
        match Snapshot::from_record(&rec) {
            Some(s) if s.id == id && visible_to(&s, owner) => Ok(s),
            _ => Err(missing()),
        }
    }

    /// Deletes snapshot `id` (of `owner`, as [`ImageStore::snapshot`]): its name goes, and
    /// its image and layer with it unless something else names them. While a sandbox runs
    /// from it, only the name goes (it is no snapshot any more): the sandbox can still be
    /// snapshotted (its image is the new one's base), and the unnamed image is collected at
    /// the daemon's next start or by `image prune`.
    pub fn remove_snapshot(&self, id: &str, owner: Option<&str>) -> Result<Snapshot, ImageError> {
        let s = self.snapshot(id, owner)?;
        let rec = self.record(&s.image_id)?;
        if self.in_use(&rec) {
            let _l = self.refs_lock()?;
            let mut refs = self.refs()?;
            refs.remove(&reference::normalize(&snapshot_ref(id))?);
            self.write_refs(&refs)?;
        } else {
            self.remove(&snapshot_ref(id), false)?;
        }
        Ok(s)
    }

    /// Whether a sandbox runs from `rec` (its top layer is leased).
    fn in_use(&self, rec: &ImageRecord) -> bool {
        rec.layers
            .last()
            .is_some_and(|l| self.layers.is_leased(&l.diff_id))
    }

    /// What an interrupted writer left (a daemon killed mid-snapshot): temp files, unnamed
    /// snapshot images, content no image refers to. Skipped (`Ok(false)`) while another
    /// writer is at work. Call at start.
    pub fn collect_interrupted(&self) -> Result<bool, ImageError> {
        self.discard_dangling_snapshots();
        let Ok(_gc) = self.try_gc_lock() else {
            return Ok(false);
        };
        self.collect_garbage(&mut crate::PruneReport::default())?;
        Ok(true)
    }

    /// Removes the records of snapshot images no name points at (a writer killed between
    /// the record and its name), unless a writer is at work.
    fn discard_dangling_snapshots(&self) {
        let Ok(_gc) = self.try_gc_lock() else {
            return;
        };
        let Ok(list) = self.list() else {
            return;
        };
        for info in list {
            if !info.names.is_empty() || info.id.is_empty() {
                continue;
            }
            let Ok(rec) = self.record(&info.id) else {
                continue;
            };
            if rec.config.labels.contains_key(labels::ID) && !self.in_use(&rec) {
                if let Ok(p) = self.record_file(&rec.id) {
                    // Tried again at the next sweep; the record names a snapshot nothing uses.
                    let _ = fs::remove_file(p);
                }
            }
        }
        // Garbage collection is best effort here: `image prune` reports its errors.
        let _ = self.collect_garbage(&mut crate::PruneReport::default());
    }
}

/// Whether `owner` (`None`: anyone) may see snapshot `s`: its own, and unowned ones (taken
/// by the local root with `agentrun snapshot create`).
fn visible_to(s: &Snapshot, owner: Option<&str>) -> bool {
    owner.is_none_or(|o| o == s.owner || s.owner.is_empty())
}

/// The OCI config of an image over the built-in `host` image (its own layers only).
fn host_document() -> serde_json::Value {
    let c = ImageConfig::default();
    serde_json::json!({
        "created": rfc3339_now(),
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": c.env,
            "Labels": {},
        },
        "rootfs": {"type": "layers", "diff_ids": []},
        "history": [],
    })
}

/// The owner a secret (an API key) stands for: the first 16 hex digits of its SHA-256 (the
/// key itself is never written).
pub fn owner_of_secret(secret: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(secret.as_bytes());
    hex::encode(&d[..8])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir;

    fn upper(p: &Path) -> UpperDir<'_> {
        // The test's own ids are outside the range: written as 65534.
        UpperDir {
            path: p,
            ids: crate::layer::IdMap::range(0, 65536),
        }
    }

    #[test]
    fn snapshots_are_named_images_over_their_base_owned_and_removable() {
        let root = test_dir("snap-root");
        let base_dir = test_dir("snap-base");
        fs::write(base_dir.join("base.txt"), "base").unwrap();
        let store = ImageStore::open(&root).unwrap();
        store
            .add_dir("snapbase", &base_dir, &ImageConfig::default())
            .unwrap();
        let up = test_dir("snap-upper");
        fs::create_dir_all(up.join("work")).unwrap();
        fs::write(up.join("work/new.txt"), "new").unwrap();
        let meta = SnapshotMeta {
            id: "snap-1".into(),
            sandbox_id: "sbx".into(),
            name: Some("first".into()),
            owner: owner_of_secret("key-1"),
            entrypoint: Some(vec!["sleep".into(), "1".into()]),
            max_bytes: Some(1000),
        };
        let s = store
            .create_snapshot("snapbase", &upper(&up), &meta)
            .unwrap();
        assert_eq!(
            (s.id.as_str(), s.sandbox_id.as_str(), s.size),
            ("snap-1", "sbx", 3)
        );
        assert_eq!(s.entrypoint, meta.entrypoint);
        // A runnable image: the base's layer under the new one.
        let img = store.resolve(&snapshot_ref("snap-1")).unwrap();
        assert_eq!(img.layers.len(), 2);
        assert_eq!(
            fs::read_to_string(img.layers[0].join("work/new.txt")).unwrap(),
            "new"
        );
        assert!(img.layers[1].join("base.txt").exists());
        // Owned: another key sees nothing; no owner sees all.
        let other = owner_of_secret("key-2");
        assert!(store.snapshots(Some(&other)).unwrap().is_empty());
        assert!(matches!(
            store.snapshot("snap-1", Some(&other)),
            Err(ImageError::NotFound(_))
        ));
        assert_eq!(store.snapshots(None).unwrap().len(), 1);
        assert_eq!(
            store.snapshot("snap-1", Some(&meta.owner)).unwrap().name,
            Some("first".into())
        );
        assert!(store.snapshot("../x", None).is_err());
        // Over the limit: refused with the size, nothing written.
        fs::write(up.join("big"), vec![0u8; 2000]).unwrap();
        let blobs = fs::read_dir(root.join("blobs/sha256")).unwrap().count();
        let big = SnapshotMeta {
            id: "snap-2".into(),
            ..meta.clone()
        };
        match store.create_snapshot("snapbase", &upper(&up), &big) {
            Err(ImageError::SnapshotTooLarge { bytes, max }) => {
                assert_eq!((bytes, max), (2003, 1000))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            fs::read_dir(root.join("blobs/sha256")).unwrap().count(),
            blobs
        );
        // Removed while a sandbox runs from it: the name goes, the image stays (a base for a
        // snapshot of that sandbox) until it ends and the store is collected.
        let lease = img.lease().unwrap();
        store.remove_snapshot("snap-1", Some(&meta.owner)).unwrap();
        assert!(store.snapshot("snap-1", None).is_err());
        assert!(store.record(&s.image_id).is_ok());
        assert!(store.collect_interrupted().unwrap());
        assert!(store.record(&s.image_id).is_ok(), "collected while in use");
        drop(lease);
        assert!(store.collect_interrupted().unwrap());
        assert!(store.record(&s.image_id).is_err());
        // Removed: gone, its layer collected.
        let s = store
            .create_snapshot(
                "snapbase",
                &upper(&up),
                &SnapshotMeta {
                    id: "snap-1".into(),
                    max_bytes: None,
                    ..meta.clone()
                },
            )
            .unwrap();
        let img = store.resolve(&snapshot_ref(&s.id)).unwrap();
        store.remove_snapshot("snap-1", Some(&meta.owner)).unwrap();
        assert!(store.snapshots(None).unwrap().is_empty());
        assert!(!img.layers[0].exists());
        for d in [root, base_dir, up] {
            fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn interrupted_snapshots_are_collected_at_start() {
        let root = test_dir("snap-interrupted");
        let up = test_dir("snap-interrupted-upper");
        fs::write(up.join("f"), "x").unwrap();
        let store = ImageStore::open(&root).unwrap();
        let s = store
            .create_snapshot(
                crate::HOST_IMAGE,
                &upper(&up),
                &SnapshotMeta {
                    id: "snap-i".into(),
                    ..SnapshotMeta::default()
                },
            )
            .unwrap();
        // Made over the host image: its own layer only, the host image under it.
        assert_eq!(store.record(&s.image_id).unwrap().layers.len(), 1);
        // As if killed between the record and its name: the name is gone, a temp file left.
        let mut refs: BTreeMap<String, String> =
            serde_json::from_slice(&fs::read(root.join("refs.json")).unwrap()).unwrap();
        refs.clear();
        fs::write(root.join("refs.json"), serde_json::to_vec(&refs).unwrap()).unwrap();
        fs::write(root.join("tmp/blob-half"), "half").unwrap();
        assert!(store.snapshots(None).unwrap().is_empty(), "never listed");
        assert!(store.collect_interrupted().unwrap());
        assert_eq!(fs::read_dir(root.join("tmp")).unwrap().count(), 0);
        assert_eq!(fs::read_dir(root.join("records")).unwrap().count(), 0);
        assert_eq!(fs::read_dir(root.join("blobs/sha256")).unwrap().count(), 0);
        for d in [root, up] {
            fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn tree_bytes_follows_the_top_symlink_only() {
        let d = test_dir("snap-bytes");
        fs::create_dir_all(d.join("real/sub")).unwrap();
        fs::write(d.join("real/sub/a"), "12345").unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
        std::os::unix::fs::symlink("/etc", d.join("real/out")).unwrap();
        assert_eq!(tree_bytes(&d.join("link")), 5 + 4);
        fs::remove_dir_all(&d).unwrap();
    }
}
