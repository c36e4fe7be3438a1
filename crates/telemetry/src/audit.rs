//! The append-only audit log: one JSON line per run and per policy decision.
//!
//! Files live in one directory: `audit.jsonl` (current) and `audit.jsonl.1` .. `.N` (older,
//! rotated by size). Every [`AuditLog::append`] takes an exclusive `flock` on `audit.lock`
//! (several agentrun processes write at once), rotates if the current file is full, writes
//! the record with a single `write(2)` on an `O_APPEND` descriptor and `fdatasync`s it before
//! returning: once `append` has returned `Ok`, a crash does not lose the record. A crash in
//! the middle of a write can leave a torn last line; readers skip lines that do not parse.
//! [`AuditLog::append_written`] skips the `fdatasync` (the record is in the file, and outlives
//! the process, but reaches the disk with the next `append`): a run's decisions made before
//! its sandbox exists are written that way and made durable by the run's own record.

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

/// Current file name.
const CURRENT: &str = "audit.jsonl";
/// Default rotation threshold.
pub const DEFAULT_MAX_BYTES: u64 = 16 << 20;
/// Rotated files kept (`audit.jsonl.1` newest .. `.N` oldest).
pub const DEFAULT_KEEP: usize = 5;

/// How far an append goes before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// Written and `fdatasync`ed.
    Synced,
    /// Written (in the page cache).
    Written,
}

/// Errors writing or reading the audit log.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("audit log: cannot encode record: {0}")]
    Encode(#[from] serde_json::Error),
}

fn io(path: &Path, source: std::io::Error) -> AuditError {
    AuditError::Io {
        path: path.to_owned(),
        source,
    }
}

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AuditRecord {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    /// `decision`, `run`, `policy` (an egress policy change), `error` (a connection the
    /// policy allowed that could not be made), `snapshot` (a sandbox's files kept) or
    /// `restore` (a sandbox made from a snapshot).
    pub kind: String,
    pub sandbox_id: String,
    pub trace_id: String,
    /// `fs.read`, `net.connect`, ... for decisions; `exec` for runs.
    pub action: String,
    /// The path, `host:port`, variable or command line.
    pub resource: String,
    /// `allow` / `deny` / `escalate` (decisions), `ok` / `error` (runs), `error` (errors).
    pub decision: String,
    /// How an `escalate` decision ended: `approved`, `denied`, `timeout`, `no_approver`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub escalation: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rule: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Exit code of a run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<i32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub profile: String,
}

impl AuditRecord {
    /// When it was written.
    pub fn timestamp(&self) -> Option<DateTime<Utc>> {
        DateTime::parse_from_rfc3339(&self.time)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    }

    /// A decision that refused its action: a deny, or an escalate nobody approved.
    pub fn refused(&self) -> bool {
        self.kind == "decision"
            && (self.decision == "deny"
                || (self.decision == "escalate" && self.escalation != "approved"))
    }
}

/// Which records [`AuditLog::query`] returns: every filter set must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// At or after.
    pub since: Option<DateTime<Utc>>,
    /// At or before.
    pub until: Option<DateTime<Utc>>,
    /// `decision`, `run`, `policy`, `error`.
    pub kind: Option<String>,
    /// `allow`, `deny`, `escalate`, `ok`, `error`.
    pub decision: Option<String>,
    /// Only refused decisions ([`AuditRecord::refused`]).
    pub refused: bool,
    /// This sandbox id.
    pub sandbox: Option<String>,
    /// This rule id.
    pub rule: Option<String>,
    /// This trace id.
    pub trace: Option<String>,
    /// A piece of the action, resource or reason (case-insensitive).
    pub text: Option<String>,
    /// At most this many, the newest (0: no limit).
    pub limit: usize,
}

impl AuditQuery {
    /// `found` (oldest first) without all but the newest [`AuditQuery::limit`].
    fn keep_newest(&self, mut found: Vec<AuditRecord>) -> Vec<AuditRecord> {
        if self.limit > 0 && found.len() > self.limit {
            found.drain(..found.len() - self.limit);
        }
        found
    }

    /// Whether `r` passes every filter set.
    pub fn matches(&self, r: &AuditRecord) -> bool {
        let same = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        if !(same(&self.kind, &r.kind)
            && same(&self.decision, &r.decision)
            && same(&self.sandbox, &r.sandbox_id)
            && same(&self.rule, &r.rule)
            && same(&self.trace, &r.trace_id))
        {
            return false;
        }
        if self.refused && !r.refused() {
            return false;
        }
        if self.since.is_some() || self.until.is_some() {
            let Some(t) = r.timestamp() else {
                return false;
            };
            if self.since.is_some_and(|s| t < s) || self.until.is_some_and(|u| t > u) {
                return false;
            }
        }
        match &self.text {
            Some(text) => {
                let text = text.to_lowercase();
                [&r.action, &r.resource, &r.reason]
                    .iter()
                    .any(|f| f.to_lowercase().contains(&text))
            }
            None => true,
        }
    }
}

/// The current time as an audit timestamp.
pub fn now_rfc3339() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// An audit log directory.
#[derive(Debug, Clone)]
pub struct AuditLog {
    dir: PathBuf,
    max_bytes: u64,
    keep: usize,
}

impl AuditLog {
    /// The log in `dir` (created on first append, mode 0700), rotated at
    /// [`DEFAULT_MAX_BYTES`], keeping [`DEFAULT_KEEP`] old files.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        AuditLog {
            dir: dir.into(),
            max_bytes: DEFAULT_MAX_BYTES,
            keep: DEFAULT_KEEP,
        }
    }

    /// Changes the rotation threshold and how many rotated files are kept (at least 1).
    pub fn with_rotation(mut self, max_bytes: u64, keep: usize) -> Self {
        self.max_bytes = max_bytes.max(1);
        self.keep = keep.max(1);
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends `record` durably (see the module doc). Fills in `time` if it is empty.
    pub fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        self.append_as(record, Durability::Synced)
    }

    /// Appends `record` without waiting for the disk: it is in the file when this returns
    /// (readers see it, and it outlives this process), and on disk once a later [`append`]
    /// of this log returns (its `fdatasync` flushes the file's earlier writes too). For the
    /// records of a run held until its sandbox exists, which its run record then makes
    /// durable: one disk flush per run on the start path instead of one per record.
    ///
    /// [`append`]: AuditLog::append
    pub fn append_written(&self, record: &AuditRecord) -> Result<(), AuditError> {
        self.append_as(record, Durability::Written)
    }

    fn append_as(&self, record: &AuditRecord, durability: Durability) -> Result<(), AuditError> {
        let mut record = record.clone();
        if record.time.is_empty() {
            record.time = now_rfc3339();
        }
        let mut line = serde_json::to_vec(&record)?;
        line.push(b'\n');
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| io(&self.dir, e))?;
        let lock_path = self.dir.join("audit.lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| io(&lock_path, e))?;
        // SAFETY: flock on an fd we own; released when `lock` is closed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io(&lock_path, std::io::Error::last_os_error()));
        }
        let current = self.dir.join(CURRENT);
        let size = fs::metadata(&current).map(|m| m.len()).unwrap_or(0);
        if size > 0 && size + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .mode(0o600)
            .open(&current)
            .map_err(|e| io(&current, e))?;
        // A torn last line (a crash mid-write) must not swallow this record.
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len > 0 {
            let mut last = [0u8; 1];
            if std::os::unix::fs::FileExt::read_at(&f, &mut last, len - 1).is_ok()
                && last[0] != b'\n'
            {
                line.insert(0, b'\n');
            }
        }
        f.write_all(&line).map_err(|e| io(&current, e))?;
        if durability == Durability::Synced {
            f.sync_data().map_err(|e| io(&current, e))?;
        }
        Ok(())
    }

    /// Shifts `audit.jsonl` -> `.1` -> `.2` ..., dropping the oldest. Caller holds the lock.
    fn rotate(&self) -> Result<(), AuditError> {
        let name = |n: usize| self.dir.join(format!("{CURRENT}.{n}"));
        // Absent until the log has rotated `keep` times.
        let _ = fs::remove_file(name(self.keep));
        for n in (1..self.keep).rev() {
            let from = name(n);
            if from.exists() {
                fs::rename(&from, name(n + 1)).map_err(|e| io(&from, e))?;
            }
        }
        let current = self.dir.join(CURRENT);
        // Records appended without a flush (`append_written`) go to disk with the file they
        // are in: the next flush is of the new file.
        if let Ok(f) = File::open(&current) {
            // Durability only: the records are written; a failed sync leaves them to the page cache.
            let _ = f.sync_data();
        }
        fs::rename(&current, name(1)).map_err(|e| io(&current, e))?;
        // Make the renames durable before new records land in a fresh file.
        if let Ok(d) = File::open(&self.dir) {
            // Durability only: the renames are done; a failed sync leaves them to the page cache.
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// The records `q` selects, oldest first (the newest `q.limit` of them when it is set).
    pub fn query(&self, q: &AuditQuery) -> Result<Vec<AuditRecord>, AuditError> {
        let mut out: Vec<AuditRecord> = Vec::new();
        self.each(|r| {
            if q.matches(&r) {
                out.push(r);
            }
        })?;
        Ok(q.keep_newest(out))
    }

    /// The records `q` selects among those of the current file that fit in its last
    /// `max_bytes`, oldest first (the newest `q.limit` of them when it is set): what a live
    /// view polls, without reading the whole log each time.
    pub fn recent(&self, max_bytes: u64, q: &AuditQuery) -> Result<Vec<AuditRecord>, AuditError> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.dir.join(CURRENT);
        let mut f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&path, e)),
        };
        let len = f.metadata().map_err(|e| io(&path, e))?.len();
        let start = len.saturating_sub(max_bytes);
        f.seek(SeekFrom::Start(start)).map_err(|e| io(&path, e))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).map_err(|e| io(&path, e))?;
        // A start inside a line: that line's tail is not a record.
        let body = if start > 0 {
            match buf.iter().position(|b| *b == b'\n') {
                Some(i) => &buf[i + 1..],
                None => &[][..],
            }
        } else {
            &buf[..]
        };
        let found = body
            .split(|b| *b == b'\n')
            .filter_map(|line| serde_json::from_slice::<AuditRecord>(line).ok())
            .filter(|r| q.matches(r))
            .collect();
        Ok(q.keep_newest(found))
    }

    /// Every record, oldest first (rotated files, then the current one). Lines that do not
    /// parse (a torn last write) are skipped.
    pub fn read_all(&self) -> Result<Vec<AuditRecord>, AuditError> {
        let mut out = Vec::new();
        self.each(|r| out.push(r))?;
        Ok(out)
    }

    /// Calls `f` with every record, oldest first.
    fn each(&self, mut f: impl FnMut(AuditRecord)) -> Result<(), AuditError> {
        let mut files: Vec<PathBuf> = (1..=self.keep.max(64))
            .map(|n| self.dir.join(format!("{CURRENT}.{n}")))
            .filter(|p| p.exists())
            .collect();
        files.reverse();
        files.push(self.dir.join(CURRENT));
        for path in files {
            let file = match File::open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(&path, e)),
            };
            for line in BufReader::new(file).lines() {
                let line = line.map_err(|e| io(&path, e))?;
                if let Ok(r) = serde_json::from_str::<AuditRecord>(&line) {
                    f(r);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: usize) -> AuditRecord {
        AuditRecord {
            kind: "decision".into(),
            sandbox_id: format!("ar-{i}"),
            action: "net.connect".into(),
            resource: "evil.example:443".into(),
            decision: "deny".into(),
            rule: "network.default".into(),
            ..Default::default()
        }
    }

    #[test]
    fn query_filters_and_keeps_the_newest() {
        let dir = tmp();
        let log = AuditLog::new(&dir);
        for i in 0..10 {
            let mut r = rec(i);
            if i % 2 == 0 {
                r.decision = "allow".into();
                r.rule = "network.allow".into();
                r.resource = "pypi.org:443".into();
            }
            log.append(&r).unwrap();
        }
        let denied = log
            .query(&AuditQuery {
                decision: Some("deny".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(denied.len(), 5);
        assert!(denied.iter().all(AuditRecord::refused));
        let newest = log
            .query(&AuditQuery {
                refused: true,
                limit: 2,
                ..Default::default()
            })
            .unwrap();
        let ids: Vec<_> = newest.iter().map(|r| r.sandbox_id.as_str()).collect();
        assert_eq!(ids, ["ar-7", "ar-9"]);
        let text = log
            .query(&AuditQuery {
                text: Some("PYPI".into()),
                sandbox: Some("ar-4".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(text.len(), 1);
        assert_eq!(text[0].rule, "network.allow");
        let future = log
            .query(&AuditQuery {
                since: Some(Utc::now() + chrono::Duration::hours(1)),
                ..Default::default()
            })
            .unwrap();
        assert!(future.is_empty());
        // The tail: whole records only, oldest first.
        let all = log.read_all().unwrap();
        let line = serde_json::to_string(&all[9]).unwrap().len() as u64 + 1;
        let any = AuditQuery::default();
        let tail = log.recent(line * 3 + line / 2, &any).unwrap();
        assert_eq!(tail, all[7..].to_vec());
        assert_eq!(log.recent(1 << 20, &any).unwrap(), all);
        let refused = AuditQuery {
            refused: true,
            limit: 2,
            ..Default::default()
        };
        assert_eq!(
            log.recent(1 << 20, &refused).unwrap(),
            [all[7].clone(), all[9].clone()]
        );
        let _ = fs::remove_dir_all(&dir);
        assert!(AuditLog::new(&dir).recent(100, &any).unwrap().is_empty());
    }

    /// Appends records 0 to `n` - 1 to `log`.
    fn append(log: &AuditLog, n: usize) {
        for i in 0..n {
            log.append(&rec(i)).unwrap();
        }
    }

    fn tmp() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "agentrun-audit-test-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn rand_suffix() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    }

    #[test]
    fn append_and_read_back_in_order() {
        let dir = tmp();
        let log = AuditLog::new(&dir);
        append(&log, 3);
        let all = log.read_all().unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[2].sandbox_id, "ar-2");
        assert!(all[0].timestamp().is_some(), "{}", all[0].time);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn written_records_are_read_back_at_once_and_in_order_with_synced_ones() {
        let dir = tmp();
        let log = AuditLog::new(&dir).with_rotation(300, 3);
        for i in 0..10 {
            if i % 3 == 2 {
                log.append(&rec(i)).unwrap();
            } else {
                log.append_written(&rec(i)).unwrap();
            }
            let all = log.read_all().unwrap();
            assert_eq!(all.last().unwrap().sandbox_id, format!("ar-{i}"));
        }
        let all = log.read_all().unwrap();
        let ids: Vec<&str> = all.iter().map(|r| r.sandbox_id.as_str()).collect();
        let want: Vec<String> = (10 - ids.len()..10).map(|i| format!("ar-{i}")).collect();
        assert_eq!(ids, want, "newest records kept, in order, across rotations");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rotates_by_size_and_keeps_order() {
        let dir = tmp();
        let log = AuditLog::new(&dir).with_rotation(300, 3);
        append(&log, 20);
        assert!(dir.join("audit.jsonl.1").exists());
        assert!(
            !dir.join("audit.jsonl.4").exists(),
            "only 3 rotated files kept"
        );
        for f in fs::read_dir(&dir).unwrap() {
            let f = f.unwrap();
            if f.file_name().to_string_lossy().starts_with("audit.jsonl") {
                assert!(f.metadata().unwrap().len() <= 300, "{:?}", f.file_name());
            }
        }
        let all = log.read_all().unwrap();
        let ids: Vec<usize> = all
            .iter()
            .map(|r| r.sandbox_id[3..].parse().unwrap())
            .collect();
        assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
        assert_eq!(*ids.last().unwrap(), 19);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn torn_line_is_skipped() {
        let dir = tmp();
        let log = AuditLog::new(&dir);
        log.append(&rec(0)).unwrap();
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join(CURRENT))
            .unwrap();
        f.write_all(b"{\"time\":\"2026-").unwrap();
        drop(f);
        assert_eq!(log.read_all().unwrap().len(), 1);
        log.append(&rec(1)).unwrap();
        assert_eq!(
            log.read_all().unwrap().len(),
            2,
            "a record after a torn line is kept"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
