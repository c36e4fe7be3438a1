//! Splitting process output into the lines execd streams (one event per line).

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
}
