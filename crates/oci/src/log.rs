//! runc's logging contract: with `--log FILE --log-format json` errors are appended to FILE as
//! `{"level":"error","msg":...,"time":...}` lines (containerd's shim reads the last one to say
//! why a command failed); without `--log` they go to stderr as logrus text lines.
//! Either way the bare message is also printed on stderr, as runc does.

use std::io::Write;
use std::path::PathBuf;

/// Where and how errors are logged.
#[derive(Debug, Clone, Default)]
pub struct Logger {
    pub file: Option<PathBuf>,
    pub json: bool,
}

impl Logger {
    /// Logs `msg` at error level.
    pub fn error(&self, msg: &str) {
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let line = if self.json {
            serde_json::json!({"level": "error", "msg": msg, "time": time}).to_string()
        } else {
            format!("time={time:?} level=error msg={msg:?}")
        };
        match &self.file {
            Some(path) => {
                let written = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .and_then(|mut f| writeln!(f, "{line}"));
                if written.is_err() {
                    eprintln!("{line}");
                }
                eprintln!("{msg}");
            }
            None => eprintln!("{line}"),
        }
    }
}
