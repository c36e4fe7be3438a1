//! Content digests (`sha256:<64 hex>`): validation, and readers/writers that hash what passes
//! through them.

use std::io::{self, Read, Write};

use sha2::{Digest as _, Sha256};

use crate::ImageError;

/// 12 hex digits of a digest or id, as Docker prints ids (`docker images`, `docker pull`'s
/// layers, `Successfully built`).
pub fn short_id(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &hex[..hex.len().min(12)]
}

/// The hex part of a valid `sha256:` digest. Other algorithms are refused: every registry and
/// tool this store talks to uses sha256.
pub fn hex_of(digest: &str) -> Result<&str, ImageError> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| invalid(digest))?;
    if hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(hex)
    } else {
        Err(invalid(digest))
    }
}

fn invalid(digest: &str) -> ImageError {
    ImageError::InvalidName(
        digest.to_owned(),
        "expected a digest sha256:<64 lowercase hex digits>".into(),
    )
}

/// The digests a directory's entries are named by (`<hex>` -> `sha256:<hex>`); other names
/// are ignored.
pub fn digests_named_in(dir: &std::path::Path) -> Result<Vec<String>, ImageError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(ImageError::io("read", dir))? {
        let e = e.map_err(ImageError::io("read", dir))?;
        let d = format!("sha256:{}", e.file_name().to_string_lossy());
        if hex_of(&d).is_ok() {
            out.push(d);
        }
    }
    Ok(out)
}

/// The `sha256:` digest of some bytes.
pub fn of_bytes(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A reader that hashes and counts what is read through it.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Reads whatever is left (a tar stream can end before its reader's end: trailing zero
    /// blocks count too), then returns `(digest, bytes read)`.
    pub fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((
            format!("sha256:{}", hex::encode(self.hasher.finalize())),
            self.count,
        ))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// A writer that hashes and counts what is written through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// `(digest, bytes written, inner writer)`.
    pub fn finish(self) -> (String, u64, W) {
        (
            format!("sha256:{}", hex::encode(self.hasher.finalize())),
            self.count,
            self.inner,
        )
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_digests() {
        let d = of_bytes(b"hello");
        assert_eq!(
            d,
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert!(hex_of(&d).is_ok());
        assert!(hex_of("sha256:../../etc/passwd").is_err());
        assert!(hex_of("md5:abc").is_err());
        assert!(hex_of(&d.to_uppercase()).is_err());
    }

    #[test]
    fn hashing_reader_counts_everything() {
        let r = HashingReader::new(&b"hello"[..]);
        assert_eq!(r.finish().unwrap(), (of_bytes(b"hello"), 5));
    }
}
