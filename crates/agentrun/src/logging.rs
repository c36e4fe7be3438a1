//! The process's one `tracing` subscriber, set up here and nowhere else.
//!
//! Diagnostics of the daemons and libraries are `tracing` events with targets
//! `agentrun::<crate>` (`agentrun::pool`, `agentrun::serve`, `agentrun::docker`, ...); they go
//! to stderr, filtered by `AGENTRUN_LOG` (`tracing_subscriber::EnvFilter` syntax: a level,
//! `target=level` pairs, e.g. `AGENTRUN_LOG=agentrun::pool=debug,libcontainer=debug`).
//!
//! Unset, the daemon (`agentrun serve`) writes `agentrun=info` and each line reads
//! `agentrun: <message>`, as it printed before there was a filter; other commands write none.
//! Set, each line also says when, at what level and from which target. The OCI runtime
//! commands (runc's command line) write no diagnostics by default either (runc's contract:
//! errors go to its log, [`agentrun_oci::LogLayer`], which is added to the same subscriber).
//!
//! User-facing results and one-line errors of the CLI are not diagnostics: they stay plain
//! `eprintln!`/`println!` in the commands.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// The filter's environment variable.
pub const ENV: &str = "AGENTRUN_LOG";

/// Which command line the process runs, and so what stderr gets when [`ENV`] is unset.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The daemon (`agentrun serve`): `agentrun: <message>` lines of `agentrun=info`.
    Daemon,
    /// Another agentrun command: nothing, and no subscriber at all (see [`init`]).
    Command,
    /// runc's command line: stderr is runc's log's (see [`agentrun_oci::LogLayer`]).
    OciRuntime,
}

/// Installs the subscriber: stderr diagnostics per [`ENV`] and `mode`, plus `runc_log` (the
/// OCI runtime commands' log) if given. Called once, early in `main`. With nothing to write
/// (a command other than `serve`, [`ENV`] unset) no subscriber is installed: setting one up
/// costs ~0.05 ms (release build), which every `agentrun exec` would pay for no line.
pub fn init(mode: Mode, runc_log: Option<agentrun_oci::LogLayer>) {
    let configured = std::env::var(ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .or_else(docker_trace_filter);
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = Vec::new();
    match (&configured, mode) {
        (Some(spec), _) => layers.push(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(EnvFilter::builder().parse_lossy(spec))
                .boxed(),
        ),
        // Unset: `agentrun=info`, the daemon's lines as they always were.
        (None, Mode::Daemon) => layers.push(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .event_format(Plain)
                .with_filter(Targets::new().with_target("agentrun", Level::INFO))
                .boxed(),
        ),
        (None, Mode::Command | Mode::OciRuntime) => {}
    }
    layers.extend(runc_log);
    if layers.is_empty() {
        return;
    }
    use tracing_subscriber::layer::SubscriberExt;
    // Fails only if a subscriber is set already (a second call): that one logs.
    let _ = tracing::subscriber::set_global_default(Registry::default().with(layers));
}

/// `AGENTRUN_DOCKER_TRACE=1` (the Docker API's request trace before there was a filter) still
/// works where `AGENTRUN_LOG` is unset: it is that filter's `agentrun::docker::http=debug`.
fn docker_trace_filter() -> Option<String> {
    (std::env::var("AGENTRUN_DOCKER_TRACE").ok().as_deref() == Some("1"))
        .then(|| "agentrun=info,agentrun::docker::http=debug".to_string())
}

/// `agentrun: <message> <fields>`: the line the daemons have always printed.
struct Plain;

impl<S, N> FormatEvent<S, N> for Plain
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        writer.write_str("agentrun: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}
