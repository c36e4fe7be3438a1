//! `RunSpan::finish` against real OTLP receivers (gRPC, HTTP/protobuf, HTTP/JSON), configured
//! only through environment variables, as the CLI uses it.
//!
//! Each case runs in a child process (this test binary re-executed to run
//! [`emit_helper`] alone), so every case gets exactly the environment it sets and nothing from
//! the test runner's: no `set_var` in a multi-threaded test process.

use std::process::Command;
use std::time::{Duration, Instant};

use agentrun_e2e::otlp::{OtlpReceiver, Protocol, ReceivedSpan};
use agentrun_e2e::{run_with_timeout, RunOutput};
use agentrun_telemetry::{RunSpan, TraceContext};

/// Set in the child: makes [`emit_helper`] emit a span instead of doing nothing.
const EMIT: &str = "AGENTRUN_TELEMETRY_TEST_EMIT";
const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// In the child: start a span from `TRACEPARENT`, fill it, print its traceparent, finish it.
#[test]
fn emit_helper() {
    if std::env::var_os(EMIT).is_none() {
        return;
    }
    let parent = std::env::var("TRACEPARENT").ok();
    let mut span = RunSpan::start("sandbox.exec", parent.as_deref());
    span.set_attribute("sandbox.id", "sb-1");
    span.set_attribute("process.exit.code", 124);
    span.set_attribute("sandbox.timed_out", true);
    span.set_attribute("sandbox.cpu_share", 0.5);
    span.set_error("timeout", "timed out after 1s");
    // A leading newline: the harness prints "test emit_helper ... " without one.
    println!("\nTRACEPARENT={}", span.traceparent());
    let t = Instant::now();
    span.finish();
    println!("FINISH_MS={}", t.elapsed().as_millis());
}

/// Runs [`emit_helper`] in a child with only `env` (plus PATH) set.
fn emit(env: &[(&str, String)]) -> (RunOutput, String, Duration) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "emit_helper", "--nocapture", "--test-threads=1"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(EMIT, "1")
        .env("OTEL_LOG_LEVEL", "debug");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_with_timeout(cmd, None, Duration::from_secs(30));
    out.assert_code(0);
    let stdout = out.stdout();
    let traceparent = stdout
        .lines()
        .find_map(|l| l.strip_prefix("TRACEPARENT="))
        .unwrap_or_else(|| panic!("no TRACEPARENT line\n{out}"))
        .to_owned();
    let finish = stdout
        .lines()
        .find_map(|l| l.strip_prefix("FINISH_MS="))
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis)
        .unwrap_or_else(|| panic!("no FINISH_MS line\n{out}"));
    (out, traceparent, finish)
}

/// [`emit`] exporting to `rx` (its endpoint as `OTEL_EXPORTER_OTLP_ENDPOINT`), with `more`
/// set after it (a variable named again there replaces it).
fn emit_to(rx: &OtlpReceiver, more: &[(&str, &str)]) -> (RunOutput, String, Duration) {
    let mut env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint())];
    env.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
    emit(&env)
}

fn one_span(rx: &OtlpReceiver, out: &RunOutput) -> ReceivedSpan {
    // finish() exports synchronously: the span is there when the child has exited.
    let spans = rx.spans();
    assert_eq!(spans.len(), 1, "{spans:#?}\n{out}");
    spans[0].clone()
}

fn check_span(span: &ReceivedSpan, traceparent: &str) {
    let own = TraceContext::from_traceparent(traceparent).expect("child printed a traceparent");
    assert_eq!(span.name, "sandbox.exec");
    assert_eq!(span.trace_id, own.trace_id_hex());
    assert_eq!(span.span_id, own.span_id_hex());
    assert_eq!(span.scope_name, "agentrun");
    assert_eq!(span.typed_attr("sandbox.id", "string"), "sb-1");
    assert_eq!(span.typed_attr("process.exit.code", "int"), "124");
    assert_eq!(span.typed_attr("sandbox.timed_out", "bool"), "true");
    assert_eq!(span.typed_attr("sandbox.cpu_share", "double"), "0.5");
    assert_eq!(span.typed_attr("error.type", "string"), "timeout");
    assert_eq!(span.status_code, ReceivedSpan::STATUS_ERROR);
    assert_eq!(span.status_message, "timed out after 1s");
    assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
    assert!(span.start_time_unix_nano > 0);
    assert_eq!(
        span.resource.get("service.version").map(String::as_str),
        Some(env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn grpc_is_the_default_protocol() {
    let rx = OtlpReceiver::grpc();
    let (out, tp, _) = emit_to(&rx, &[]);
    let span = one_span(&rx, &out);
    check_span(&span, &tp);
    assert_eq!(span.parent_span_id, "", "no TRACEPARENT: root span");
    assert_eq!(
        span.resource.get("service.name").map(String::as_str),
        Some("agentrun")
    );
}

#[test]
fn http_protobuf_appends_v1_traces_to_the_generic_endpoint() {
    let rx = OtlpReceiver::http();
    let (out, tp, _) = emit_to(&rx, &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]);
    check_span(&one_span(&rx, &out), &tp);
}

#[test]
fn http_json_is_supported() {
    let rx = OtlpReceiver::http();
    let (out, tp, _) = emit_to(&rx, &[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")]);
    check_span(&one_span(&rx, &out), &tp);
}

#[test]
fn traces_endpoint_is_used_as_is_and_wins() {
    let rx = OtlpReceiver::http();
    let traces = format!("{}/v1/traces", rx.endpoint());
    let (out, tp, _) = emit_to(
        &rx,
        &[
            // The generic endpoint points nowhere useful; the traces one must win.
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &traces),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ],
    );
    check_span(&one_span(&rx, &out), &tp);
}

#[test]
fn traceparent_makes_a_child_span() {
    let rx = OtlpReceiver::grpc();
    let (out, tp, _) = emit_to(&rx, &[("TRACEPARENT", PARENT)]);
    let span = one_span(&rx, &out);
    check_span(&span, &tp);
    let parent = TraceContext::from_traceparent(PARENT).unwrap();
    assert_eq!(span.trace_id, parent.trace_id_hex());
    assert_eq!(span.parent_span_id, parent.span_id_hex());
    assert!(tp.ends_with("-01"));
}

#[test]
fn unsampled_parent_is_not_exported() {
    let rx = OtlpReceiver::grpc();
    let (out, tp, _) = emit_to(
        &rx,
        &[(
            "TRACEPARENT",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        )],
    );
    assert!(tp.ends_with("-00"), "{tp}");
    assert_eq!(rx.request_count(), 0, "{:#?}\n{out}", rx.spans());
}

#[test]
fn resource_comes_from_otel_env() {
    let rx = OtlpReceiver::grpc();
    let (out, _, _) = emit_to(
        &rx,
        &[
            ("OTEL_SERVICE_NAME", "my-agent"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=ci,service.name=ignored",
            ),
        ],
    );
    let span = one_span(&rx, &out);
    let res = |k: &str| span.resource.get(k).map(String::as_str);
    assert_eq!(res("service.name"), Some("my-agent"));
    assert_eq!(res("deployment.environment"), Some("ci"));
    assert_eq!(res("telemetry.sdk.language"), Some("rust"));
}

#[test]
fn headers_and_disabling_variables_are_honoured() {
    // Export disabled three ways: nothing reaches a live receiver, finish() is instant.
    let rx = OtlpReceiver::grpc();
    for extra in [
        ("OTEL_SDK_DISABLED", "true"),
        ("OTEL_TRACES_EXPORTER", "none"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", ""),
    ] {
        let (out, _, finish) = emit_to(&rx, &[extra]);
        assert!(
            finish < Duration::from_millis(50),
            "{extra:?}: finish took {finish:?}"
        );
        assert_eq!(rx.request_count(), 0, "{extra:?}\n{out}");
    }
    // A malformed header list does not break the export.
    let (out, tp, _) = emit_to(
        &rx,
        &[("OTEL_EXPORTER_OTLP_HEADERS", "x-team=agents,garbage,=x")],
    );
    check_span(&one_span(&rx, &out), &tp);
}

#[test]
fn no_endpoint_is_free() {
    let (out, _, finish) = emit(&[]);
    assert!(finish < Duration::from_millis(50), "finish took {finish:?}");
    assert!(!out.stderr().contains("agentrun: telemetry:"), "{out}");
}

#[test]
fn unreachable_collector_is_bounded_by_the_timeout() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    for protocol in [Protocol::Grpc, Protocol::HttpProtobuf] {
        let (out, _, finish) = emit(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{closed}")),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol.env_value().into()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "500".into()),
        ]);
        eprintln!("{protocol:?}: finish() took {finish:?} with an unreachable collector");
        assert!(
            finish < Duration::from_millis(1500),
            "{protocol:?}: finish took {finish:?}\n{out}"
        );
        assert!(
            out.stderr().contains("agentrun: telemetry:"),
            "{protocol:?}: with OTEL_LOG_LEVEL=debug the failure is reported\n{out}"
        );
    }
}

#[test]
fn unresponsive_collector_is_capped_at_3s() {
    // Accepts connections but never answers; the configured timeout (60 s) is capped to 3 s.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (out, _, finish) = emit(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000".into()),
    ]);
    drop(listener);
    assert!(
        finish >= Duration::from_millis(2500) && finish < Duration::from_millis(4500),
        "finish took {finish:?}\n{out}"
    );
}
