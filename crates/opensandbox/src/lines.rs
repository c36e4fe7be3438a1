//! Process output as execd keeps it: split into lines (one stream event per line), and kept
//! in a bounded log per command.

use std::collections::VecDeque;

/// The longest line kept whole: a longer run of bytes without a newline is cut into lines of
/// this size, so output without newlines cannot grow a buffer without bound.
pub const MAX_LINE: usize = 64 * 1024;

/// Accumulates bytes; yields complete lines without their `\n` / `\r\n`.
#[derive(Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
}

/// The text of one line as execd sends it: a blank line is `"\n"`.
fn text(mut line: Vec<u8>) -> String {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    if line.is_empty() {
        "\n".into()
    } else {
        String::from_utf8_lossy(&line).into_owned()
    }
}

impl LineSplitter {
    /// Adds `data`; returns the lines it completed.
    pub fn push(&mut self, data: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
            let rest = self.buf.split_off(i + 1);
            let mut line = std::mem::replace(&mut self.buf, rest);
            line.pop();
            out.push(text(line));
        }
        while self.buf.len() >= MAX_LINE {
            let rest = self.buf.split_off(MAX_LINE);
            out.push(text(std::mem::replace(&mut self.buf, rest)));
        }
        out
    }

    /// What is left without a final newline.
    pub fn finish(&mut self) -> Option<String> {
        if self.buf.is_empty() {
            None
        } else {
            Some(text(std::mem::take(&mut self.buf)))
        }
    }
}

/// A command's output lines with absolute numbers (the logs API's cursor), bounded in bytes:
/// when full, the oldest lines go and the cursor of what is left does not change.
pub struct LineLog {
    /// Number of the first kept line (how many were dropped).
    first: usize,
    lines: VecDeque<String>,
    bytes: usize,
    cap_bytes: usize,
}

impl Default for LineLog {
    fn default() -> Self {
        Self::with_cap(LOG_CAP_BYTES)
    }
}

/// What one command's log keeps by default (the newest lines).
pub const LOG_CAP_BYTES: usize = 8 * 1024 * 1024;

impl LineLog {
    pub fn with_cap(cap_bytes: usize) -> Self {
        Self {
            first: 0,
            lines: VecDeque::new(),
            bytes: 0,
            cap_bytes,
        }
    }

    pub fn push(&mut self, line: String) {
        self.bytes += line.len() + 1;
        self.lines.push_back(line);
        while self.bytes > self.cap_bytes && self.lines.len() > 1 {
            if let Some(old) = self.lines.pop_front() {
                self.bytes -= old.len() + 1;
                self.first += 1;
            }
        }
    }

    /// The cursor after the last line (lines ever pushed).
    pub fn end(&self) -> usize {
        self.first + self.lines.len()
    }

    /// The kept lines numbered `cursor` and later (from the oldest kept if `cursor` is older).
    pub fn since(&self, cursor: usize) -> impl Iterator<Item = &String> {
        self.lines.iter().skip(cursor.saturating_sub(self.first))
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
    }

    #[test]
    fn log_drops_oldest_and_keeps_cursors() {
        let mut log = LineLog::with_cap(10);
        for l in ["aaa", "bbb", "ccc", "ddd"] {
            log.push(l.into());
        }
        // 4 bytes a line: two fit in 10.
        assert_eq!(log.end(), 4);
        assert_eq!(log.since(0).collect::<Vec<_>>(), ["ccc", "ddd"]);
        assert_eq!(log.since(3).collect::<Vec<_>>(), ["ddd"]);
        assert_eq!(log.since(4).count(), 0);
        assert_eq!(log.since(9).count(), 0);
    }
}
