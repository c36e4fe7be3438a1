//! The output kept per container for `logs` and `attach?logs=1`: the newest chunks, capped in
//! bytes, oldest dropped first (a ring of chunks: adding one and dropping the oldest are O(1)).

use std::collections::VecDeque;

use bytes::Bytes;

/// Output kept per container (older output is dropped first).
pub const OUTPUT_LOG_CAP: usize = 8 * 1024 * 1024;

/// What a kept chunk costs besides its bytes (its entry and allocation), counted against the
/// cap: a process writing a byte at a time cannot make 8 MiB of log cost 500 MiB.
pub const CHUNK_COST: usize = 64;

/// Chunks of output as `(stream, bytes)` (1 stdout, 2 stderr), at most `cap` bytes counting
/// [`CHUNK_COST`] per chunk.
#[derive(Debug)]
pub struct OutputLog {
    chunks: VecDeque<(u8, Bytes)>,
    cost: usize,
    cap: usize,
}

impl Default for OutputLog {
    fn default() -> Self {
        OutputLog::with_cap(OUTPUT_LOG_CAP)
    }
}

impl OutputLog {
    pub fn with_cap(cap: usize) -> Self {
        OutputLog {
            chunks: VecDeque::new(),
            cost: 0,
            cap,
        }
    }

    /// Keeps a chunk, dropping the oldest ones while the log is over its cap (a chunk larger
    /// than the cap on its own is not kept either).
    pub fn push(&mut self, stream: u8, data: Bytes) {
        self.cost += data.len() + CHUNK_COST;
        self.chunks.push_back((stream, data));
        while self.cost > self.cap {
            let Some((_, oldest)) = self.chunks.pop_front() else {
                break;
            };
            self.cost -= oldest.len() + CHUNK_COST;
        }
    }

    /// A copy of what is kept, oldest first (the bytes are shared, not copied).
    pub fn snapshot(&self) -> Vec<(u8, Bytes)> {
        self.chunks.iter().cloned().collect()
    }

    /// What the kept chunks cost against the cap.
    pub fn cost(&self) -> usize {
        self.cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_within_the_cap() {
        let mut log = OutputLog::with_cap(3 * (10 + CHUNK_COST));
        for i in 0..5u8 {
            log.push(1 + i % 2, Bytes::from(vec![b'a' + i; 10]));
        }
        let kept = log.snapshot();
        assert_eq!(kept.len(), 3);
        assert_eq!(kept[0], (1, Bytes::from(vec![b'c'; 10])));
        assert_eq!(kept[2], (1, Bytes::from(vec![b'e'; 10])));
        assert_eq!(log.cost(), 3 * (10 + CHUNK_COST));
    }

    #[test]
    fn one_byte_chunks_count_their_cost() {
        let mut log = OutputLog::with_cap(1000);
        for _ in 0..10_000 {
            log.push(1, Bytes::from_static(b"x"));
        }
        assert_eq!(log.snapshot().len(), 1000 / (1 + CHUNK_COST));
        assert!(log.cost() <= 1000);
    }

    #[test]
    fn a_chunk_over_the_cap_is_not_kept() {
        let mut log = OutputLog::with_cap(100);
        log.push(1, Bytes::from_static(b"small"));
        log.push(2, Bytes::from(vec![0u8; 200]));
        assert!(log.snapshot().is_empty());
        assert_eq!(log.cost(), 0);
    }
}
