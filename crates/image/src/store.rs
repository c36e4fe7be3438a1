//! The local image store: `<root>/images/<name>/{rootfs/,image.json}`.
//!
//! Directory images are copied in whole (ownership, modes, symlinks and timestamps kept), so a
//! later change to the source directory never changes a sandbox. The content-addressed layer
//! store that `image import/pull` need builds on this layout.

use std::fs;
use std::os::unix::fs::{lchown, symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{host, Image, ImageError};

/// The name of the built-in image.
pub const HOST_IMAGE: &str = "host";

/// What `agentrun image ls` shows.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageInfo {
    pub name: String,
    /// `builtin` or `dir`.
    pub kind: String,
    /// Where the image came from (a directory path for `dir` images).
    pub source: String,
    /// Seconds since the epoch.
    pub created: u64,
}

/// The store rooted at `AGENTRUN_ROOT` (default `/var/lib/agentrun`).
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
}

impl ImageStore {
    /// Opens (and creates if needed) the store under `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, ImageError> {
        let root = root.into();
        let images = root.join("images");
        fs::create_dir_all(&images).map_err(ImageError::io("create", &images))?;
        Ok(ImageStore { root })
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join("images").join(name)
    }

    /// Resolves a name to an image.
    pub fn resolve(&self, name: &str) -> Result<Image, ImageError> {
        if name == HOST_IMAGE {
            return host::ensure(&self.dir(HOST_IMAGE));
        }
        validate_name(name)?;
        let dir = self.dir(name);
        if !dir.join("image.json").is_file() {
            return Err(ImageError::NotFound(name.to_owned()));
        }
        Ok(Image {
            name: name.to_owned(),
            rootfs: dir.join("rootfs"),
            host_binds: Vec::new(),
        })
    }

    /// Copies the root filesystem at `src` into the store as image `name`.
    pub fn add_dir(&self, name: &str, src: &Path) -> Result<ImageInfo, ImageError> {
        if name == HOST_IMAGE {
            return Err(ImageError::BuiltIn(name.to_owned()));
        }
        validate_name(name)?;
        let meta = fs::metadata(src).map_err(ImageError::io("cannot read", src))?;
        if !meta.is_dir() {
            return Err(ImageError::Source {
                path: src.to_owned(),
                message: "not a directory".into(),
            });
        }
        let dir = self.dir(name);
        if dir.join("image.json").exists() {
            return Err(ImageError::Exists(name.to_owned()));
        }
        let tmp = self
            .root
            .join("images")
            .join(format!(".{name}.tmp.{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp).map_err(ImageError::io("create", &tmp))?;
        let result = (|| {
            copy_tree(src, &tmp.join("rootfs"))?;
            let info = ImageInfo {
                name: name.to_owned(),
                kind: "dir".into(),
                source: src.display().to_string(),
                created: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0),
            };
            let json = serde_json::to_vec_pretty(&info).expect("ImageInfo serializes");
            let meta_path = tmp.join("image.json");
            fs::write(&meta_path, json).map_err(ImageError::io("write", &meta_path))?;
            fs::rename(&tmp, &dir).map_err(|e| {
                if dir.exists() {
                    ImageError::Exists(name.to_owned())
                } else {
                    ImageError::io("rename", &tmp)(e)
                }
            })?;
            Ok(info)
        })();
        if result.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        result
    }

    /// Lists the images, the built-in one first.
    pub fn list(&self) -> Result<Vec<ImageInfo>, ImageError> {
        let mut out = vec![ImageInfo {
            name: HOST_IMAGE.into(),
            kind: "builtin".into(),
            source: "host /usr (read-only) + synthesized /etc".into(),
            created: 0,
        }];
        let images = self.root.join("images");
        let mut found = Vec::new();
        for entry in fs::read_dir(&images).map_err(ImageError::io("read", &images))? {
            let entry = entry.map_err(ImageError::io("read", &images))?;
            let meta = entry.path().join("image.json");
            if let Ok(bytes) = fs::read(&meta) {
                if let Ok(info) = serde_json::from_slice::<ImageInfo>(&bytes) {
                    found.push(info);
                }
            }
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(found);
        Ok(out)
    }

    /// Removes an image. Sandboxes already running on it keep their view until they end.
    pub fn remove(&self, name: &str) -> Result<(), ImageError> {
        if name == HOST_IMAGE {
            return Err(ImageError::BuiltIn(name.to_owned()));
        }
        validate_name(name)?;
        let dir = self.dir(name);
        if !dir.join("image.json").exists() {
            return Err(ImageError::NotFound(name.to_owned()));
        }
        // Rename first so the name disappears atomically, then delete.
        let doomed = self
            .root
            .join("images")
            .join(format!(".{name}.rm.{}", std::process::id()));
        fs::rename(&dir, &doomed).map_err(ImageError::io("rename", &dir))?;
        fs::remove_dir_all(&doomed).map_err(ImageError::io("remove", &doomed))
    }
}

fn validate_name(name: &str) -> Result<(), ImageError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(ImageError::InvalidName(name.to_owned()))
    }
}

/// Recursively copies a rootfs, keeping ownership, modes, symlinks and mtimes. Device nodes,
/// sockets and fifos are not copied: a sandbox gets its own /dev.
fn copy_tree(src: &Path, dst: &Path) -> Result<(), ImageError> {
    let meta = fs::symlink_metadata(src).map_err(ImageError::io("stat", src))?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let link = fs::read_link(src).map_err(ImageError::io("readlink", src))?;
        symlink(&link, dst).map_err(ImageError::io("symlink", dst))?;
    } else if ft.is_dir() {
        fs::create_dir(dst).map_err(ImageError::io("create", dst))?;
        for entry in fs::read_dir(src).map_err(ImageError::io("read", src))? {
            let entry = entry.map_err(ImageError::io("read", src))?;
            copy_tree(&entry.path(), &dst.join(entry.file_name()))?;
        }
        fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(ImageError::io("chmod", dst))?;
    } else if ft.is_file() {
        fs::copy(src, dst).map_err(ImageError::io("copy", src))?;
        fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(ImageError::io("chmod", dst))?;
    } else {
        return Ok(());
    }
    lchown(dst, Some(meta.uid()), Some(meta.gid())).map_err(ImageError::io("chown", dst))?;
    if !ft.is_symlink() {
        // chown clears set-id bits: restore the mode afterwards.
        fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(ImageError::io("chmod", dst))?;
        let mtime = nix::sys::time::TimeSpec::new(meta.mtime(), meta.mtime_nsec());
        let _ = nix::sys::stat::utimensat(
            None,
            dst,
            &mtime,
            &mtime,
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("agentrun-store-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn add_resolve_list_remove() {
        let root = tempdir("root");
        let src = tempdir("src");
        fs::create_dir_all(src.join("bin")).unwrap();
        fs::write(src.join("bin/tool"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(src.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
        symlink("tool", src.join("bin/alias")).unwrap();
        let store = ImageStore::open(&root).unwrap();
        store.add_dir("tiny", &src).unwrap();
        assert!(matches!(
            store.add_dir("tiny", &src),
            Err(ImageError::Exists(_))
        ));
        let img = store.resolve("tiny").unwrap();
        let m = fs::metadata(img.rootfs.join("bin/tool")).unwrap();
        assert_eq!(m.mode() & 0o777, 0o755);
        assert_eq!(
            fs::read_link(img.rootfs.join("bin/alias")).unwrap(),
            Path::new("tool")
        );
        let names: Vec<_> = store.list().unwrap().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["host", "tiny"]);
        store.remove("tiny").unwrap();
        assert!(matches!(
            store.resolve("tiny"),
            Err(ImageError::NotFound(_))
        ));
        assert!(matches!(store.remove("host"), Err(ImageError::BuiltIn(_))));
        assert!(matches!(
            store.resolve("../etc"),
            Err(ImageError::InvalidName(_))
        ));
        fs::remove_dir_all(&root).unwrap();
        fs::remove_dir_all(&src).unwrap();
    }
}
