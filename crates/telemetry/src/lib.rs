//! OpenTelemetry export for agentrun.
//!
//! agentrun records one span per sandbox run (`sandbox.exec`, built by [`ExecSpan`]), with one child span per policy
//! decision (`policy.check`), and sends them over OTLP to whatever the standard `OTEL_*`
//! environment variables point at. Nothing else configures it. [`audit`] keeps the durable,
//! local record of the same runs and decisions.
//!
//! # Why not a regular tracer provider
//!
//! The CLI is short-lived, and while the sandbox runs it must stay single-threaded:
//! libcontainer clones without exec and keeps running Rust in the child, so no thread (no
//! batch processor, no tokio worker) may exist before the run. So this crate works in three
//! steps:
//!
//! 1. [`RunSpan::start`] before the run: generates the ids (so that the span's own
//!    `traceparent` can be handed to the sandboxed process as `TRACEPARENT`) and records the
//!    start time. No threads, no I/O.
//! 2. [`RunSpan::set_attribute`] / [`RunSpan::set_error`] while or after the run.
//! 3. [`RunSpan::finish`] right before exit: records the end time, builds the span and, only
//!    if [`export_enabled`], exports it synchronously on a current-thread tokio runtime that
//!    exists for the duration of the export only.
//!
//! Telemetry never fails a run: [`RunSpan::finish`] returns nothing and reports problems on
//! stderr only when `OTEL_LOG_LEVEL=debug`.
//!
//! ```no_run
//! use agentrun_telemetry::RunSpan;
//!
//! let parent = std::env::var("TRACEPARENT").ok();
//! let mut span = RunSpan::start("sandbox.exec", parent.as_deref());
//! let child_traceparent = span.traceparent(); // set as TRACEPARENT in the sandbox's env
//! # let _ = child_traceparent;
//! // ... run the sandbox (single-threaded) ...
//! span.set_attribute("sandbox.id", "3f2a");
//! span.set_attribute("process.exit.code", 124);
//! span.set_attribute("sandbox.timed_out", true);
//! span.set_error("timeout", "timed out after 1s");
//! span.finish(); // exports only if OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set
//! ```
//!
//! # Environment variables
//!
//! | variable | effect |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | where to send; nothing is exported unless one is set. For HTTP the generic one gets `/v1/traces` appended, the traces one is used as is |
//! | `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` | `grpc` (default), `http/protobuf`, `http/json` |
//! | `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TRACES_HEADERS` | `k1=v1,k2=v2` request headers / gRPC metadata |
//! | `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT` | export timeout in ms (default 10000), capped at 3 s |
//! | `OTEL_EXPORTER_OTLP_COMPRESSION`, `..._TRACES_COMPRESSION`, `OTEL_EXPORTER_OTLP_INSECURE`, `..._TRACES_INSECURE` | read by `opentelemetry-otlp` |
//! | `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` | resource; `service.name` defaults to `agentrun` |
//! | `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none` | disable export |
//! | `OTEL_LOG_LEVEL=debug` | report export failures on stderr |

pub mod audit;
mod context;
pub mod decision;
mod exec_span;
mod export;
pub mod finish;
pub mod metrics;
mod span;

pub use audit::{AuditLog, AuditQuery, AuditRecord};
pub use context::TraceContext;
pub use decision::{trace_id_of, DecisionScope};
pub use exec_span::{argv_line, command_line, cut, ExecSpan, COMMAND_LINE_MAX, EXEC_SPAN};
pub use export::export_enabled;
pub use finish::{Ending, FrontEnd, RunCounter, RunFinish, Sinks};
pub use span::{AttrValue, FinishedSpan, RunSpan};
