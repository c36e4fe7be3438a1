//! [`RunSpan`]: a span recorded by hand (ids up front, timestamps, attributes, status) and
//! turned into an OpenTelemetry [`SpanData`] when it ends.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks};

use crate::context::TraceContext;

/// Name of the instrumentation scope of every span this crate produces.
pub(crate) const SCOPE_NAME: &str = "agentrun";

/// A span attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// A string.
    String(String),
    /// A signed 64-bit integer.
    I64(i64),
    /// A boolean.
    Bool(bool),
    /// A double.
    F64(f64),
}

impl From<String> for AttrValue {
    fn from(v: String) -> Self {
        AttrValue::String(v)
    }
}
impl From<&str> for AttrValue {
    fn from(v: &str) -> Self {
        AttrValue::String(v.to_owned())
    }
}
impl From<&String> for AttrValue {
    fn from(v: &String) -> Self {
        AttrValue::String(v.clone())
    }
}
impl From<Cow<'_, str>> for AttrValue {
    fn from(v: Cow<'_, str>) -> Self {
        AttrValue::String(v.into_owned())
    }
}
impl From<bool> for AttrValue {
    fn from(v: bool) -> Self {
        AttrValue::Bool(v)
    }
}
impl From<f64> for AttrValue {
    fn from(v: f64) -> Self {
        AttrValue::F64(v)
    }
}
impl From<f32> for AttrValue {
    fn from(v: f32) -> Self {
        AttrValue::F64(f64::from(v))
    }
}
macro_rules! int_into_attr {
    ($($t:ty),*) => {$(
        impl From<$t> for AttrValue {
            fn from(v: $t) -> Self {
                AttrValue::I64(i64::from(v))
            }
        }
    )*};
}
int_into_attr!(i8, i16, i32, i64, u8, u16, u32);
macro_rules! wide_int_into_attr {
    ($($t:ty),*) => {$(
        /// Values above `i64::MAX` saturate.
        impl From<$t> for AttrValue {
            fn from(v: $t) -> Self {
                AttrValue::I64(i64::try_from(v).unwrap_or(i64::MAX))
            }
        }
    )*};
}
wide_int_into_attr!(u64, usize, u128);
impl From<isize> for AttrValue {
    fn from(v: isize) -> Self {
        // isize is at most 64 bits on every supported target.
        AttrValue::I64(i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX }))
    }
}

impl From<AttrValue> for Value {
    fn from(v: AttrValue) -> Self {
        match v {
            AttrValue::String(s) => Value::from(s),
            AttrValue::I64(i) => Value::I64(i),
            AttrValue::Bool(b) => Value::Bool(b),
            AttrValue::F64(f) => Value::F64(f),
        }
    }
}

/// A span that has ended and waits to be exported with its parent ([`RunSpan::finish_with`]).
#[derive(Debug)]
pub struct FinishedSpan {
    data: SpanData,
    sampled: bool,
}

/// A span that is being recorded.
///
/// Created before the run (so that its ids can be handed to the sandboxed process as
/// `TRACEPARENT`), filled in during and after it, then finished and exported with
/// [`RunSpan::finish`]. Creating one does no I/O and starts no thread.
#[derive(Clone, Debug)]
pub struct RunSpan {
    name: &'static str,
    context: TraceContext,
    parent: Option<TraceContext>,
    /// The parent is another process's span (from a `traceparent`), not one of ours.
    remote_parent: bool,
    start_time: SystemTime,
    attributes: Vec<(&'static str, AttrValue)>,
    status: Status,
}

impl RunSpan {
    /// Starts a span called `name` (e.g. `"sandbox.exec"`) now.
    ///
    /// `parent_traceparent` is typically the `TRACEPARENT` environment value: when it is a
    /// valid W3C `traceparent`, the span joins that trace as its child and inherits its
    /// sampled flag; otherwise the span starts a new, sampled trace.
    pub fn start(name: &'static str, parent_traceparent: Option<&str>) -> Self {
        let parent = parent_traceparent.and_then(TraceContext::from_traceparent);
        let ids = RandomIdGenerator::default();
        let trace_id = match parent {
            Some(p) => p.trace_id,
            None => loop {
                let id = ids.new_trace_id().to_bytes();
                if id != [0; 16] {
                    break id;
                }
            },
        };
        let span_id = loop {
            let id = ids.new_span_id().to_bytes();
            if id != [0; 8] {
                break id;
            }
        };
        RunSpan {
            name,
            context: TraceContext {
                trace_id,
                span_id,
                sampled: parent.is_none_or(|p| p.sampled),
            },
            parent,
            remote_parent: parent.is_some(),
            start_time: SystemTime::now(),
            attributes: Vec::new(),
            status: Status::Unset,
        }
    }

    /// [`RunSpan::start`] for work that began `ago` before now (a span written once the
    /// work is done).
    pub fn started_ago(
        name: &'static str,
        parent_traceparent: Option<&str>,
        ago: std::time::Duration,
    ) -> Self {
        let mut span = RunSpan::start(name, parent_traceparent);
        span.start_time = SystemTime::now()
            .checked_sub(ago)
            .unwrap_or_else(SystemTime::now);
        span
    }

    /// Continues, in another process, a span started earlier with [`RunSpan::start`]: its own
    /// `context`, its `parent` and its `start_time`, as that process recorded them (e.g. an
    /// OCI container's lifetime span, started at `create` and finished at `delete`).
    pub fn resume(
        name: &'static str,
        context: TraceContext,
        parent: Option<TraceContext>,
        start_time: SystemTime,
    ) -> Self {
        RunSpan {
            name,
            context,
            parent,
            remote_parent: parent.is_some(),
            start_time,
            attributes: Vec::new(),
            status: Status::Unset,
        }
    }

    /// Starts a child span of this one, now (same trace, same sampling).
    pub fn child(&self, name: &'static str) -> RunSpan {
        let mut c = RunSpan::start(name, Some(&self.traceparent()));
        c.remote_parent = false;
        c
    }

    /// Ends the span now without exporting it; pass it to [`RunSpan::finish_with`].
    pub fn end(self) -> FinishedSpan {
        let end_time = SystemTime::now();
        let sampled = self.context.sampled;
        FinishedSpan {
            data: self.into_span_data(end_time),
            sampled,
        }
    }

    /// Ends this span now and exports it together with `children` (ended earlier), in one
    /// request, if an OTLP endpoint is configured. Same guarantees as [`RunSpan::finish`].
    pub fn finish_with(self, children: Vec<FinishedSpan>) {
        let end_time = SystemTime::now();
        if !self.context.sampled || !crate::export::export_enabled() {
            return;
        }
        let mut batch: Vec<SpanData> = children
            .into_iter()
            .filter(|c| c.sampled)
            .map(|c| c.data)
            .collect();
        batch.push(self.into_span_data(end_time));
        crate::export::export_spans(batch);
    }

    /// The `traceparent` of this span, to hand to the sandboxed process as `TRACEPARENT`.
    pub fn traceparent(&self) -> String {
        self.context.to_traceparent()
    }

    /// This span's own context (trace id, span id, sampled flag).
    pub fn context(&self) -> TraceContext {
        self.context
    }

    /// The parent's context, when the span was started from a valid `traceparent`.
    pub fn parent(&self) -> Option<TraceContext> {
        self.parent
    }

    /// The span's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// When the span started.
    pub fn start_time(&self) -> SystemTime {
        self.start_time
    }

    /// Sets an attribute, replacing an earlier value under the same key.
    /// The attributes of a `policy.check` span: `d`, the decision on `action`, made under
    /// `profile`, enforced by `enforced_by`.
    pub fn set_decision(
        &mut self,
        action: &agentrun_policy::Action,
        d: &agentrun_policy::Decision,
        profile: &str,
        enforced_by: &str,
    ) {
        self.set_attribute("openinference.span.kind", "GUARDRAIL");
        self.set_attribute("sandbox.decision", d.verdict());
        self.set_attribute("sandbox.rule_id", d.rule_id.clone());
        self.set_attribute("sandbox.reason", d.reason.clone());
        self.set_action(action);
        self.set_attribute("sandbox.blocked", !d.allow);
        if let Some(outcome) = d.escalation {
            self.set_attribute("sandbox.escalation.outcome", outcome.as_str());
        }
        self.set_attribute("sandbox.profile", profile.to_owned());
        self.set_attribute("sandbox.enforced_by", enforced_by.to_owned());
    }

    /// The attributes naming `action`: its name and resource, and for a connection the
    /// server's address and port.
    fn set_action(&mut self, action: &agentrun_policy::Action) {
        self.set_attribute("sandbox.action", action.name());
        self.set_attribute("sandbox.resource", action.resource());
        if let agentrun_policy::Action::Connect { host, port } = action {
            self.set_attribute("server.address", host.clone());
            self.set_attribute("server.port", i64::from(*port));
        }
    }

    /// The attributes of an `egress.connect` span: a connection for `action` that rule
    /// `rule_id` allowed could not be made (`error_type`, e.g. `resolve`, and `message`).
    /// Status Error: a failure, not a decision.
    pub fn set_connect_failure(
        &mut self,
        action: &agentrun_policy::Action,
        rule_id: &str,
        error_type: &str,
        message: &str,
    ) {
        self.set_action(action);
        self.set_attribute("sandbox.rule_id", rule_id.to_owned());
        self.set_error(error_type, message);
    }

    pub fn set_attribute(&mut self, key: &'static str, value: impl Into<AttrValue>) {
        let value = value.into();
        match self.attributes.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.attributes.push((key, value)),
        }
    }

    /// The value of an attribute set earlier, if any.
    pub fn attribute(&self, key: &str) -> Option<&AttrValue> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    /// Marks the span as failed: status `Error` with `message` as its description, and the
    /// `error.type` attribute set to `error_type` (e.g. `"timeout"`, `"oom"`).
    pub fn set_error(&mut self, error_type: &str, message: &str) {
        self.set_attribute("error.type", error_type);
        self.status = Status::error(message.to_owned());
    }

    /// Ends the span now and exports it if an OTLP endpoint is configured.
    ///
    /// Never panics and never reports an error to the caller: failures are written to stderr
    /// only when `OTEL_LOG_LEVEL=debug`. When export is disabled (see
    /// [`export_enabled`](crate::export_enabled)) or the trace is not sampled, this returns at
    /// once without starting a runtime or building an exporter. The export is bounded by the
    /// OTLP timeout variables, capped at 3 s.
    pub fn finish(self) {
        let end_time = SystemTime::now();
        if !self.context.sampled || !crate::export::export_enabled() {
            return;
        }
        crate::export::export_spans(vec![self.into_span_data(end_time)]);
    }

    /// [`RunSpan::finish`] on a thread of its own (named `thread`), for callers on a path that
    /// must not wait for the network (an async runtime's threads, a connection's). Nothing is
    /// started when export is off.
    pub fn finish_detached(self, thread: &str) {
        if crate::export::export_enabled() {
            // A JoinHandle, or no thread: then the span is not exported (telemetry never fails a run).
            let _ = std::thread::Builder::new()
                .name(thread.into())
                .spawn(move || self.finish());
        }
    }

    /// Builds the SDK's representation of this span, ending at `end_time`.
    pub(crate) fn into_span_data(self, end_time: SystemTime) -> SpanData {
        let flags = if self.context.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes(self.context.trace_id),
                SpanId::from_bytes(self.context.span_id),
                flags,
                false,
                TraceState::default(),
            ),
            parent_span_id: self
                .parent
                .map_or(SpanId::INVALID, |p| SpanId::from_bytes(p.span_id)),
            parent_span_is_remote: self.remote_parent,
            span_kind: SpanKind::Internal,
            name: Cow::Borrowed(self.name),
            start_time: self.start_time,
            // A clock step backwards must not produce a negative duration.
            end_time: end_time.max(self.start_time),
            attributes: self
                .attributes
                .into_iter()
                .map(|(k, v)| KeyValue::new(k, Value::from(v)))
                .collect(),
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links: SpanLinks::default(),
            status: self.status,
            instrumentation_scope: InstrumentationScope::builder(SCOPE_NAME)
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn new_trace_when_no_parent() {
        let a = RunSpan::start("sandbox.exec", None);
        let b = RunSpan::start("sandbox.exec", None);
        assert!(a.parent().is_none());
        assert!(a.context().sampled);
        assert_ne!(a.context().trace_id, [0; 16]);
        assert_ne!(a.context().span_id, [0; 8]);
        assert_ne!(a.context().trace_id, b.context().trace_id);
        let tp = TraceContext::from_traceparent(&a.traceparent()).expect("own traceparent parses");
        assert_eq!(tp, a.context());
    }

    #[test]
    fn invalid_parent_starts_new_trace() {
        let s = RunSpan::start("sandbox.exec", Some("garbage"));
        assert!(s.parent().is_none());
        assert!(s.context().sampled);
    }

    #[test]
    fn child_of_valid_parent() {
        let s = RunSpan::start("sandbox.exec", Some(PARENT));
        let parent = TraceContext::from_traceparent(PARENT).unwrap();
        assert_eq!(s.parent(), Some(parent));
        assert_eq!(s.context().trace_id, parent.trace_id);
        assert_ne!(s.context().span_id, parent.span_id);
        assert!(s
            .traceparent()
            .starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(s.traceparent().ends_with("-01"));
    }

    #[test]
    fn unsampled_parent_is_inherited() {
        let s = RunSpan::start(
            "sandbox.exec",
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
        );
        assert!(!s.context().sampled);
        assert!(s.traceparent().ends_with("-00"));
    }

    #[test]
    fn attributes_replace_and_convert() {
        let mut s = RunSpan::start("sandbox.exec", None);
        s.set_attribute("process.exit.code", 3);
        s.set_attribute("process.exit.code", 4i64);
        s.set_attribute("sandbox.timed_out", false);
        s.set_attribute("sandbox.stdout_bytes", u64::MAX);
        s.set_attribute("sandbox.id", "abc");
        s.set_attribute("sandbox.cpu", 0.5);
        assert_eq!(s.attribute("process.exit.code"), Some(&AttrValue::I64(4)));
        assert_eq!(
            s.attribute("sandbox.stdout_bytes"),
            Some(&AttrValue::I64(i64::MAX))
        );
        let data = s.into_span_data(SystemTime::now());
        assert_eq!(data.attributes.len(), 5);
        let get = |k: &str| {
            data.attributes
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .map(|kv| kv.value.clone())
        };
        assert_eq!(get("process.exit.code"), Some(Value::I64(4)));
        assert_eq!(get("sandbox.timed_out"), Some(Value::Bool(false)));
        assert_eq!(get("sandbox.id"), Some(Value::from("abc")));
        assert_eq!(get("sandbox.cpu"), Some(Value::F64(0.5)));
    }

    #[test]
    fn span_data_carries_ids_times_status() {
        let mut s = RunSpan::start("sandbox.exec", Some(PARENT));
        let ctx = s.context();
        let start = s.start_time();
        s.set_error("timeout", "timed out after 1s");
        let data = s.into_span_data(start - std::time::Duration::from_secs(1));
        assert_eq!(data.name, "sandbox.exec");
        assert_eq!(data.span_context.trace_id().to_bytes(), ctx.trace_id);
        assert_eq!(data.span_context.span_id().to_bytes(), ctx.span_id);
        assert!(data.span_context.is_sampled());
        assert_eq!(
            data.parent_span_id,
            SpanId::from_bytes(TraceContext::from_traceparent(PARENT).unwrap().span_id)
        );
        assert!(data.parent_span_is_remote);
        assert_eq!(data.end_time, start, "end never precedes start");
        assert_eq!(data.status, Status::error("timed out after 1s"));
        assert!(data
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == "error.type" && kv.value == Value::from("timeout")));
        assert_eq!(data.instrumentation_scope.name(), SCOPE_NAME);
    }

    #[test]
    fn resumed_span_keeps_ids_and_start() {
        let first = RunSpan::start("container.lifetime", Some(PARENT));
        let again = RunSpan::resume(
            "container.lifetime",
            TraceContext::from_traceparent(&first.traceparent()).unwrap(),
            first.parent(),
            first.start_time(),
        );
        let data = again.into_span_data(SystemTime::now());
        assert_eq!(
            data.span_context.span_id().to_bytes(),
            first.context().span_id
        );
        assert_eq!(
            data.span_context.trace_id().to_bytes(),
            first.context().trace_id
        );
        assert_eq!(data.start_time, first.start_time());
        assert_eq!(
            data.parent_span_id,
            SpanId::from_bytes(first.parent().unwrap().span_id)
        );
    }

    #[test]
    fn root_span_has_invalid_parent_id() {
        let s = RunSpan::start("sandbox.exec", None);
        let data = s.into_span_data(SystemTime::now());
        assert_eq!(data.parent_span_id, SpanId::INVALID);
        assert!(!data.parent_span_is_remote);
    }
}
