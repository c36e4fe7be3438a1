//! File contents in bounded memory: the line range of a download (`offset`/`limit`) and the
//! search and replace of `/files/replace`, both as a stream from a reader to a writer, so a
//! sandbox's 1 TiB (sparse) file costs the daemon a buffer, not its size.

use std::io::{self, BufRead, Read, Write};

/// Bytes read at a time.
const CHUNK: usize = 64 * 1024;

/// Copies lines `skip` (0-based) to `skip + take - 1` of `r` to `w` as execd's line reading
/// (a Go `bufio.Scanner` of lines) returns them: each line without its `\n` and without a
/// `\r` just before it (or before the end of the file), joined by `\n`, with no newline after
/// the last; a file ending with `\n` has no empty line after it. Bytes, not text; a line
/// longer than memory is streamed as it is read (execd gives up on lines over 1 MiB).
pub fn copy_lines(mut r: impl BufRead, mut w: impl Write, skip: u64, take: u64) -> io::Result<()> {
    let end = skip.saturating_add(take);
    // The line being read (0-based), whether any of it has been seen, and whether a `\r`
    // of it is held back until the next byte says whether it ends the line.
    let mut line = 0u64;
    let mut started = false;
    let mut held_cr = false;
    while line < end {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        let mut used = 0;
        while used < buf.len() && line < end {
            let rest = &buf[used..];
            let (text, newline) = match memchr::memchr(b'\n', rest) {
                Some(i) => (&rest[..i], true),
                None => (rest, false),
            };
            used += text.len() + usize::from(newline);
            if line >= skip {
                if !started && line > skip {
                    w.write_all(b"\n")?;
                }
                if held_cr && !text.is_empty() {
                    w.write_all(b"\r")?;
                }
                held_cr = false;
                match text.split_last() {
                    // A `\r` at the end of what is read so far: it goes if a `\n` or the end
                    // of the file follows, so it is held until the next byte says.
                    Some((b'\r', head)) => {
                        w.write_all(head)?;
                        held_cr = !newline;
                    }
                    _ => w.write_all(text)?,
                }
            }
            started = !newline;
            if newline {
                line += 1;
            }
        }
        r.consume(used);
    }
    w.flush()
}

/// A download's `offset` or `limit` that is not a whole number from 1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid query parameter '{name}': {value}")]
pub struct LineWindowError {
    pub name: &'static str,
    pub value: String,
}

/// The line window of a download's `offset` and `limit` query values, as execd reads them:
/// `None` when both are absent or empty (the whole file, as bytes); otherwise the lines to
/// skip and to take. Each must be a whole number from 1 (`+` allowed, as Go's `ParseInt`);
/// the error names the value.
pub fn line_window(
    offset: Option<&str>,
    limit: Option<&str>,
) -> Result<Option<(u64, u64)>, LineWindowError> {
    let offset = offset.filter(|v| !v.is_empty());
    let limit = limit.filter(|v| !v.is_empty());
    if offset.is_none() && limit.is_none() {
        return Ok(None);
    }
    let parse = |name: &'static str, v: Option<&str>| {
        v.map(|v| {
            v.parse::<i64>()
                .ok()
                .filter(|n| *n >= 1)
                .map(|n| n as u64)
                .ok_or_else(|| LineWindowError {
                    name,
                    value: v.into(),
                })
        })
        .transpose()
    };
    let offset = parse("offset", offset)?.unwrap_or(1);
    let limit = parse("limit", limit)?.unwrap_or(u64::MAX);
    Ok(Some((offset - 1, limit)))
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

    /// What a download with these `offset`/`limit` values returns, read `step` bytes at a time.
    fn lines(text: &[u8], offset: Option<&str>, limit: Option<&str>, step: usize) -> Vec<u8> {
        let (skip, take) = line_window(offset, limit).unwrap().unwrap();
        let mut out = Vec::new();
        copy_lines(
            io::BufReader::with_capacity(step, text),
            &mut out,
            skip,
            take,
        )
        .unwrap();
        out
    }

    #[test]
    fn line_windows_as_execd_reads_them() {
        let five = &b"line1\nline2\nline3\nline4\nline5"[..];
        // (file, offset, limit, body)
        type Case<'a> = (&'a [u8], Option<&'a str>, Option<&'a str>, &'a [u8]);
        let cases: &[Case] = &[
            (five, Some("2"), Some("2"), b"line2\nline3"),
            (five, Some("4"), None, b"line4\nline5"),
            (five, None, Some("2"), b"line1\nline2"),
            (five, Some("1"), None, b"line1\nline2\nline3\nline4\nline5"),
            (five, Some("+2"), Some("1"), b"line2"),
            (five, Some("5"), Some("9"), b"line5"),
            (five, Some("6"), None, b""),
            (five, Some("100"), Some("1"), b""),
            (five, Some(""), Some("1"), b"line1"),
            // A final newline ends the last line: no empty line after it.
            (b"a\nb\n", None, Some("9"), b"a\nb"),
            (b"a\nb\n", Some("3"), None, b""),
            // Empty lines are lines.
            (b"a\n\n\nb", Some("2"), Some("2"), b"\n"),
            (b"\n", Some("1"), None, b""),
            (b"\n\n", Some("1"), None, b"\n"),
            (b"", Some("1"), Some("1"), b""),
            // CRLF: the \r before a \n (or before the end) goes, any other stays.
            (b"a\r\nb\r\nc\r", Some("1"), None, b"a\nb\nc"),
            (b"a\r\r\nb\rc\n", Some("1"), None, b"a\r\nb\rc"),
            (b"\r\n\r", Some("1"), None, b"\n"),
            (b"\r", Some("1"), None, b""),
            // Bytes as they are, UTF-8 or not.
            (b"\xff\xfe\nx\n", None, Some("1"), b"\xff\xfe"),
            ("é\nü".as_bytes(), Some("2"), None, "ü".as_bytes()),
        ];
        for &(text, offset, limit, want) in cases {
            for step in [1, 2, 3, 64 * 1024] {
                assert_eq!(
                    lines(text, offset, limit, step),
                    want,
                    "{text:?} offset {offset:?} limit {limit:?} step {step}"
                );
            }
        }
        // A line far longer than a read is streamed whole.
        let long = [vec![b'x'; 200_000], b"\r\nend".to_vec()].concat();
        assert_eq!(lines(&long, None, Some("1"), 4096), vec![b'x'; 200_000]);
        assert_eq!(lines(&long, Some("2"), None, 4096), b"end");
    }

    #[test]
    fn line_window_values() {
        assert_eq!(line_window(None, None), Ok(None));
        assert_eq!(line_window(Some(""), Some("")), Ok(None));
        assert_eq!(line_window(Some("3"), None), Ok(Some((2, u64::MAX))));
        assert_eq!(line_window(None, Some("4")), Ok(Some((0, 4))));
        for (o, l, name) in [
            (Some("0"), None, "offset"),
            (Some("-1"), None, "offset"),
            (Some("abc"), Some("1"), "offset"),
            (Some("1.5"), None, "offset"),
            (Some("99999999999999999999"), None, "offset"),
            (None, Some("0"), "limit"),
            (None, Some("-3"), "limit"),
            (Some("2"), Some("x"), "limit"),
        ] {
            let e = line_window(o, l).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("invalid query parameter '{name}': ")),
                "{e}"
            );
        }
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
