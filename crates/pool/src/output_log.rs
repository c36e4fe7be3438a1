//! The newest output of a process, kept in bounded memory for the API front ends' logs (a
//! Docker container's `logs`, an OpenSandbox command's): an [`OutputLog`] of entries (a chunk
//! or a line, with its stream) numbered from the first ever pushed, the oldest dropped first
//! while the log would go over its cap in bytes or its [`LogBudget`] (bytes that several logs
//! share: one sandbox's). Its text is one ring of bytes and an index of entry lengths, so an
//! entry costs its bytes and [`ENTRY_COST`], however short it is, and keeping one or dropping
//! the oldest costs its bytes, not the log's.

use std::collections::{vec_deque, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// What one kept entry costs besides its bytes: its slot in the index.
pub const ENTRY_COST: usize = std::mem::size_of::<Entry>();

/// The longest entry: of a longer one, only its last `MAX_ENTRY` bytes are kept (a log's cap
/// is far below anyway).
pub const MAX_ENTRY: usize = (1 << LEN_BITS) - 1;

/// Bits of an [`Entry`] that hold its length; the two above hold its stream.
const LEN_BITS: u32 = 30;

/// One entry of the index: its length (the low [`LEN_BITS`] bits) and its stream (the top
/// two: 0 to 3; the front ends use 1 for stdout, 2 for stderr).
#[derive(Debug, Clone, Copy)]
struct Entry(u32);

impl Entry {
    fn new(stream: u8, len: usize) -> Entry {
        debug_assert!(stream < 4 && len <= MAX_ENTRY);
        Entry((u32::from(stream & 3) << LEN_BITS) | len as u32)
    }

    fn len(self) -> usize {
        (self.0 & MAX_ENTRY as u32) as usize
    }

    fn stream(self) -> u8 {
        (self.0 >> LEN_BITS) as u8
    }
}

/// The log bytes several logs share (one sandbox's command logs): each log counts its bytes
/// here, and makes room in itself before it would go over.
#[derive(Debug)]
pub struct LogBudget {
    used: AtomicUsize,
    cap: usize,
}

impl LogBudget {
    pub fn with_cap(cap: usize) -> Self {
        LogBudget {
            used: AtomicUsize::new(0),
            cap,
        }
    }

    /// Would `more` bytes go over the budget?
    pub fn would_exceed(&self, more: usize) -> bool {
        self.used.load(Ordering::Relaxed).saturating_add(more) > self.cap
    }

    fn add(&self, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    fn sub(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }

    /// Bytes the logs hold together.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// A process's newest output: entries `(stream, bytes)` with absolute numbers (a cursor that
/// does not change when older entries go), at most `cap` bytes counting [`ENTRY_COST`] an
/// entry, and within its [`LogBudget`] if it has one.
#[derive(Debug)]
pub struct OutputLog {
    /// Number of the first kept entry (how many were dropped).
    first: usize,
    text: VecDeque<u8>,
    index: VecDeque<Entry>,
    cap: usize,
    budget: Option<Arc<LogBudget>>,
}

impl Drop for OutputLog {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.sub(self.bytes());
        }
    }
}

impl OutputLog {
    /// A log of at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        OutputLog {
            first: 0,
            text: VecDeque::new(),
            index: VecDeque::new(),
            cap,
            budget: None,
        }
    }

    /// A log of at most `cap` bytes whose bytes also count against `budget`.
    pub fn with_budget(cap: usize, budget: Arc<LogBudget>) -> Self {
        let mut log = OutputLog::new(cap);
        log.budget = Some(budget);
        log
    }

    /// What an entry of `len` bytes costs in a log.
    pub fn cost(len: usize) -> usize {
        len.min(MAX_ENTRY) + ENTRY_COST
    }

    /// Bytes this log holds, as counted against its cap and budget.
    pub fn bytes(&self) -> usize {
        self.text.len() + self.index.len() * ENTRY_COST
    }

    /// Keeps `data` as the newest entry of `stream`, first dropping the oldest entries it does
    /// not fit with (so the log never goes over its cap or budget, even for a moment, and the
    /// ring's capacity stays within its cap's next power of two). The newest entry alone is
    /// kept whatever it costs.
    pub fn push(&mut self, stream: u8, data: &[u8]) {
        let data = &data[data.len().saturating_sub(MAX_ENTRY)..];
        let cost = Self::cost(data.len());
        while self.bytes() + cost > self.cap
            || self.budget.as_ref().is_some_and(|b| b.would_exceed(cost))
        {
            let Some(oldest) = self.index.pop_front() else {
                break; // the new entry alone
            };
            self.text.drain(..oldest.len());
            if let Some(b) = &self.budget {
                b.sub(oldest.len() + ENTRY_COST);
            }
            self.first += 1;
        }
        self.text.extend(data);
        self.index.push_back(Entry::new(stream, data.len()));
        if let Some(b) = &self.budget {
            b.add(cost);
        }
    }

    /// The cursor after the newest entry (entries ever pushed).
    pub fn end(&self) -> usize {
        self.first + self.index.len()
    }

    /// The kept entries numbered `cursor` and later (from the oldest kept if `cursor` is
    /// older), oldest first, as `(stream, bytes)`.
    pub fn since(&self, cursor: usize) -> impl Iterator<Item = (u8, vec_deque::Iter<'_, u8>)> {
        let skip = cursor.saturating_sub(self.first).min(self.index.len());
        let mut at: usize = self.index.iter().take(skip).map(|e| e.len()).sum();
        self.index.iter().skip(skip).map(move |e| {
            let bytes = self.text.range(at..at + e.len());
            at += e.len();
            (e.stream(), bytes)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(log: &OutputLog, cursor: usize) -> Vec<(u8, Vec<u8>)> {
        log.since(cursor)
            .map(|(s, b)| (s, b.copied().collect()))
            .collect()
    }

    #[test]
    fn keeps_the_newest_within_the_cap() {
        let mut log = OutputLog::new(3 * (10 + ENTRY_COST));
        for i in 0..5u8 {
            log.push(1 + i % 2, &[b'a' + i; 10]);
        }
        let kept = entries(&log, 0);
        assert_eq!(kept.len(), 3);
        assert_eq!(kept[0], (1, vec![b'c'; 10]));
        assert_eq!(kept[1], (2, vec![b'd'; 10]));
        assert_eq!(kept[2], (1, vec![b'e'; 10]));
        assert_eq!(log.bytes(), 3 * (10 + ENTRY_COST));
        assert_eq!(log.end(), 5);
    }

    #[test]
    fn one_byte_entries_count_their_cost() {
        let mut log = OutputLog::new(1000);
        for _ in 0..10_000 {
            log.push(1, b"x");
        }
        assert_eq!(log.since(0).count(), 1000 / (1 + ENTRY_COST));
        assert!(log.bytes() <= 1000);
    }

    #[test]
    fn an_entry_over_the_cap_is_kept_alone() {
        let mut log = OutputLog::new(100);
        log.push(1, b"small");
        log.push(2, &[0u8; 200]);
        assert_eq!(entries(&log, 0), vec![(2, vec![0u8; 200])]);
        log.push(1, b"next");
        assert_eq!(entries(&log, 0), vec![(1, b"next".to_vec())]);
    }

    #[test]
    fn drops_the_oldest_and_keeps_cursors() {
        let budget = Arc::new(LogBudget::with_cap(usize::MAX));
        let mut log = OutputLog::with_budget(15, budget.clone());
        for l in ["aaa", "bbb", "\n", "ddd"] {
            log.push(1, l.as_bytes());
        }
        // 3 + 4 bytes an entry (1 + 4 for "\n"): the last two fit in 15, not three.
        assert_eq!(log.end(), 4);
        assert_eq!(
            entries(&log, 0),
            vec![(1, b"\n".to_vec()), (1, b"ddd".to_vec())]
        );
        assert_eq!(entries(&log, 3), vec![(1, b"ddd".to_vec())]);
        assert!(entries(&log, 4).is_empty());
        assert!(entries(&log, 9).is_empty());
        assert_eq!(budget.used(), 5 + 7);
        drop(log);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_budget_bounds_every_log_together() {
        let budget = Arc::new(LogBudget::with_cap(40));
        let mut a = OutputLog::with_budget(1000, budget.clone());
        let mut b = OutputLog::with_budget(1000, budget.clone());
        for i in 0..100 {
            a.push(1, format!("a{i:04}").as_bytes());
            b.push(2, format!("b{i:04}").as_bytes());
            assert!(budget.used() <= 40 + 9, "{}", budget.used());
        }
        // Each keeps its newest entry at least.
        assert_eq!(entries(&a, 0).last(), Some(&(1, b"a0099".to_vec())));
        assert_eq!(entries(&b, 0).last(), Some(&(2, b"b0099".to_vec())));
        // Full (two entries of each), and nothing beyond.
        assert_eq!(budget.used(), 36);
        drop((a, b));
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn an_entry_keeps_its_stream_and_length() {
        for (stream, len) in [(0, 0), (1, 7), (2, MAX_ENTRY), (3, 1 << 20)] {
            let e = Entry::new(stream, len);
            assert_eq!((e.stream(), e.len()), (stream, len));
        }
        assert_eq!(ENTRY_COST, 4);
    }
}
