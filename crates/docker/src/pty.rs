//! Terminal window sizes: the pty of a `Tty` container's main process or of a `Tty` exec gets
//! the size the client asked for (`ConsoleSize` at create/exec start, `POST .../resize?h=&w=`
//! later) with TIOCSWINSZ on the pty master, so `stty size` or `os.get_terminal_size()` inside
//! report it. A size asked for before the pty exists is kept and applied when it is made.

use std::fs::File;
use std::sync::Mutex;

use agentrun_pool::lock;
use serde_json::Value;

use crate::error::DockerError;
use crate::http::Query;

/// Rows and columns.
type Size = (u16, u16);

/// The pty (master) of one process, once it exists, and the last size asked for.
#[derive(Default)]
pub struct Pty {
    state: Mutex<(Option<File>, Option<Size>)>,
}

impl Pty {
    /// Records `rows` x `cols` and applies it to the pty if there is one.
    pub fn resize(&self, rows: u16, cols: u16) -> std::io::Result<()> {
        let mut st = lock(&self.state);
        st.1 = Some((rows, cols));
        match &st.0 {
            Some(master) => set_size(master, rows, cols),
            None => Ok(()),
        }
    }

    /// The size a `POST .../resize?h=&w=` asks for (400 when it is not one).
    pub fn resize_to_query(&self, query: &Query) -> Result<(), DockerError> {
        let (rows, cols) = query_size(query).map_err(DockerError::bad_request)?;
        self.resize(rows, cols)
            .map_err(|e| DockerError::internal(format!("resizing the tty: {e}")))
    }

    /// The process's pty is `master` (a handle of its own): the recorded size, if any, is
    /// applied now. `None` forgets a pty that is gone.
    pub fn set_master(&self, master: Option<File>) {
        let mut st = lock(&self.state);
        if let (Some(m), Some((rows, cols))) = (&master, st.1) {
            if let Err(e) = set_size(m, rows, cols) {
                tracing::debug!(target: "agentrun::docker", "docker API: resizing the pty: {e}");
            }
        }
        st.0 = master;
    }
}

fn set_size(master: &File, rows: u16, cols: u16) -> std::io::Result<()> {
    agentrun_pool::stdio::set_window_size(master, rows, cols)
}

/// `ConsoleSize: [height, width]` of a create or exec body; `None` when absent or `[0, 0]`.
pub fn console_size(v: &Value) -> Option<(u16, u16)> {
    let a = v.as_array()?;
    let dim = |i: usize| {
        a.get(i)
            .and_then(Value::as_u64)
            .and_then(|n| u16::try_from(n).ok())
    };
    match (dim(0)?, dim(1)?) {
        (0, 0) => None,
        size => Some(size),
    }
}

/// A resize request's `h` or `w` that is missing or not 0..=65535.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid resize {key}: {value:?}")]
pub struct ResizeError {
    pub key: &'static str,
    pub value: String,
}

/// The `h` and `w` of a resize request (both required, 0..=65535), as dockerd checks them.
pub fn query_size(q: &Query) -> Result<(u16, u16), ResizeError> {
    let dim = |key: &'static str| {
        let value = q.get(key).unwrap_or("");
        value.parse::<u16>().map_err(|_| ResizeError {
            key,
            value: value.into(),
        })
    };
    Ok((dim("h")?, dim("w")?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn console_size_parses_height_width() {
        assert_eq!(console_size(&json!([40, 120])), Some((40, 120)));
        assert_eq!(console_size(&json!([0, 0])), None);
        assert_eq!(console_size(&json!(null)), None);
        assert_eq!(console_size(&json!([70000, 1])), None);
    }

    #[test]
    fn resize_query_needs_both_numbers() {
        assert_eq!(query_size(&Query::parse(Some("h=33&w=111"))), Ok((33, 111)));
        assert!(query_size(&Query::parse(Some("h=33"))).is_err());
        assert!(query_size(&Query::parse(Some("h=-1&w=2"))).is_err());
    }

    #[test]
    fn a_size_reaches_the_pty_before_and_after_it_exists() {
        let pty = Pty::default();
        pty.resize(25, 81).unwrap();
        let p = nix::pty::openpty(None, None).unwrap();
        pty.set_master(Some(File::from(p.master)));
        let got = rustix::termios::tcgetwinsize(&p.slave).unwrap();
        assert_eq!((got.ws_row, got.ws_col), (25, 81));
        pty.resize(30, 100).unwrap();
        let got = rustix::termios::tcgetwinsize(&p.slave).unwrap();
        assert_eq!((got.ws_row, got.ws_col), (30, 100));
    }
}
