//! File contents in bounded memory: the line range of a download (`offset`/`limit`) and the
//! search and replace of `/files/replace`, both as a stream from a reader to a writer, so a
//! sandbox's 1 TiB (sparse) file costs the daemon a buffer, not its size.

use std::io::{self, BufRead, Read, Write};

/// Bytes read at a time.
const CHUNK: usize = 64 * 1024;

/// Copies lines `skip` (0-based) to `skip + take - 1` of `r` to `w`, each with its `\n` (the
/// last one may have none), as they are: bytes, not text. A line longer than memory is fine.
pub fn copy_lines(mut r: impl BufRead, mut w: impl Write, skip: u64, take: u64) -> io::Result<()> {
    let end = skip.saturating_add(take);
    let mut line = 0u64;
    while line < end {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        let mut used = 0;
        while used < buf.len() && line < end {
            let rest = &buf[used..];
            let (n, newline) = match memchr::memchr(b'\n', rest) {
                Some(i) => (i + 1, true),
                None => (rest.len(), false),
            };
            if line >= skip {
                w.write_all(&rest[..n])?;
            }
            used += n;
            if newline {
                line += 1;
            }
        }
        r.consume(used);
    }
    w.flush()
}

/// Why a replace failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplaceError {
    #[error("not UTF-8 text")]
    NotUtf8,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Checks that a stream of chunks is UTF-8, carrying a character cut between two chunks.
#[derive(Default)]
struct Utf8Check {
    carry: Vec<u8>,
}

impl Utf8Check {
    fn feed(&mut self, chunk: &[u8]) -> Result<(), ReplaceError> {
        let data: std::borrow::Cow<'_, [u8]> = if self.carry.is_empty() {
            chunk.into()
        } else {
            let mut d = std::mem::take(&mut self.carry);
            d.extend_from_slice(chunk);
            d.into()
        };
        match std::str::from_utf8(&data) {
            Ok(_) => Ok(()),
            // Cut at the end: the rest of the character comes with the next chunk.
            Err(e) if e.error_len().is_none() => {
                self.carry = data[e.valid_up_to()..].to_vec();
                Ok(())
            }
            Err(_) => Err(ReplaceError::NotUtf8),
        }
    }

    fn finish(self) -> Result<(), ReplaceError> {
        if self.carry.is_empty() {
            Ok(())
        } else {
            Err(ReplaceError::NotUtf8)
        }
    }
}

/// Copies `r` to `w` with every non-overlapping occurrence of `old` (from the left, as
/// `str::replace`) replaced by `new`; returns how many there were. `r` must be UTF-8. Holds
/// one chunk and `old.len() - 1` bytes, whatever the size of `r`.
pub fn replace_all(
    mut r: impl Read,
    mut w: impl Write,
    old: &[u8],
    new: &[u8],
) -> Result<u64, ReplaceError> {
    assert!(!old.is_empty(), "replace_all needs a non-empty pattern");
    let finder = memchr::memmem::Finder::new(old);
    let mut utf8 = Utf8Check::default();
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK + old.len());
    let mut chunk = vec![0u8; CHUNK];
    let mut count = 0u64;
    loop {
        let n = match r.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        let eof = n == 0;
        utf8.feed(&chunk[..n])?;
        buf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while let Some(i) = finder.find(&buf[at..]) {
            w.write_all(&buf[at..at + i])?;
            w.write_all(new)?;
            at += i + old.len();
            count += 1;
        }
        // A match may still start in the last `old.len() - 1` bytes: keep them.
        let keep_from = if eof {
            buf.len()
        } else {
            at.max(buf.len().saturating_sub(old.len() - 1))
        };
        w.write_all(&buf[at..keep_from])?;
        buf.drain(..keep_from);
        if eof {
            break;
        }
    }
    utf8.finish()?;
    w.flush()?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &[u8], skip: u64, take: u64) -> Vec<u8> {
        let mut out = Vec::new();
        copy_lines(io::BufReader::with_capacity(3, text), &mut out, skip, take).unwrap();
        out
    }

    #[test]
    fn line_ranges() {
        let text = b"one\ntwo\nthree\nfour";
        assert_eq!(lines(text, 0, u64::MAX), text.to_vec());
        assert_eq!(lines(text, 1, 2), b"two\nthree\n".to_vec());
        assert_eq!(lines(text, 3, 5), b"four".to_vec());
        assert_eq!(lines(text, 9, 1), b"".to_vec());
        assert_eq!(lines(b"\xff\xfe\nx\n", 0, 1), b"\xff\xfe\n".to_vec());
    }

    /// A reader handing out `step` bytes at a time, to cut matches and characters anywhere.
    struct Trickle<'a>(&'a [u8], usize);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.1.min(self.0.len()).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn replaced(text: &str, old: &str, new: &str, step: usize) -> (String, u64) {
        let mut out = Vec::new();
        let n = replace_all(
            Trickle(text.as_bytes(), step),
            &mut out,
            old.as_bytes(),
            new.as_bytes(),
        )
        .unwrap();
        (String::from_utf8(out).unwrap(), n)
    }

    #[test]
    fn replaces_as_str_replace_does_across_chunks() {
        let cases = [
            ("print(1)\n", "1", "42"),
            ("aaaa", "aa", "b"),
            ("abcabcab", "abc", ""),
            ("héllo wörld héllo", "héllo", "ciao"),
            ("no match here", "xyz", "q"),
            ("", "a", "b"),
            ("ééé", "é", "e"),
        ];
        for (text, old, new) in cases {
            for step in [1, 2, 3, 7, 64 * 1024] {
                assert_eq!(
                    replaced(text, old, new, step),
                    (text.replace(old, new), text.matches(old).count() as u64),
                    "{text:?} {old:?} -> {new:?} step {step}"
                );
            }
        }
        let big = "xy".repeat(100_000) + "z";
        assert_eq!(replaced(&big, "yx", "-", 4096).1, 99_999);
    }

    #[test]
    fn refuses_what_is_not_utf8() {
        for data in [&b"ab\xffcd"[..], b"ok \xc3", b"\xe2\x82"] {
            for step in [1, 2, 64] {
                let r = replace_all(Trickle(data, step), io::sink(), b"a", b"b");
                assert!(matches!(r, Err(ReplaceError::NotUtf8)), "{data:?} {step}");
            }
        }
        // A character cut between two reads is fine.
        assert_eq!(replaced("€uro", "uro", "!", 1), ("€!".into(), 1));
    }
}
