//! Limits on what unpacking a tar may cost: the store's defence against decompression bombs
//! and archives made to exhaust its disk, its inodes or the importer's memory.
//!
//! Every tar the store unpacks (a layer, an `image import` archive, a build context) is read
//! through a [`TarGuard`], which charges what passes through it to the operation's [`Budget`]:
//! - **bytes**: the uncompressed tar stream, plus the holes of sparse files (which the
//!   unpacker writes as zeros). The layers of one import or pull share one budget, an
//!   archive or a build context has its own; [`UnpackLimits::max_bytes`] bounds each.
//! - **entries**: every tar member, against [`UnpackLimits::max_entries`].
//! - **expansion**: uncompressed bytes per compressed byte read, checked once a stream has
//!   unpacked [`RATIO_FLOOR`] (so small, very compressible layers pass), against
//!   [`UnpackLimits::max_ratio`]: a gzip or zstd bomb is refused after 64 MiB, not after
//!   filling the disk.
//! - **depth**: path components of an entry, against [`UnpackLimits::max_depth`].
//! - **metadata**: the `tar` crate reads GNU long names and PAX headers into memory whole,
//!   whatever size they claim; the guard caps what the parser may read while it looks for
//!   the next entry at [`MAX_METADATA`] past the current entry's end.
//!
//! A refusal is an [`ImageError::Limit`]: one line naming the limit, the value it exceeded
//! and how to raise it. The caller removes whatever the operation had written.

use std::cell::Cell;
use std::io::{self, Read};
use std::path::Path;

use crate::ImageError;

/// A stream's expansion ratio is checked only once it has unpacked this much.
pub const RATIO_FLOOR: u64 = 64 << 20;
/// Most bytes the tar parser may read between two entries (GNU long names, PAX headers, the
/// padding of the previous entry): those are held in memory.
pub const MAX_METADATA: u64 = 1 << 20;

/// How much one unpacking operation may cost. `0` turns a limit off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnpackLimits {
    /// Most bytes an archive or a build context, or the layers of one import or pull
    /// together, may unpack to (default 64 GiB).
    pub max_bytes: u64,
    /// Most tar entries (files, directories, links, ...) one operation may unpack (default
    /// 1,000,000).
    pub max_entries: u64,
    /// Most uncompressed bytes per compressed byte a stream may expand to once it has
    /// unpacked [`RATIO_FLOOR`] (default 100; gzip tops out near 1000, zstd far above).
    pub max_ratio: u64,
    /// Most path components an entry may have (default 128).
    pub max_depth: u64,
}

impl Default for UnpackLimits {
    fn default() -> Self {
        UnpackLimits {
            max_bytes: 64 << 30,
            max_entries: 1_000_000,
            max_ratio: 100,
            max_depth: 128,
        }
    }
}

/// Which limit was hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Bytes,
    Entries,
    Ratio,
    Depth,
    Metadata,
}

impl Limit {
    /// The knob that raises it: (flag, environment variable, `serve --config` key).
    pub fn knobs(self) -> Option<(&'static str, &'static str, &'static str)> {
        match self {
            Limit::Bytes => Some(("--max-bytes", "AGENTRUN_IMAGE_MAX_BYTES", "max_bytes")),
            Limit::Entries => Some(("--max-entries", "AGENTRUN_IMAGE_MAX_ENTRIES", "max_entries")),
            Limit::Ratio => Some(("--max-ratio", "AGENTRUN_IMAGE_MAX_RATIO", "max_ratio")),
            Limit::Depth => Some(("--max-depth", "AGENTRUN_IMAGE_MAX_DEPTH", "max_depth")),
            Limit::Metadata => None,
        }
    }

    /// How to raise it, for the end of an error line.
    pub fn how_to_raise(self) -> String {
        match self.knobs() {
            Some((flag, env, key)) => format!(
                "raise it with {flag} or {env} (serve: image_limits.{key} in --config; 0 turns it off)"
            ),
            None => "a fixed limit".into(),
        }
    }
}

/// Why a tar stream was refused (turned into an [`ImageError::Limit`] by the caller, who
/// knows what the stream was).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    pub limit: Limit,
    pub detail: String,
}

impl Exceeded {
    pub fn into_error(self, what: impl Into<String>) -> ImageError {
        ImageError::Limit {
            what: what.into(),
            limit: self.limit,
            detail: self.detail,
        }
    }
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

/// `b` in the largest of `units` units (each `step` times the last, the first a byte) that it
/// reaches: the value in that unit, and the unit's index.
fn scale(b: u64, step: f64, units: usize) -> (f64, usize) {
    let (mut v, mut u) = (b as f64, 0);
    while v >= step && u + 1 < units {
        v /= step;
        u += 1;
    }
    (v, u)
}

/// `b` bytes as `12.3 MiB`.
pub fn human_size(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (v, u) = scale(b, 1024.0, UNITS.len());
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `bytes` as Docker prints sizes (`docker images`, `docker pull`'s progress: go-units'
/// `HumanSize`): SI units, three significant digits, no trailing zeros (`512B`, `1.98MB`,
/// `4MB`, `52.3MB`).
pub fn docker_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let (v, u) = scale(bytes, 1000.0, UNITS.len());
    let digits = if v < 10.0 {
        2
    } else if v < 100.0 {
        1
    } else {
        0
    };
    let s = format!("{v:.digits$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        &s
    };
    format!("{s}{}", UNITS[u])
}

/// The running totals of one operation (an import, a pull, an archive, a build context).
#[derive(Debug)]
pub struct Budget {
    limits: UnpackLimits,
    bytes: Cell<u64>,
    entries: Cell<u64>,
}

impl Budget {
    pub fn new(limits: UnpackLimits) -> Self {
        Budget {
            limits,
            bytes: Cell::new(0),
            entries: Cell::new(0),
        }
    }

    /// Charges `n` unpacked bytes.
    fn charge_bytes(&self, n: u64) -> Result<(), Exceeded> {
        let total = self.bytes.get().saturating_add(n);
        self.bytes.set(total);
        let max = self.limits.max_bytes;
        if max != 0 && total > max {
            return Err(Exceeded {
                limit: Limit::Bytes,
                detail: format!("unpacks to more than {}, over max_bytes", human_size(max)),
            });
        }
        Ok(())
    }

    /// Counts one tar entry.
    fn charge_entry(&self) -> Result<(), Exceeded> {
        let n = self.entries.get() + 1;
        self.entries.set(n);
        let max = self.limits.max_entries;
        if max != 0 && n > max {
            return Err(Exceeded {
                limit: Limit::Entries,
                detail: format!("has more than {max} entries, over max_entries"),
            });
        }
        Ok(())
    }

    /// Refuses a path deeper than the limit.
    pub fn check_depth(&self, rel: &Path) -> Result<(), Exceeded> {
        let max = self.limits.max_depth;
        let depth = rel
            .components()
            .filter(|c| matches!(c, std::path::Component::Normal(_)))
            .count() as u64;
        if max != 0 && depth > max {
            return Err(Exceeded {
                limit: Limit::Depth,
                detail: format!(
                    "entry {:.60}... is {depth} components deep, over max_depth ({max})",
                    rel.display().to_string()
                ),
            });
        }
        Ok(())
    }
}

/// One tar stream read under a [`Budget`]: [`TarGuard::compressed`] wraps what is read from
/// disk (or the network), [`TarGuard::unpacked`] what the decompressor gives the tar parser.
#[derive(Debug)]
pub struct TarGuard<'b> {
    budget: &'b Budget,
    /// Bytes read from the (possibly compressed) source.
    compressed: Cell<u64>,
    /// Bytes of this stream unpacked (uncompressed stream + sparse holes).
    unpacked: Cell<u64>,
    /// Position in the uncompressed stream.
    pos: Cell<u64>,
    /// While the parser looks for the next entry: the position it may not read past.
    ceiling: Cell<Option<u64>>,
    /// The first limit hit (the parser's own error for it says less).
    exceeded: std::cell::RefCell<Option<Exceeded>>,
}

impl<'b> TarGuard<'b> {
    pub fn new(budget: &'b Budget) -> Self {
        TarGuard {
            budget,
            compressed: Cell::new(0),
            unpacked: Cell::new(0),
            pos: Cell::new(0),
            ceiling: Cell::new(None),
            exceeded: Default::default(),
        }
    }

    /// Counts what is read from the source.
    pub fn compressed<'g, R: Read>(&'g self, inner: R) -> CountingReader<'g, R> {
        CountingReader { guard: self, inner }
    }

    /// Charges what the tar parser reads.
    pub fn unpacked<'g, R: Read>(&'g self, inner: R) -> GuardedReader<'g, R> {
        GuardedReader { guard: self, inner }
    }

    /// The limit that stopped this stream, if one did. Callers check this first when the
    /// parser fails: its error only says that a read failed.
    pub fn exceeded(&self) -> Option<Exceeded> {
        self.exceeded.borrow().clone()
    }

    fn trip(&self, e: Exceeded) -> io::Error {
        let mut slot = self.exceeded.borrow_mut();
        if slot.is_none() {
            *slot = Some(e.clone());
        }
        io::Error::other(e.detail)
    }

    /// Charges `n` bytes unpacked; checks the total and the expansion ratio.
    fn charge(&self, n: u64) -> Result<(), Exceeded> {
        let unpacked = self.unpacked.get().saturating_add(n);
        self.unpacked.set(unpacked);
        self.budget.charge_bytes(n)?;
        let ratio = self.budget.limits.max_ratio;
        let compressed = self.compressed.get().max(1);
        if ratio != 0 && unpacked > RATIO_FLOOR && unpacked / compressed > ratio {
            return Err(Exceeded {
                limit: Limit::Ratio,
                detail: format!(
                    "expands more than {ratio} times ({} from {} compressed: a decompression bomb?), over max_ratio",
                    human_size(unpacked),
                    human_size(compressed)
                ),
            });
        }
        Ok(())
    }

    /// Charges bytes written that were not in the stream (the holes of a sparse file).
    pub fn charge_written(&self, n: u64) -> io::Result<()> {
        self.charge(n).map_err(|e| self.trip(e))
    }

    /// The next entry of `entries`, counted, with the parser kept from reading more than
    /// [`MAX_METADATA`] past the previous entry's end. The caller must have read (or
    /// drained, see [`drain`]) the previous entry.
    pub fn next_entry<'a, R: Read + 'a>(
        &self,
        entries: &mut tar::Entries<'a, R>,
    ) -> Option<Result<tar::Entry<'a, R>, TarError>> {
        // The previous entry was read to its end: at most its padding (511 bytes) is left.
        self.ceiling
            .set(Some(self.pos.get() + 511 + MAX_METADATA + 512));
        let next = entries.next();
        self.ceiling.set(None);
        let entry = match next? {
            Ok(e) => e,
            Err(e) => return Some(Err(self.error(e))),
        };
        if let Err(e) = self.budget.charge_entry() {
            // Not a dropped failure: trip records the limit, which the next line returns.
            let _ = self.trip(e);
            return Some(Err(TarError::Limit(self.exceeded().expect("tripped"))));
        }
        Some(Ok(entry))
    }

    /// `e` from the parser or an entry's reader, as what really happened.
    pub fn error(&self, e: io::Error) -> TarError {
        match self.exceeded() {
            Some(x) => TarError::Limit(x),
            None => TarError::Io(e),
        }
    }
}

/// What reading a guarded tar stream failed with.
#[derive(Debug)]
pub enum TarError {
    /// A limit was hit.
    Limit(Exceeded),
    /// The stream is not a valid tar (or could not be read).
    Io(io::Error),
}

/// A writer that refuses to take more than `max_bytes` (0: no limit): for layer tars the
/// store is handed to write (a build's COPY/ADD and RUN layers, `image add`).
pub struct CappedWriter<'a> {
    inner: &'a mut dyn io::Write,
    written: u64,
    max: u64,
    over: &'a Cell<bool>,
}

impl<'a> CappedWriter<'a> {
    /// `over` is set when the cap is hit (the error the writer returns may be wrapped).
    pub fn new(inner: &'a mut dyn io::Write, max: u64, over: &'a Cell<bool>) -> Self {
        CappedWriter {
            inner,
            written: 0,
            max,
            over,
        }
    }

    /// What hitting the cap means.
    pub fn exceeded(max: u64) -> Exceeded {
        Exceeded {
            limit: Limit::Bytes,
            detail: format!("is larger than {}, over max_bytes", human_size(max)),
        }
    }
}

impl io::Write for CappedWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let total = self.written.saturating_add(buf.len() as u64);
        if self.max != 0 && total > self.max {
            self.over.set(true);
            return Err(io::Error::other(Self::exceeded(self.max).detail));
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Reads what is left of an entry (directories, links and whiteouts may carry data).
pub fn drain<R: Read>(entry: &mut R) -> io::Result<u64> {
    io::copy(entry, &mut io::sink())
}

/// Counts the compressed bytes read.
pub struct CountingReader<'b, R> {
    guard: &'b TarGuard<'b>,
    inner: R,
}

impl<R: Read> Read for CountingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let c = &self.guard.compressed;
        c.set(c.get() + n as u64);
        Ok(n)
    }
}

/// Charges every uncompressed byte to the guard, and holds the parser to its ceiling.
pub struct GuardedReader<'b, R> {
    guard: &'b TarGuard<'b>,
    inner: R,
}

impl<R: Read> Read for GuardedReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let g = self.guard;
        if let Some(e) = g.exceeded() {
            return Err(io::Error::other(e.detail));
        }
        let mut want = buf.len();
        if let Some(ceiling) = g.ceiling.get() {
            let room = ceiling.saturating_sub(g.pos.get());
            if room == 0 {
                return Err(g.trip(Exceeded {
                    limit: Limit::Metadata,
                    detail: format!(
                        "a tar header (GNU long name or PAX) is larger than {}, which would be held in memory",
                        human_size(MAX_METADATA)
                    ),
                }));
            }
            want = want.min(usize::try_from(room).unwrap_or(usize::MAX));
        }
        let n = self.inner.read(&mut buf[..want])?;
        g.pos.set(g.pos.get() + n as u64);
        g.charge(n as u64).map_err(|e| g.trip(e))?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_sizes_read_like_docker() {
        assert_eq!(docker_size(512), "512B");
        assert_eq!(docker_size(1_984_449), "1.98MB");
        assert_eq!(docker_size(4_000_000), "4MB");
        assert_eq!(docker_size(52_300_000), "52.3MB");
        assert_eq!(docker_size(523_000_000), "523MB");
    }

    fn tar_of(entries: &[(&str, usize)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, len) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(*len as u64);
            b.append_data(&mut h, name, &vec![0u8; *len][..]).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// Reads every entry of `bytes` under `limits`, as the unpackers do.
    fn read_all(bytes: &[u8], limits: UnpackLimits) -> Result<usize, TarError> {
        let budget = Budget::new(limits);
        let guard = TarGuard::new(&budget);
        let mut archive = tar::Archive::new(guard.unpacked(guard.compressed(bytes)));
        let mut entries = archive.entries().map_err(TarError::Io)?;
        let mut n = 0;
        while let Some(e) = guard.next_entry(&mut entries) {
            let mut e = e?;
            drain(&mut e).map_err(|e| guard.error(e))?;
            n += 1;
        }
        Ok(n)
    }

    #[test]
    fn entries_and_bytes_are_counted() {
        let tar = tar_of(&[("a", 10), ("b", 2000), ("c", 0)]);
        assert_eq!(read_all(&tar, UnpackLimits::default()).unwrap(), 3);
        let few = UnpackLimits {
            max_entries: 2,
            ..Default::default()
        };
        match read_all(&tar, few) {
            Err(TarError::Limit(e)) => assert_eq!(e.limit, Limit::Entries),
            other => panic!("{other:?}"),
        }
        let small = UnpackLimits {
            max_bytes: 2048,
            ..Default::default()
        };
        match read_all(&tar, small) {
            Err(TarError::Limit(e)) => {
                assert_eq!(e.limit, Limit::Bytes);
                assert!(e.detail.contains("2.0 KiB"), "{}", e.detail);
            }
            other => panic!("{other:?}"),
        }
        // 0: no limit.
        let off = UnpackLimits {
            max_bytes: 0,
            max_entries: 0,
            ..Default::default()
        };
        assert_eq!(read_all(&tar, off).unwrap(), 3);
    }

    #[test]
    fn a_huge_long_name_is_refused_before_it_is_read() {
        // A GNU long-name member claiming (and holding) 8 MiB: the parser would keep it all.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(8 << 20);
        h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
        h.set_cksum();
        b.append(&h, io::repeat(b'a').take(8 << 20)).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(0);
        b.append_data(&mut h, "short", &[][..]).unwrap();
        let tar = b.into_inner().unwrap();
        match read_all(&tar, UnpackLimits::default()) {
            Err(TarError::Limit(e)) => assert_eq!(e.limit, Limit::Metadata, "{e}"),
            other => panic!("{other:?}"),
        }
        // A long name of a sane length is fine.
        let long = "d/".repeat(200) + "f";
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(1);
        b.append_data(&mut h, &long, &b"x"[..]).unwrap();
        assert_eq!(
            read_all(&b.into_inner().unwrap(), UnpackLimits::default()).unwrap(),
            1
        );
    }

    #[test]
    fn depth_is_checked() {
        let b = Budget::new(UnpackLimits {
            max_depth: 3,
            ..Default::default()
        });
        assert!(b.check_depth(Path::new("a/b/c")).is_ok());
        let e = b.check_depth(Path::new("a/b/c/d")).unwrap_err();
        assert_eq!(e.limit, Limit::Depth);
    }
}
