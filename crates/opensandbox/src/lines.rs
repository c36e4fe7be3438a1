//! Process output as execd keeps it, in bounded memory: read from a pipe and split into lines
//! ([`PipeLines`]; one stream event per line), and kept in a bounded log per command
//! ([`LineLog`]) whose bytes also count against its sandbox's [`LogBudget`].

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use agentrun_pool::stdio::StdioStream;
use tokio::io::AsyncReadExt;

/// The longest line kept whole: a longer run of bytes without a newline is cut into lines of
/// this size, so output without newlines cannot grow a buffer without bound.
pub const MAX_LINE: usize = 64 * 1024;

/// Accumulates bytes; yields complete lines without their `\n` / `\r\n`.
#[derive(Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
}

/// The text of one line as execd sends it: a blank line is `"\n"`.
fn text(line: &[u8]) -> String {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        "\n".into()
    } else {
        String::from_utf8_lossy(line).into_owned()
    }
}

impl LineSplitter {
    /// Adds `data`; returns the lines it completed.
    pub fn push(&mut self, data: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        let mut start = 0;
        loop {
            let rest = &self.buf[start..];
            match memchr::memchr(b'\n', &rest[..rest.len().min(MAX_LINE + 1)]) {
                Some(i) if i <= MAX_LINE => {
                    out.push(text(&rest[..i]));
                    start += i + 1;
                }
                _ if rest.len() >= MAX_LINE => {
                    out.push(text(&rest[..MAX_LINE]));
                    start += MAX_LINE;
                }
                _ => break,
            }
        }
        self.buf.drain(..start);
        out
    }

    /// What is left without a final newline.
    pub fn finish(&mut self) -> Option<String> {
        if self.buf.is_empty() {
            None
        } else {
            let l = text(&self.buf);
            self.buf.clear();
            Some(l)
        }
    }
}

/// The lines of a pipe (a process's stdout or stderr), read only as fast as they are asked
/// for: whoever stops asking stops reading, and the process writing blocks once the pipe is
/// full (backpressure). What is held between two calls is at most one read (16 KiB) and one
/// partial line ([`MAX_LINE`]).
pub struct PipeLines {
    rx: Option<StdioStream>,
    split: LineSplitter,
    ready: VecDeque<String>,
    buf: Box<[u8]>,
}

impl PipeLines {
    pub fn new(fd: OwnedFd) -> Self {
        PipeLines {
            rx: StdioStream::new(fd).ok(),
            split: LineSplitter::default(),
            ready: VecDeque::new(),
            buf: vec![0u8; 16 * 1024].into_boxed_slice(),
        }
    }

    /// Whether a line can come without waiting for the writer: one is split already, or the
    /// pipe holds bytes (asked of the kernel, not of the reactor, which may not have looked
    /// yet).
    pub fn has_pending(&self) -> bool {
        !self.ready.is_empty() || self.rx.as_ref().is_some_and(StdioStream::has_pending)
    }

    /// The next line; `None` at EOF. Cancel-safe (no line is lost if the future is dropped).
    pub async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(l) = self.ready.pop_front() {
                return Some(l);
            }
            let rx = self.rx.as_mut()?;
            // A pipe that never runs dry (`yes`) is always ready: give the other pipes their
            // turn after every read, not after tokio's budget of 128 (~2 MiB of lines each),
            // so one sandbox's flood does not hold up another's output for seconds.
            tokio::task::yield_now().await;
            match rx.read(&mut self.buf).await {
                Ok(0) | Err(_) => {
                    self.rx = None;
                    return self.split.finish();
                }
                Ok(n) => self.ready.extend(self.split.push(&self.buf[..n])),
            }
        }
    }
}

/// Bytes of command output one sandbox keeps in all its command logs together: when a push
/// would go over, the oldest finished commands are forgotten first (see
/// `execd::commands`, which keeps each line), then the pushing log drops its own oldest lines.
pub const SANDBOX_LOG_BUDGET: usize = 64 * 1024 * 1024;

/// The log bytes of one sandbox, shared by its commands' logs.
#[derive(Debug)]
pub struct LogBudget {
    used: AtomicUsize,
    cap: usize,
}

impl Default for LogBudget {
    fn default() -> Self {
        Self::with_cap(SANDBOX_LOG_BUDGET)
    }
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

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// What one command's log keeps at most (the newest lines).
pub const LOG_CAP_BYTES: usize = 8 * 1024 * 1024;

/// What one kept line costs besides its text: its length in the index.
const LINE_COST: usize = std::mem::size_of::<u32>();

/// A command's output lines with absolute numbers (the logs API's cursor), bounded in bytes
/// (text plus [`LINE_COST`] a line, against its own cap and its sandbox's [`LogBudget`]): when
/// full, the oldest lines go and the cursor of what is left does not change. The text is one
/// ring of bytes and an index of line lengths, so a line costs its text and 4 bytes, however
/// short it is.
pub struct LineLog {
    /// Number of the first kept line (how many were dropped).
    first: usize,
    text: VecDeque<u8>,
    lens: VecDeque<u32>,
    cap_bytes: usize,
    budget: Arc<LogBudget>,
}

impl Default for LineLog {
    fn default() -> Self {
        Self::new(LOG_CAP_BYTES, Arc::new(LogBudget::default()))
    }
}

impl Drop for LineLog {
    fn drop(&mut self) {
        self.budget.sub(self.bytes());
    }
}

impl LineLog {
    pub fn new(cap_bytes: usize, budget: Arc<LogBudget>) -> Self {
        Self {
            first: 0,
            text: VecDeque::new(),
            lens: VecDeque::new(),
            cap_bytes,
            budget,
        }
    }

    /// What `line` will cost in a log.
    pub fn cost(line: &str) -> usize {
        line.len() + LINE_COST
    }

    /// Bytes this log holds (as counted against its caps).
    pub fn bytes(&self) -> usize {
        self.text.len() + self.lens.len() * LINE_COST
    }

    /// Adds a line, first dropping the oldest ones it would not fit with (never going over,
    /// even for a moment: the ring's capacity stays within its cap's next power of two).
    pub fn push(&mut self, line: &str) {
        let cost = Self::cost(line);
        while self.bytes() + cost > self.cap_bytes || self.budget.would_exceed(cost) {
            let Some(n) = self.lens.pop_front() else {
                break; // the new line alone: kept whatever it costs
            };
            self.text.drain(..n as usize);
            self.budget.sub(n as usize + LINE_COST);
            self.first += 1;
        }
        self.text.extend(line.as_bytes());
        self.lens.push_back(line.len() as u32);
        self.budget.add(cost);
    }

    /// The cursor after the last line (lines ever pushed).
    pub fn end(&self) -> usize {
        self.first + self.lens.len()
    }

    /// The kept lines numbered `cursor` and later (from the oldest kept if `cursor` is older),
    /// each followed by `\n` (a blank line, kept as `"\n"`, is just its `\n`), as the logs API
    /// answers them.
    pub fn text_since(&self, cursor: usize) -> Vec<u8> {
        let skip = cursor.saturating_sub(self.first).min(self.lens.len());
        let start: usize = self.lens.iter().take(skip).map(|n| *n as usize).sum();
        let mut out = Vec::with_capacity(self.text.len() - start + self.lens.len() - skip);
        let mut at = start;
        for n in self.lens.iter().skip(skip) {
            let n = *n as usize;
            let line = self.text.range(at..at + n);
            if !(n == 1 && self.text[at] == b'\n') {
                out.extend(line);
            }
            out.push(b'\n');
            at += n;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_lines_across_chunks() {
        let mut s = LineSplitter::default();
        assert_eq!(s.push(b"he"), Vec::<String>::new());
        assert_eq!(s.push(b"llo\r\n\nwor"), vec!["hello", "\n"]);
        assert_eq!(s.push(b"ld\nx"), vec!["world"]);
        assert_eq!(s.finish().as_deref(), Some("x"));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn cuts_lines_without_newline() {
        let mut s = LineSplitter::default();
        let lines = s.push(&vec![b'a'; 2 * MAX_LINE + 5]);
        assert_eq!(lines.len(), 2);
        assert!(lines.iter().all(|l| l.len() == MAX_LINE));
        assert_eq!(s.finish().map(|l| l.len()), Some(5));
        // A newline right after MAX_LINE bytes ends that (full) line, and nothing more.
        let mut data = vec![b'b'; MAX_LINE];
        data.extend_from_slice(b"\nc\n");
        assert_eq!(
            s.push(&data).iter().map(String::len).collect::<Vec<_>>(),
            [MAX_LINE, 1]
        );
    }

    fn log_with(cap: usize, budget: &Arc<LogBudget>) -> LineLog {
        LineLog::new(cap, budget.clone())
    }

    #[test]
    fn log_drops_oldest_and_keeps_cursors() {
        let budget = Arc::new(LogBudget::default());
        let mut log = log_with(15, &budget);
        for l in ["aaa", "bbb", "\n", "ddd"] {
            log.push(l);
        }
        // 3 + 4 bytes a line (1 + 4 for the blank one): the last two fit in 15, not three.
        assert_eq!(log.end(), 4);
        assert_eq!(log.text_since(0), b"\nddd\n");
        assert_eq!(log.text_since(3), b"ddd\n");
        assert_eq!(log.text_since(4), b"");
        assert_eq!(log.text_since(9), b"");
        assert_eq!(budget.used(), 5 + 7);
        drop(log);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_sandbox_budget_bounds_every_log_together() {
        let budget = Arc::new(LogBudget::with_cap(40));
        let mut a = log_with(1000, &budget);
        let mut b = log_with(1000, &budget);
        for i in 0..100 {
            a.push(&format!("a{i:04}"));
            b.push(&format!("b{i:04}"));
            assert!(budget.used() <= 40 + 9, "{}", budget.used());
        }
        // Each keeps its newest line at least.
        assert!(a.text_since(0).ends_with(b"a0099\n"));
        assert!(b.text_since(0).ends_with(b"b0099\n"));
        // Full (two lines of each), and nothing beyond.
        assert_eq!(budget.used(), 36);
        drop((a, b));
        assert_eq!(budget.used(), 0);
    }
}
