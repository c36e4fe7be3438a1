//! runc's logging contract: with `--log FILE --log-format json` errors are appended to FILE as
//! `{"level":"error","msg":...,"time":...}` lines (containerd's shim reads the last one to say
//! why a command failed); without `--log` they go to stderr as logrus text lines.
//! Either way the bare message is also printed on stderr, as runc does.
//!
//! libcontainer reports the detail of a failure (which file, which syscall, which errno)
//! through `tracing` only, and mostly from the processes it clones: the intermediate process
//! and the container's init, which send the agentrun process no more than their top-level
//! error ("failed syscall", "failed to prepare rootfs"). [`Logger::layer`] routes the events
//! of the agentrun process itself (error level; debug with `--debug`) into the log directly.
//! The cloned processes cannot write there (the root is pivoted, the log path means something
//! else, stderr may be the container's terminal), so they append their events to a memfd
//! inherited from the agentrun process (libcontainer clones without exec; the memfd is
//! close-on-exec, so the container's process never holds it), and
//! [`Logger::relay_children`] copies them into the log after libcontainer returns. The first
//! error of a child is the closest to the cause, and [`first_detail`] prefers it: it completes
//! the final error line the shim reports (e.g. "... failed syscall (failed to drop
//! capabilities: EPERM: Operation not permitted)").

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::{Context, Layer};

/// Where and how errors are logged.
#[derive(Debug, Clone, Default)]
pub struct Logger {
    pub file: Option<PathBuf>,
    pub json: bool,
    /// `--debug`: libcontainer's debug events too.
    pub debug: bool,
}

impl Logger {
    /// The `tracing` layer that writes libcontainer's events through this logger (error level;
    /// debug with `--debug`). The binary adds it to the process's one subscriber.
    pub fn layer(&self) -> crate::LogLayer {
        // Set once per process; a second logger shares the first one's file.
        let _ = CHILD_LOG.set(child_log());
        let max = if self.debug {
            Level::DEBUG
        } else {
            Level::ERROR
        };
        let log = RuncLog {
            logger: self.clone(),
            pid: std::process::id(),
        };
        // Events, and `enabled!` hints (libcontainer asks before computing some debug lines,
        // e.g. the "affinity: 0x..." of `execCPUAffinity`); spans are not recorded. A filter of
        // this layer only: the process's other layers keep their own.
        log.with_filter(filter_fn(move |m: &Metadata<'_>| {
            !m.is_span() && *m.level() <= max
        }))
        .boxed()
    }

    /// Logs `msg` at error level.
    pub fn error(&self, msg: &str) {
        self.write("error", msg, true);
    }

    /// Copies the events libcontainer's cloned processes left since the last call into the
    /// log (call it when libcontainer returns, whether it failed or not).
    pub fn relay_children(&self) {
        let Some(Some(fd)) = CHILD_LOG.get() else {
            return;
        };
        let Ok(mut offset) = CHILD_LOG_READ.lock() else {
            return;
        };
        let mut text = Vec::new();
        let mut buf = [0u8; 8192];
        while let Ok(n) = nix::sys::uio::pread(fd.as_fd(), &mut buf, *offset) {
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
            *offset += n as i64;
        }
        for line in String::from_utf8_lossy(&text).lines() {
            let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let level = event["level"].as_str().unwrap_or("debug");
            let msg = event["msg"].as_str().unwrap_or_default();
            if level == "error" {
                if let Ok(mut d) = CHILD_DETAIL.lock() {
                    d.get_or_insert_with(|| msg.to_owned());
                }
            }
            self.write(level, msg, false);
        }
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
static FIRST_DETAIL: Mutex<Option<String>> = Mutex::new(None);
/// The first error a cloned process reported (it failed before this process noticed).
static CHILD_DETAIL: Mutex<Option<String>> = Mutex::new(None);
/// The memfd the cloned processes append their events to (`None`: it could not be made).
static CHILD_LOG: OnceLock<Option<OwnedFd>> = OnceLock::new();
/// How far [`Logger::relay_children`] has read it.
static CHILD_LOG_READ: Mutex<i64> = Mutex::new(0);

/// The first error-level detail libcontainer logged, a cloned process's first, to complete
/// its terse final errors ("failed to create container: io error").
pub fn first_detail() -> Option<String> {
    let child = CHILD_DETAIL.lock().ok().and_then(|d| d.clone());
    child.or_else(|| FIRST_DETAIL.lock().ok().and_then(|d| d.clone()))
}

/// A close-on-exec memfd in append mode (each event one `write`, so events of concurrent
/// processes do not interleave).
fn child_log() -> Option<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    let fd = memfd_create(c"agentrun-oci-log", MemFdCreateFlag::MFD_CLOEXEC).ok()?;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_APPEND)).ok()?;
    Some(fd)
}

/// A `tracing` layer writing events (no spans) through a [`Logger`]: runc's log of an OCI
/// runtime command.
struct RuncLog {
    logger: Logger,
    /// The agentrun process; events of other processes (libcontainer's clones) are dropped.
    pid: u32,
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

impl<S: Subscriber> Layer<S> for RuncLog {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let own = std::process::id() == self.pid;
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
        let msg = one_line(&msg);
        if !own {
            // A process libcontainer cloned: leave the event for the agentrun process.
            if let Some(Some(fd)) = CHILD_LOG.get() {
                let mut line = serde_json::json!({"level": level, "msg": msg}).to_string();
                line.push('\n');
                // A log line that cannot be written has nowhere else to go.
                let _ = nix::unistd::write(fd, line.as_bytes());
            }
            return;
        }
        if level == "error" {
            if let Ok(mut d) = FIRST_DETAIL.lock() {
                d.get_or_insert_with(|| msg.clone());
            }
        }
        // libcontainer's errors are details of the error agentrun reports last: not echoed.
        self.logger.write(level, &msg, false);
    }
}

/// Errors are logged on one line.
pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
