//! The blob store: `<root>/blobs/sha256/<hex>`, each file named by the digest of its content.
//!
//! Blobs are written to a temporary file beside the store, hashed while written, fsync'd and
//! renamed into place only when the digest is right, so a blob that exists is complete and
//! correct, and two writers of the same blob (concurrent pulls) both succeed.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::digest::{hex_of, HashingWriter};
use crate::ImageError;

#[derive(Debug, Clone)]
pub struct BlobStore {
    dir: PathBuf,
    tmp: PathBuf,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// The largest JSON document (manifest, index, image config) read into memory. Registries
/// refuse manifests over 4 MiB; configs are a few KiB.
pub const MAX_DOCUMENT: u64 = 16 << 20;

/// Reads a JSON document from a file, refusing one over [`MAX_DOCUMENT`].
pub fn read_document(path: &Path) -> Result<Vec<u8>, ImageError> {
    read_capped(
        File::open(path).map_err(ImageError::io("read", path))?,
        path,
    )
}

fn read_capped(f: File, path: &Path) -> Result<Vec<u8>, ImageError> {
    let mut buf = Vec::new();
    f.take(MAX_DOCUMENT + 1)
        .read_to_end(&mut buf)
        .map_err(ImageError::io("read", path))?;
    if buf.len() as u64 > MAX_DOCUMENT {
        return Err(ImageError::source(
            path,
            format!("a JSON document over {} MiB: refused", MAX_DOCUMENT >> 20),
        ));
    }
    Ok(buf)
}

/// A unique temporary path under `tmp` (pid + sequence: concurrent processes never collide).
pub fn temp_path(tmp: &Path, tag: &str) -> PathBuf {
    let n = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    tmp.join(format!("{tag}-{}-{n}", std::process::id()))
}

impl BlobStore {
    pub fn open(root: &Path) -> Result<Self, ImageError> {
        let dir = root.join("blobs").join("sha256");
        let tmp = root.join("tmp");
        for d in [&dir, &tmp] {
            fs::create_dir_all(d).map_err(ImageError::io("create", d))?;
        }
        Ok(BlobStore { dir, tmp })
    }

    /// Path of a blob (which may not exist).
    pub fn path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.dir.join(hex_of(digest)?))
    }

    pub fn has(&self, digest: &str) -> bool {
        self.path(digest).map(|p| p.is_file()).unwrap_or(false)
    }

    pub fn open_blob(&self, digest: &str) -> Result<File, ImageError> {
        let p = self.path(digest)?;
        File::open(&p).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                ImageError::source(&p, format!("blob {digest} is missing from the store"))
            } else {
                ImageError::io("open", &p)(e)
            }
        })
    }

    /// Reads a JSON document (a manifest, an index, a config), at most [`MAX_DOCUMENT`].
    pub fn read(&self, digest: &str) -> Result<Vec<u8>, ImageError> {
        let p = self.path(digest)?;
        read_capped(self.open_blob(digest)?, &p)
    }

    /// Stores what `write` produces; `expected` (if given) must be its digest. Returns the
    /// digest and size.
    pub fn put_with(
        &self,
        expected: Option<&str>,
        what: &str,
        write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> Result<(String, u64), ImageError> {
        if let Some(d) = expected {
            hex_of(d)?;
            if self.has(d) {
                let size = fs::metadata(self.path(d)?).map(|m| m.len()).unwrap_or(0);
                return Ok((d.to_owned(), size));
            }
        }
        let tmp = temp_path(&self.tmp, "blob");
        let file = File::create(&tmp).map_err(ImageError::io("create", &tmp))?;
        let result = (|| {
            let mut w = HashingWriter::new(io::BufWriter::new(file));
            write(&mut w).map_err(|e| ImageError::source(&tmp, format!("writing {what}: {e}")))?;
            let (digest, size, buf) = w.finish();
            let file = buf
                .into_inner()
                .map_err(|e| ImageError::io("write", &tmp)(e.into_error()))?;
            if let Some(exp) = expected {
                if exp != digest {
                    return Err(ImageError::DigestMismatch {
                        what: what.to_owned(),
                        expected: exp.to_owned(),
                        actual: digest,
                    });
                }
            }
            file.sync_all().map_err(ImageError::io("fsync", &tmp))?;
            let dst = self.path(&digest)?;
            fs::rename(&tmp, &dst).map_err(ImageError::io("rename", &tmp))?;
            Ok((digest, size))
        })();
        if result.is_err() {
            // Best effort: a leftover in tmp/ is swept by the next garbage collection.
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Stores bytes.
    pub fn put_bytes(&self, bytes: &[u8], what: &str) -> Result<(String, u64), ImageError> {
        self.put_with(None, what, |w| w.write_all(bytes))
    }

    /// Stores a stream.
    pub fn put_reader(
        &self,
        expected: Option<&str>,
        what: &str,
        mut r: impl Read,
    ) -> Result<(String, u64), ImageError> {
        self.put_with(expected, what, |w| io::copy(&mut r, w).map(drop))
    }

    /// Every stored digest.
    pub fn list(&self) -> Result<Vec<String>, ImageError> {
        crate::digest::digests_named_in(&self.dir)
    }

    /// Removes a blob; returns its size.
    pub fn remove(&self, digest: &str) -> Result<u64, ImageError> {
        let p = self.path(digest)?;
        let size = fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        match fs::remove_file(&p) {
            Ok(()) => Ok(size),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(ImageError::io("remove", &p)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::of_bytes;

    #[test]
    fn put_verifies_and_dedups() {
        let root = std::env::temp_dir().join(format!("agentrun-blobs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let store = BlobStore::open(&root).unwrap();
        let (d, n) = store.put_bytes(b"abc", "test").unwrap();
        assert_eq!((d.as_str(), n), (of_bytes(b"abc").as_str(), 3));
        assert_eq!(store.read(&d).unwrap(), b"abc");
        // Same content again: no error, same digest.
        assert_eq!(
            store.put_reader(Some(&d), "test", &b"abc"[..]).unwrap().0,
            d
        );
        // Wrong content for a digest: refused, nothing left behind.
        let wrong = of_bytes(b"xyz");
        assert!(matches!(
            store.put_reader(Some(&wrong), "test", &b"abd"[..]),
            Err(ImageError::DigestMismatch { .. })
        ));
        assert!(!store.has(&wrong));
        assert_eq!(fs::read_dir(root.join("tmp")).unwrap().count(), 0);
        assert_eq!(store.list().unwrap(), vec![d]);
        fs::remove_dir_all(&root).unwrap();
    }
}
