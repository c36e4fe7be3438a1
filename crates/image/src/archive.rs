//! Image archives: `image import` of OCI image layouts (directory or tar) and `docker save`
//! tars, and `image export` to an OCI layout tar that `ctr image import`, `skopeo` and
//! `docker load` read.
//!
//! A tar is first unpacked into the store's `tmp/` (regular files and directories only, paths
//! checked like layer paths), then read as a directory. Every file an archive's JSON names is
//! resolved inside the archive directory: a name that leaves it is refused. Every blob is
//! checked against its digest as it is copied into the store.

use std::fs::{self, File};
use std::io::{self, Read, Seek, Write};
use std::path::{Component, Path, PathBuf};

use oci_spec::image::{ImageIndex, ImageManifest};
use serde::Deserialize;

use crate::blobs::{read_document, temp_path};
use crate::digest::hex_of;
use crate::layer::{decompress, EntryError};
use crate::limits::{drain, Budget, TarError, TarGuard, UnpackLimits};
use crate::progress::Phase;
use crate::reference;
use crate::store::{ImageStore, DOCKER_LIST, OCI_INDEX, OCI_LAYER_GZIP, OCI_LAYER_TAR};
use crate::{ImageError, ImageRecord};

const NAME_ANNOTATION: &str = "io.containerd.image.name";
const REF_ANNOTATION: &str = "org.opencontainers.image.ref.name";
/// How deep image indexes may nest in an OCI layout (real ones: 1, an index of manifests).
const MAX_INDEX_DEPTH: usize = 8;

/// One image of `docker save`'s manifest.json.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerSaveEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

impl ImageStore {
    /// Imports every image of an OCI layout (dir or tar) or a `docker save` tar. `name`, if
    /// given, names the image (the archive must hold exactly one). Returns the records with the
    /// names each got.
    pub fn import(
        &self,
        path: &Path,
        name: Option<&str>,
    ) -> Result<Vec<(ImageRecord, Vec<String>)>, ImageError> {
        if let Some(n) = name {
            reference::normalize(n)?;
        }
        let meta = fs::metadata(path).map_err(ImageError::io("cannot read", path))?;
        let result = (|| {
            let _w = self.writer_lock()?;
            if meta.is_dir() {
                return self.import_dir(path, name);
            }
            let staged = temp_path(&self.tmp_dir(), "import");
            let result = extract_archive(path, &staged, &self.budget())
                .and_then(|()| self.import_dir(&staged, name));
            // Best effort: a leftover in tmp/ is swept by the next garbage collection.
            let _ = fs::remove_dir_all(&staged);
            result
        })();
        if result.is_err() {
            // Nothing half-imported stays: blobs and layers no image refers to go.
            self.discard_unreferenced();
        }
        result
    }

    /// Unpacks a build context (a tar, optionally compressed, as `docker build` sends it)
    /// into `dest` under the store's limits: directories, regular files (modes kept) and
    /// symlinks, which may be absolute; the builder never follows a context symlink out of
    /// the context.
    pub fn unpack_context(&self, r: impl Read, dest: &Path) -> Result<(), ImageError> {
        extract_tar(r, dest, Path::new("build context"), true, &self.budget())
    }

    fn import_dir(
        &self,
        dir: &Path,
        name: Option<&str>,
    ) -> Result<Vec<(ImageRecord, Vec<String>)>, ImageError> {
        let dir = dir
            .canonicalize()
            .map_err(ImageError::io("cannot read", dir))?;
        let mut found: Vec<(String, Vec<String>)> = if dir.join("index.json").is_file() {
            self.oci_manifests(&dir)?
        } else if dir.join("manifest.json").is_file() {
            self.docker_manifests(&dir)?
        } else {
            return Err(ImageError::source(
                &dir,
                "neither an OCI image layout (index.json) nor a `docker save` archive (manifest.json)",
            ));
        };
        if found.is_empty() {
            return Err(ImageError::source(&dir, "the archive holds no image"));
        }
        if let Some(n) = name {
            if found.len() > 1 {
                return Err(ImageError::source(
                    &dir,
                    format!(
                        "--name needs an archive with one image; this one has {}",
                        found.len()
                    ),
                ));
            }
            found[0].1 = vec![n.to_owned()];
        }
        let mut out = Vec::new();
        // The layers of every image of the archive share one budget.
        let budget = self.budget();
        for (manifest_digest, names) in found {
            let rec = self.commit(&manifest_digest, &names, &budget)?;
            let names = names
                .iter()
                .filter_map(|n| reference::normalize(n).ok())
                .collect();
            out.push((rec, names));
        }
        Ok(out)
    }

    /// Copies a blob from an OCI layout into the store, checking its digest.
    /// Layers are reported as [`Phase::Copy`] (or as already stored).
    fn copy_layout_blob(&self, dir: &Path, digest: &str, what: &str) -> Result<(), ImageError> {
        let src = inside(dir, &format!("blobs/sha256/{}", hex_of(digest)?))?;
        let f = File::open(&src).map_err(ImageError::io("open", &src))?;
        if what != "layer" {
            self.blobs.put_reader(Some(digest), what, f)?;
            return Ok(());
        }
        if self.blobs.has(digest) {
            self.progress.exists(digest);
            return Ok(());
        }
        let total = f.metadata().ok().map(|m| m.len());
        self.progress.phase(digest, Phase::Copy, total, |tick| {
            self.blobs.put_reader(Some(digest), what, tick.reader(f))
        })?;
        Ok(())
    }

    /// The image manifests of an OCI layout, stored with their blobs, and the names its index
    /// gives them.
    fn oci_manifests(&self, dir: &Path) -> Result<Vec<(String, Vec<String>)>, ImageError> {
        let index_path = dir.join("index.json");
        let index = ImageIndex::from_reader(&read_document(&index_path)?[..])
            .map_err(|e| ImageError::source(&index_path, format!("bad index.json: {e}")))?;
        let mut out = Vec::new();
        for desc in index.manifests() {
            let digest = desc.digest().to_string();
            let annotations = desc.annotations().clone().unwrap_or_default();
            let names: Vec<String> = annotations
                .get(NAME_ANNOTATION)
                .or_else(|| annotations.get(REF_ANNOTATION))
                .filter(|n| n.contains(['/', ':']) && reference::normalize(n).is_ok())
                .cloned()
                .into_iter()
                .collect();
            let manifest_digest =
                self.oci_image_manifest(dir, &digest, desc.media_type().as_ref(), 0)?;
            out.push((manifest_digest, names));
        }
        Ok(out)
    }

    /// Stores the manifest `digest` (resolving an index to its linux/amd64 manifest) with its
    /// config and layers; returns the image manifest's digest. `depth`: indexes above this
    /// one (a blob's content is checked against its name only when stored, so an index can
    /// name itself: the nesting is bounded).
    fn oci_image_manifest(
        &self,
        dir: &Path,
        digest: &str,
        media_type: &str,
        depth: usize,
    ) -> Result<String, ImageError> {
        let src = inside(dir, &format!("blobs/sha256/{}", hex_of(digest)?))?;
        let bytes = read_document(&src)?;
        if media_type == OCI_INDEX || media_type == DOCKER_LIST {
            if depth >= MAX_INDEX_DEPTH {
                return Err(ImageError::source(
                    &src,
                    format!("image indexes nested more than {MAX_INDEX_DEPTH} deep"),
                ));
            }
            let index = ImageIndex::from_reader(&bytes[..])
                .map_err(|e| ImageError::source(&src, format!("bad index: {e}")))?;
            let child = pick_platform(&index)
                .ok_or_else(|| ImageError::source(&src, "no linux/amd64 image in this index"))?;
            return self.oci_image_manifest(dir, &child.0, &child.1, depth + 1);
        }
        let manifest = ImageManifest::from_reader(&bytes[..])
            .map_err(|e| ImageError::source(&src, format!("bad manifest: {e}")))?;
        self.copy_layout_blob(dir, manifest.config().digest().as_ref(), "image config")?;
        for l in manifest.layers() {
            self.copy_layout_blob(dir, l.digest().as_ref(), "layer")?;
        }
        self.blobs
            .put_reader(Some(digest), "manifest", &bytes[..])?;
        Ok(digest.to_owned())
    }

    /// The images of a `docker save` archive, stored as OCI images.
    fn docker_manifests(&self, dir: &Path) -> Result<Vec<(String, Vec<String>)>, ImageError> {
        let mpath = dir.join("manifest.json");
        let bytes = read_document(&mpath)?;
        let entries: Vec<DockerSaveEntry> = serde_json::from_slice(&bytes)
            .map_err(|e| ImageError::source(&mpath, format!("bad manifest.json: {e}")))?;
        let mut out = Vec::new();
        for e in entries {
            let cpath = inside(dir, &e.config)?;
            let config = read_document(&cpath)?;
            // The blob's digest is known once it is stored: progress names a layer by its
            // diff id (the digest of an uncompressed layer.tar, as docker saves them).
            let diff_ids = serde_json::from_slice::<serde_json::Value>(&config)
                .ok()
                .and_then(|c| c.pointer("/rootfs/diff_ids").cloned())
                .and_then(|d| serde_json::from_value::<Vec<String>>(d).ok())
                .unwrap_or_default();
            let mut layers = Vec::new();
            for (i, l) in e.layers.iter().enumerate() {
                let lpath = inside(dir, l)?;
                let mut f = File::open(&lpath).map_err(ImageError::io("open", &lpath))?;
                let mut magic = [0u8; 2];
                let gz = f.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
                f.rewind().map_err(ImageError::io("read", &lpath))?;
                let id = diff_ids.get(i).cloned().unwrap_or_else(|| l.clone());
                let total = f.metadata().ok().map(|m| m.len());
                let (digest, size) = self.progress.phase(&id, Phase::Copy, total, |tick| {
                    self.blobs.put_reader(None, "layer", tick.reader(f))
                })?;
                let media = if gz { OCI_LAYER_GZIP } else { OCI_LAYER_TAR };
                layers.push((digest, size, media));
            }
            let manifest_digest = self.put_manifest(&config, &layers)?;
            out.push((manifest_digest, e.repo_tags.unwrap_or_default()));
        }
        Ok(out)
    }

    /// Writes images as one OCI image layout tar. Each is named in the index by the name it
    /// was asked for (`io.containerd.image.name` = full name, `org.opencontainers.image.ref.name`
    /// = tag), as containerd and skopeo expect.
    pub fn export(&self, names: &[String], out: impl Write) -> Result<(), ImageError> {
        let mut manifests = Vec::new();
        let mut blobs: Vec<String> = Vec::new();
        let mut layer_blobs = std::collections::BTreeSet::new();
        for n in names {
            let rec = self.find(n)?;
            let full = reference::parse(n)
                .ok()
                .filter(|r| r.digest().is_none() && reference::id_prefix(n).is_none())
                .map(|r| r.whole())
                .or_else(|| {
                    self.names_of(&rec.id)
                        .ok()
                        .and_then(|v| v.into_iter().next())
                });
            let mut annotations = serde_json::Map::new();
            if let Some(full) = &full {
                annotations.insert(NAME_ANNOTATION.into(), full.clone().into());
                if let Ok(r) = reference::parse(full) {
                    if let Some(tag) = r.tag() {
                        annotations.insert(REF_ANNOTATION.into(), tag.into());
                    }
                }
            }
            manifests.push(serde_json::json!({
                "mediaType": rec.manifest_media_type,
                "digest": rec.manifest_digest,
                "size": rec.manifest_size,
                "annotations": annotations,
                "platform": {"architecture": rec.architecture, "os": rec.os},
            }));
            layer_blobs.extend(rec.layers.iter().map(|l| l.digest.clone()));
            for d in std::iter::once(&rec.manifest_digest)
                .chain(std::iter::once(&rec.id))
                .chain(rec.layers.iter().map(|l| &l.digest))
            {
                if !blobs.contains(d) {
                    blobs.push(d.clone());
                }
            }
        }
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": manifests,
        });
        let io_err = |e: io::Error| ImageError::source("export", e.to_string());
        let mut tar = tar::Builder::new(out);
        let add = |tar: &mut tar::Builder<_>, path: &str, size: u64, r: &mut dyn Read| {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(size);
            h.set_mtime(0);
            tar.append_data(&mut h, path, r).map_err(io_err)
        };
        let dir_header = |path: &str| {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(0o755);
            h.set_size(0);
            h.set_mtime(0);
            (h, path.to_owned())
        };
        let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
        add(
            &mut tar,
            "oci-layout",
            layout.len() as u64,
            &mut &layout[..],
        )?;
        let index = serde_json::to_vec(&index).expect("json");
        add(&mut tar, "index.json", index.len() as u64, &mut &index[..])?;
        for d in ["blobs/", "blobs/sha256/"] {
            let (mut h, p) = dir_header(d);
            tar.append_data(&mut h, p, io::empty()).map_err(io_err)?;
        }
        for d in &blobs {
            let f = self.blobs.open_blob(d)?;
            let size = f.metadata().map_err(io_err)?.len();
            let path = format!("blobs/sha256/{}", hex_of(d)?);
            if !layer_blobs.contains(d) {
                add(&mut tar, &path, size, &mut { f })?;
                continue;
            }
            self.progress.phase(d, Phase::Export, Some(size), |tick| {
                add(&mut tar, &path, size, &mut tick.reader(f))
            })?;
        }
        tar.into_inner().map_err(io_err)?.flush().map_err(io_err)
    }
}

/// The linux/amd64 entry of an index: (digest, media type).
pub(crate) fn pick_platform(index: &ImageIndex) -> Option<(String, String)> {
    index
        .manifests()
        .iter()
        .find(|m| {
            m.platform().as_ref().is_none_or(|p| {
                p.os().to_string() == "linux" && p.architecture().to_string() == "amd64"
            })
        })
        .map(|m| (m.digest().to_string(), m.media_type().to_string()))
}

/// `rel` (from an archive's JSON) inside `dir`: no `..`, no absolute path, and what it
/// resolves to (symlinks followed) stays inside `dir`.
fn inside(dir: &Path, rel: &str) -> Result<PathBuf, ImageError> {
    let p = Path::new(rel);
    if p.components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(ImageError::source(
            dir,
            format!("archive names {rel:?}, outside the archive"),
        ));
    }
    let full = dir.join(p);
    let real = full
        .canonicalize()
        .map_err(|e| ImageError::source(dir, format!("archive names {rel:?}: {e}")))?;
    if !real.starts_with(dir) {
        return Err(ImageError::source(
            dir,
            format!("archive names {rel:?}, outside the archive"),
        ));
    }
    Ok(real)
}

/// Reads every entry of a tar (optionally gzip- or zstd-compressed) under `limits`, for a
/// caller that copies the entries elsewhere (a build's `ADD` of a local archive): bytes,
/// entries, expansion and depth are charged and refused as for an import. `what` names the
/// archive in errors. An error `f` returns is passed on as an [`ImageError::Source`].
pub fn for_each_tar_entry<R: Read>(
    r: R,
    limits: UnpackLimits,
    what: &Path,
    mut f: impl FnMut(&mut tar::Entry<'_, Box<dyn Read + '_>>) -> io::Result<()>,
) -> Result<(), ImageError> {
    read_guarded(r, &Budget::new(limits), what, |entry, _| {
        f(entry).map_err(EntryError::Caller)
    })
}

/// The one loop over a tar's entries under a budget (archives, build contexts, `ADD`):
/// `f` gets each entry and its path; what it leaves unread is drained (and charged). Its
/// error, or the limit behind it, fails the whole archive.
fn read_guarded<R: Read>(
    r: R,
    budget: &Budget,
    what: &Path,
    mut f: impl FnMut(&mut tar::Entry<'_, Box<dyn Read + '_>>, &Path) -> Result<(), EntryError>,
) -> Result<(), ImageError> {
    let guard = TarGuard::new(budget);
    // A limit the guard hit explains any failure better than the error it caused.
    let bad = |m: String| match guard.exceeded() {
        Some(x) => x.into_error(what.display().to_string()),
        None => ImageError::source(what, m),
    };
    let stream = decompress(guard.compressed(r)).map_err(|e| bad(format!("reading: {e}")))?;
    let reader: Box<dyn Read + '_> = Box::new(guard.unpacked(stream));
    let mut archive = tar::Archive::new(reader);
    let mut entries = archive
        .entries()
        .map_err(|e| bad(format!("not a tar archive: {e}")))?;
    while let Some(entry) = guard.next_entry(&mut entries) {
        let mut entry = entry.map_err(|e| match e {
            TarError::Limit(x) => x.into_error(what.display().to_string()),
            TarError::Io(e) => bad(format!("not a tar archive: {e}")),
        })?;
        let path = entry
            .path()
            .map_err(|e| bad(format!("bad entry path: {e}")))?
            .into_owned();
        budget
            .check_depth(&path)
            .map_err(|x| x.into_error(what.display().to_string()))?;
        f(&mut entry, &path).map_err(|e| bad(e.to_string()))?;
        drain(&mut entry).map_err(|e| bad(format!("reading: {e}")))?;
    }
    Ok(())
}

/// Unpacks an archive (tar, optionally compressed) into `dest`: directories, regular files and
/// relative symlinks (older `docker save` links duplicate layers) only.
fn extract_archive(path: &Path, dest: &Path, budget: &Budget) -> Result<(), ImageError> {
    let f = File::open(path).map_err(ImageError::io("open", path))?;
    extract_tar(f, dest, path, false, budget)
}

fn extract_tar(
    r: impl Read,
    dest: &Path,
    what: &Path,
    absolute_symlinks: bool,
    budget: &Budget,
) -> Result<(), ImageError> {
    fs::create_dir_all(dest).map_err(ImageError::io("create", dest))?;
    read_guarded(r, budget, what, |entry, raw| {
        // The same path rules as layer entries: no `..`, parents are real directories
        // (never a symlink from the archive).
        let Some(rel) = crate::layer::relative(raw).map_err(EntryError::of_entry(raw))? else {
            return Ok(());
        };
        let target = crate::layer::safe_parent(dest, &rel).map_err(EntryError::of_entry(raw))?;
        let at = |op: &'static str| {
            let path = target.clone();
            move |source| EntryError::Path { op, path, source }
        };
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        match entry.header().entry_type() {
            tar::EntryType::Directory if !target.is_dir() => {
                fs::create_dir(&target).map_err(at("create"))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                // Replacing an earlier entry of the same name; absent is the usual case.
                let _ = fs::remove_file(&target);
                let mut out = File::options()
                    .write(true)
                    .create_new(true)
                    .open(&target)
                    .map_err(at("create"))?;
                io::copy(entry, &mut out).map_err(at("write"))?;
                use std::os::unix::fs::PermissionsExt;
                // The file is there with the default mode; a build only reads it.
                let _ = fs::set_permissions(&target, fs::Permissions::from_mode(mode));
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name()
                    .map_err(EntryError::BadLink)?
                    .ok_or_else(|| EntryError::SymlinkWithoutTarget(raw.to_owned()))?;
                if link.is_absolute() && !absolute_symlinks {
                    return Err(EntryError::AbsoluteSymlink(raw.to_owned()));
                }
                // Replacing an earlier entry of the same name; absent is the usual case.
                let _ = fs::remove_file(&target);
                std::os::unix::fs::symlink(&link, &target).map_err(at("symlink"))?;
            }
            _ => {}
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir;

    /// An index whose entry names itself (the file name is the digest; what the file holds is
    /// only checked when it is stored, after the recursion): refused, not a stack overflow
    /// that takes the importing process down.
    #[test]
    fn an_index_that_contains_itself_is_refused() {
        let layout = test_dir("archive-selfindex");
        let store_root = test_dir("archive-selfindex-store");
        let hex = "a".repeat(64);
        let entry = serde_json::json!({
            "mediaType": OCI_INDEX, "digest": format!("sha256:{hex}"), "size": 1,
        });
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [entry]});
        fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
        fs::write(
            layout.join("oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        fs::write(layout.join("index.json"), index.to_string()).unwrap();
        fs::write(layout.join("blobs/sha256").join(&hex), index.to_string()).unwrap();
        let store = ImageStore::open(&store_root).unwrap();
        let err = store.import(&layout, None).unwrap_err().to_string();
        assert!(err.contains("nested"), "{err}");
        fs::remove_dir_all(&layout).unwrap();
        fs::remove_dir_all(&store_root).unwrap();
    }
}
