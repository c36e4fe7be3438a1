//! OpenTelemetry export, end to end: the real `agentrun` binary runs a command in a sandbox and
//! a real OTLP receiver (gRPC or HTTP, see `agentrun_e2e::otlp`) checks what it was sent.
//!
//! Contract under test (DESIGN.md, "Conventions"): one `sandbox.exec` span per run, exported
//! only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or the traces variant) is set, with the run's
//! attributes; context comes in through `TRACEPARENT` and goes on to the sandboxed process as
//! `TRACEPARENT`; telemetry never fails a run nor adds more than its (capped) timeout to it.
//!
//! Every command is hermetic: the runner's own `OTEL_*` variables and `TRACEPARENT` are removed.
//! These tests need root (sandboxes); see `agentrun_e2e::require_root`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use agentrun_e2e::otlp::{hex, OtlpReceiver, Protocol, ReceivedSpan};
use agentrun_e2e::{exec_with, setup, Agentrun, RunOutput};

/// How long a receiver is given to hold a span after the run exited. The CLI exports
/// synchronously before it exits, so the span is normally there already.
const SPAN_WAIT: Duration = Duration::from_secs(10);

/// Variables that configure OpenTelemetry; all removed from every spawned command, together
/// with whatever other `OTEL_*` variable the test runner has.
const OTEL_VARS: &[&str] = &[
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_TIMEOUT",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_TRACES_SAMPLER",
    "OTEL_LOG_LEVEL",
    "TRACEPARENT",
    "TRACESTATE",
];

/// `agentrun exec --image host OPTS... -- CMD...` on the cold path (these tests check the
/// cold path's span; a daemon someone runs on the default socket must not serve them), with
/// no telemetry configuration inherited.
fn run_cmd(opts: &[&str], cmd: &[&str]) -> Agentrun {
    let mut all = vec!["--image", "host"];
    all.extend_from_slice(opts);
    let mut a = exec_with(all, cmd).env("AGENTRUN_NO_DAEMON", "1");
    for k in OTEL_VARS {
        a = a.env_remove(k);
    }
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OTEL_") {
            a = a.env_remove(k);
        }
    }
    a
}

/// Points the command at `rx` (and asks for export errors on stderr, to help diagnose).
fn exporting_to(a: Agentrun, rx: &OtlpReceiver) -> Agentrun {
    let mut a = a.env("OTEL_LOG_LEVEL", "debug");
    for (k, v) in rx.otel_env() {
        a = a.env(k, v);
    }
    a
}

/// The `sandbox.exec` spans `rx` received for one run: exactly one expected.
fn the_exec_span(rx: &OtlpReceiver, out: &RunOutput) -> ReceivedSpan {
    let spans = rx.wait_for_spans(1, SPAN_WAIT);
    let exec: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == "sandbox.exec").collect();
    assert_eq!(
        exec.len(),
        1,
        "expected exactly one sandbox.exec span at {} ({:?}); received {} spans: {spans:#?}\n{out}",
        rx.endpoint(),
        rx.protocol(),
        spans.len()
    );
    exec[0].clone()
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    for chunk in out.chunks_mut(8) {
        let mut h = RandomState::new().build_hasher();
        h.write_u128(Instant::now().elapsed().as_nanos() ^ u128::from(std::process::id()));
        let v = h.finish().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    out[0] |= 1; // never all zero
    out
}

fn assert_hex_id(id: &str, len: usize, what: &str) {
    assert_eq!(id.len(), len, "{what} {id:?}");
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
        "{what} {id:?} is not lowercase hex"
    );
    assert!(id.bytes().any(|b| b != b'0'), "{what} is all zero");
}

/// Attributes every `sandbox.exec` span carries, whatever the run did.
fn assert_common_run_attributes(span: &ReceivedSpan) {
    assert_hex_id(&span.trace_id, 32, "trace id");
    assert_hex_id(&span.span_id, 16, "span id");
    let id = span.typed_attr("sandbox.id", "string");
    assert!(!id.is_empty(), "empty sandbox.id");
    assert_eq!(span.typed_attr("container.id", "string"), id);
    assert_eq!(span.typed_attr("container.image.name", "string"), "host");
    assert_eq!(span.typed_attr("sandbox.pool_hit", "bool"), "false");
    assert_eq!(span.typed_attr("sandbox.profile", "string"), "default");
    assert_eq!(span.typed_attr("openinference.span.kind", "string"), "TOOL");
    for key in ["sandbox.timed_out", "sandbox.oom_killed"] {
        span.typed_attr(key, "bool");
    }
    for key in [
        "sandbox.duration_ms",
        "sandbox.stdout_bytes",
        "sandbox.stderr_bytes",
    ] {
        let v = span.typed_attr(key, "int");
        let n: i64 = v.parse().unwrap();
        assert!(n >= 0, "{key} = {n}");
    }
    assert!(
        span.attributes.contains_key("process.command_args")
            || span.attributes.contains_key("process.command_line"),
        "neither process.command_args nor process.command_line: {:#?}",
        span.attributes
    );
    assert!(
        span.attributes
            .keys()
            .any(|k| k.starts_with("sandbox.enforce.")),
        "no sandbox.enforce.* attribute: {:#?}",
        span.attributes
    );
    assert_eq!(
        span.resource.get("service.name").map(String::as_str),
        Some("agentrun"),
        "resource: {:#?}",
        span.resource
    );
    assert!(
        span.end_time_unix_nano >= span.start_time_unix_nano && span.start_time_unix_nano > 0,
        "span times {} .. {}",
        span.start_time_unix_nano,
        span.end_time_unix_nano
    );
}

/// Runs `sh -c 'echo hi; exit 3'` exporting to `rx` and checks the span and what the user saw.
fn check_exit_3_run(rx: &OtlpReceiver) {
    let out = exporting_to(run_cmd(&[], &["sh", "-c", "echo hi; exit 3"]), rx).run();
    out.assert_code(3);
    assert_eq!(out.stdout(), "hi\n", "{out}");

    let span = the_exec_span(rx, &out);
    assert_common_run_attributes(&span);
    assert_eq!(span.parent_span_id, "", "no TRACEPARENT: a root span");
    assert_eq!(span.typed_attr("process.executable.name", "string"), "sh");
    assert_eq!(span.typed_attr("process.exit.code", "int"), "3");
    assert_eq!(span.typed_attr("sandbox.timed_out", "bool"), "false");
    assert_eq!(span.typed_attr("sandbox.oom_killed", "bool"), "false");
    assert_eq!(span.typed_attr("sandbox.stdout_bytes", "int"), "3");
    assert_eq!(span.typed_attr("sandbox.stderr_bytes", "int"), "0");
    if let Some(line) = span.attributes.get("process.command_line") {
        assert!(line.contains("echo hi"), "process.command_line = {line:?}");
    }
    if let Some(args) = span.attributes.get("process.command_args") {
        assert!(args.contains("echo hi"), "process.command_args = {args:?}");
    }
    assert_ne!(
        span.status_code,
        ReceivedSpan::STATUS_ERROR,
        "a command's own non-zero exit is not an agentrun error: {span:#?}"
    );
    let duration_ms: u128 = span.attr("sandbox.duration_ms").parse().unwrap();
    assert!(
        duration_ms <= out.elapsed.as_millis() + 100,
        "sandbox.duration_ms {duration_ms} exceeds the whole invocation ({:?})",
        out.elapsed
    );
    assert!(
        span.duration() <= out.elapsed + Duration::from_millis(100),
        "span lasts {:?}, longer than the invocation ({:?})",
        span.duration(),
        out.elapsed
    );
}

#[test]
fn grpc_export_has_one_span_with_run_attributes() {
    let Some(_lock) = setup() else { return };
    let rx = OtlpReceiver::grpc();
    check_exit_3_run(&rx);
}

#[test]
fn http_protobuf_export_has_one_span_with_run_attributes() {
    let Some(_lock) = setup() else { return };
    let rx = OtlpReceiver::http();
    assert_eq!(rx.protocol(), Protocol::HttpProtobuf);
    check_exit_3_run(&rx);
}

#[test]
fn traceparent_links_parent_and_reaches_the_sandboxed_process() {
    let Some(_lock) = setup() else { return };
    let rx = OtlpReceiver::grpc();
    let trace_id = hex(&random_bytes::<16>());
    let parent_span_id = hex(&random_bytes::<8>());
    let parent = format!("00-{trace_id}-{parent_span_id}-01");

    let out = exporting_to(run_cmd(&[], &["sh", "-c", "echo $TRACEPARENT"]), &rx)
        .env("TRACEPARENT", &parent)
        .run();
    out.assert_code(0);

    let span = the_exec_span(&rx, &out);
    assert_eq!(span.trace_id, trace_id, "span joins the caller's trace");
    assert_eq!(
        span.parent_span_id, parent_span_id,
        "span's parent is the caller's span"
    );
    assert_ne!(span.span_id, parent_span_id);
    assert_eq!(
        out.stdout().trim(),
        format!("00-{trace_id}-{}-01", span.span_id),
        "the sandboxed process sees the sandbox.exec span as its parent\n{out}"
    );
    assert_common_run_attributes(&span);
}

#[test]
fn traceparent_without_export_still_reaches_the_sandboxed_process() {
    let Some(_lock) = setup() else { return };
    let trace_id = hex(&random_bytes::<16>());
    let parent = format!("00-{trace_id}-{}-01", hex(&random_bytes::<8>()));
    let out = run_cmd(&[], &["sh", "-c", "echo $TRACEPARENT"])
        .env("TRACEPARENT", &parent)
        .run();
    out.assert_code(0);
    let seen = out.stdout();
    let seen = seen.trim();
    assert!(
        seen.starts_with(&format!("00-{trace_id}-")) && seen.ends_with("-01") && seen != parent,
        "expected 00-{trace_id}-<new span id>-01, the sandboxed process saw {seen:?}\n{out}"
    );
}

#[test]
fn timed_out_run_is_an_error_span() {
    let Some(_lock) = setup() else { return };
    let rx = OtlpReceiver::grpc();
    let out = exporting_to(run_cmd(&["--timeout", "1s"], &["sleep", "30"]), &rx)
        .timeout(Duration::from_secs(30))
        .run();
    out.assert_code(124);
    assert!(
        out.elapsed < Duration::from_secs(10),
        "a 1 s timeout took {:?}",
        out.elapsed
    );

    let span = the_exec_span(&rx, &out);
    assert_common_run_attributes(&span);
    assert_eq!(span.typed_attr("sandbox.timed_out", "bool"), "true");
    assert_eq!(
        span.typed_attr("process.executable.name", "string"),
        "sleep"
    );
    assert_eq!(span.status_code, ReceivedSpan::STATUS_ERROR, "{span:#?}");
    assert!(
        !span.typed_attr("error.type", "string").is_empty(),
        "empty error.type"
    );
    let duration_ms: u64 = span.attr("sandbox.duration_ms").parse().unwrap();
    assert!(
        (900..10_000).contains(&duration_ms),
        "sandbox.duration_ms = {duration_ms} for a 1 s timeout"
    );
}

#[test]
fn no_endpoint_means_nothing_is_sent() {
    let Some(_lock) = setup() else { return };
    // Receivers on both transports are up, but nothing tells agentrun about them.
    let grpc = OtlpReceiver::grpc();
    let http = OtlpReceiver::http();
    let out = run_cmd(&[], &["sh", "-c", "echo ok"]).run();
    out.assert_code(0);
    assert_eq!(out.stdout(), "ok\n", "{out}");
    std::thread::sleep(Duration::from_millis(500));
    for rx in [&grpc, &http] {
        assert_eq!(
            rx.request_count(),
            0,
            "{:?} receiver got requests without any OTEL env: {:#?}",
            rx.protocol(),
            rx.spans()
        );
    }
}

#[test]
fn unreachable_collector_neither_fails_nor_delays_the_run() {
    let Some(_lock) = setup() else { return };
    // A port nobody listens on.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let baseline = run_cmd(&[], &["sh", "-c", "echo x; exit 7"]).run();
    baseline.assert_code(7);

    for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
        let out = run_cmd(&[], &["sh", "-c", "echo x; exit 7"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{closed}"))
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.env_value())
            .env("OTEL_EXPORTER_OTLP_TIMEOUT", "500")
            .timeout(Duration::from_secs(30))
            .run();
        out.assert_code(7);
        assert_eq!(out.stdout(), "x\n", "{out}");
        // 500 ms of export timeout, plus a few seconds of slack for a slow machine.
        let limit = baseline.elapsed + Duration::from_millis(500) + Duration::from_secs(3);
        assert!(
            out.elapsed <= limit,
            "{protocol:?}: run took {:?} with an unreachable collector (baseline {:?}, limit {limit:?})\n{out}",
            out.elapsed,
            baseline.elapsed
        );
    }
}

#[test]
fn otel_sdk_disabled_sends_nothing() {
    let Some(_lock) = setup() else { return };
    let rx = OtlpReceiver::grpc();
    let out = exporting_to(run_cmd(&[], &["true"]), &rx)
        .env("OTEL_SDK_DISABLED", "true")
        .run();
    out.assert_code(0);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(rx.request_count(), 0, "{:#?}", rx.spans());
}
