//! runc's logging contract: with `--log FILE --log-format json` errors are appended to FILE as
//! `{"level":"error","msg":...,"time":...}` lines (containerd's shim reads the last one to say
//! why a command failed); without `--log` they go to stderr as logrus text lines.
//! Either way the bare message is also printed on stderr, as runc does.
//!
//! libcontainer reports the detail of a failure (which file, which syscall) through `tracing`
//! only; [`Logger::install`] routes its events, error level (debug with `--debug`), into the
//! same log, as runc-style lines written before agentrun's own final error line (the one the
//! shim reports). Only events of the agentrun process itself are written: libcontainer's
//! cloned children run on after fds are closed and the root is pivoted, where the log path
//! means something else.

use std::io::Write;
use std::path::PathBuf;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Where and how errors are logged.
#[derive(Debug, Clone, Default)]
pub struct Logger {
    pub file: Option<PathBuf>,
    pub json: bool,
    /// `--debug`: libcontainer's debug events too.
    pub debug: bool,
}

impl Logger {
    /// Makes this logger the process's `tracing` subscriber (libcontainer's events).
    pub fn install(&self) {
        let sub = EventLog {
            logger: self.clone(),
            pid: std::process::id(),
            max: if self.debug {
                Level::DEBUG
            } else {
                Level::ERROR
            },
        };
        let _ = tracing::subscriber::set_global_default(sub);
    }

    /// Logs `msg` at error level.
    pub fn error(&self, msg: &str) {
        self.write("error", msg, true);
    }

    /// Writes one line at `level`; `echo`: also the bare message on stderr (with `--log`).
    fn write(&self, level: &str, msg: &str, echo: bool) {
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let line = if self.json {
            serde_json::json!({"level": level, "msg": msg, "time": time}).to_string()
        } else {
            format!("time={time:?} level={level} msg={msg:?}")
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
                if echo {
                    eprintln!("{msg}");
                }
            }
            None => eprintln!("{line}"),
        }
    }
}

/// The first error libcontainer reported through `tracing` in this process (the closest to
/// the cause; later ones are the same failure propagating up).
static FIRST_DETAIL: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// The first error-level detail libcontainer logged, to complete its terse final errors
/// ("failed to create container: io error").
pub fn first_detail() -> Option<String> {
    FIRST_DETAIL.lock().ok().and_then(|d| d.clone())
}

/// A `tracing` subscriber writing events (no spans) through a [`Logger`].
struct EventLog {
    logger: Logger,
    /// The agentrun process; events of other processes (libcontainer's clones) are dropped.
    pid: u32,
    max: Level,
}

/// Collects an event's message and fields into one line.
#[derive(Default)]
struct Line {
    message: String,
    fields: Vec<String>,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.fields.push(format!("{}={value:?}", field.name()));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.fields.push(format!("{}={value:?}", field.name()));
        }
    }
}

impl Subscriber for EventLog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && *metadata.level() <= self.max
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if std::process::id() != self.pid {
            return;
        }
        let mut line = Line::default();
        event.record(&mut line);
        let mut msg = line.message;
        for f in line.fields {
            msg.push(' ');
            msg.push_str(&f);
        }
        let level = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            _ => "debug",
        };
        let msg = crate::cli::one_line(&msg);
        if level == "error" {
            if let Ok(mut d) = FIRST_DETAIL.lock() {
                d.get_or_insert_with(|| msg.clone());
            }
        }
        // libcontainer's errors are details of the error agentrun reports last: not echoed.
        self.logger.write(level, &msg, false);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
