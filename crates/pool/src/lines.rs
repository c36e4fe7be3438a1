//! A process's output as lines, in bounded memory: bytes split into lines
//! ([`LineSplitter`], a line never longer than [`MAX_LINE`]) and a pipe read line by line
//! only as fast as the lines are asked for ([`PipeLines`]). The API front ends read their
//! processes' output with these (the OpenSandbox API streams a line per event; the MCP tools
//! and the Python code contexts read the driver's lines).

use std::collections::VecDeque;
use std::os::fd::OwnedFd;

use tokio::io::AsyncReadExt;

use crate::stdio::StdioStream;

/// The longest line kept whole: a longer run of bytes without a newline is cut into lines of
/// this size, so output without newlines cannot grow a buffer without bound.
pub const MAX_LINE: usize = 64 * 1024;

/// Accumulates bytes; yields complete lines without their `\n` / `\r\n`.
#[derive(Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
}

/// The text of one line, as the OpenSandbox execd sends it: a blank line is `"\n"`.
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
}
