//! The process's one `tracing` subscriber, set up here and nowhere else.
//!
//! Diagnostics of the daemons and libraries are `tracing` events with targets
//! `agentrun::<crate>` (`agentrun::pool`, `agentrun::serve`, `agentrun::docker`, ...); they go
//! to stderr, filtered by `AGENTRUN_LOG` (`tracing_subscriber::EnvFilter` syntax: a level,
//! `target=level` pairs, e.g. `AGENTRUN_LOG=agentrun::pool=debug,libcontainer=debug`).
//!
//! Unset, the filter is `agentrun=info` and each line reads `agentrun: <message>`, as the
//! daemons printed before there was a filter. Set, each line also says when, at what level and
//! from which target. The OCI runtime commands (runc's command line) default to no stderr
//! diagnostics at all (runc's contract: errors go to its log, [`agentrun_oci::LogLayer`], which
//! is added to the same subscriber).
//!
//! User-facing results and one-line errors of the CLI are not diagnostics: they stay plain
//! `eprintln!`/`println!` in the commands.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// The filter's environment variable.
pub const ENV: &str = "AGENTRUN_LOG";
/// The filter when [`ENV`] is unset, for agentrun's own commands.
const DEFAULT: &str = "agentrun=info";

/// Which command line the process runs: the OCI runtime's keeps stderr for runc's log.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Agentrun,
    OciRuntime,
}

/// Installs the subscriber: stderr diagnostics per [`ENV`], plus `runc_log` (the OCI runtime
/// commands' log) if given. Called once, early in `main`.
pub fn init(mode: Mode, runc_log: Option<agentrun_oci::LogLayer>) {
    let configured = std::env::var(ENV).ok().filter(|v| !v.trim().is_empty());
    let stderr = match &configured {
        Some(spec) => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(EnvFilter::builder().parse_lossy(spec))
            .boxed(),
        None => {
            let default = match mode {
                Mode::Agentrun => DEFAULT,
                Mode::OciRuntime => "off",
            };
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .event_format(Plain)
                .with_filter(EnvFilter::new(default))
                .boxed()
        }
    };
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![stderr];
    layers.extend(runc_log);
    use tracing_subscriber::layer::SubscriberExt;
    let _ = tracing::subscriber::set_global_default(Registry::default().with(layers));
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
