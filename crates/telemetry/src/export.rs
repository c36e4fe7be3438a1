//! Synchronous, bounded OTLP export of finished spans.
//!
//! Everything here runs only when [`export_enabled`] is true, from [`RunSpan::finish`]:
//! a current-thread tokio runtime is created for the export and torn down right after it.
//! Endpoint, headers, compression and TLS scheme are left to `opentelemetry-otlp`'s builders,
//! which read the standard variables themselves (signal-specific before generic; for HTTP the
//! generic endpoint gets `/v1/traces` appended and the traces one is used as is). The protocol
//! and the timeout are resolved here: the protocol because the crate's own default is
//! `http/protobuf` when that feature is compiled in whereas agentrun defaults to `grpc`, the
//! timeout because it is capped.
//!
//! [`RunSpan::finish`]: crate::RunSpan::finish

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_otlp::{
    Protocol, RetryPolicy, WithExportConfig, WithHttpConfig, WithTonicConfig,
};
use opentelemetry_sdk::error::OTelSdkError;
use opentelemetry_sdk::resource::TelemetryResourceDetector;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};
use opentelemetry_sdk::Resource;

/// Default export timeout from the OTLP exporter spec.
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(10_000);
/// agentrun never waits longer than this for telemetry, whatever the configuration says.
const MAX_TIMEOUT: Duration = Duration::from_secs(3);
/// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` sets one.
const DEFAULT_SERVICE_NAME: &str = "agentrun";

/// Why an export did not happen. Only ever shown on stderr with `OTEL_LOG_LEVEL=debug`.
#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error("cannot start the export runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot build the OTLP exporter: {0}")]
    Build(#[from] opentelemetry_otlp::ExporterBuildError),
    #[error("OTLP export failed: {0}")]
    Export(#[source] OTelSdkError),
    #[error("OTLP export did not complete within {0:?}")]
    Timeout(Duration),
    #[error("the export thread panicked")]
    Panicked,
}

/// Whether a finished span will be exported.
///
/// True iff `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set and
/// non-empty, `OTEL_SDK_DISABLED` is not `true` (case-insensitive), and `OTEL_TRACES_EXPORTER`
/// is not `none`.
pub fn export_enabled() -> bool {
    enabled_in(&env_nonempty)
}

/// A way to read a configuration variable: the process environment, or a map in tests.
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

fn enabled_in(env: Env<'_>) -> bool {
    let endpoint_set = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|k| env(k).is_some());
    let sdk_disabled =
        env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let exporter_none =
        env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    endpoint_set && !sdk_disabled && !exporter_none
}

/// Exports spans in one request; reports failures on stderr only in debug mode. Never panics.
pub(crate) fn export_spans(span: Vec<SpanData>) {
    let result = if tokio::runtime::Handle::try_current().is_ok() {
        // Called from inside a tokio runtime (e.g. a future server): a nested runtime would
        // panic, so export from a scoped thread that owns its own.
        std::thread::scope(|s| {
            s.spawn(|| guarded_export(span))
                .join()
                .unwrap_or(Err(ExportError::Panicked))
        })
    } else {
        guarded_export(span)
    };
    if let Err(e) = result {
        debug_log(&e.to_string());
    }
}

/// [`export_blocking`], with any panic from the exporter stack turned into an error.
fn guarded_export(span: Vec<SpanData>) -> Result<(), ExportError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| export_blocking(span)))
        .unwrap_or(Err(ExportError::Panicked))
}

/// Builds the exporter and sends `span` on a current-thread runtime, bounded by the timeout.
fn export_blocking(span: Vec<SpanData>) -> Result<(), ExportError> {
    let timeout = timeout_in(&env_nonempty);
    let protocol = protocol_in(&env_nonempty);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ExportError::Runtime)?;
    let result = runtime.block_on(async {
        // Built inside the runtime: the tonic channel and the hyper client need a reactor.
        let mut exporter = build_exporter(protocol, timeout)?;
        exporter.set_resource(&resource_in(&env_nonempty));
        let outcome = match tokio::time::timeout(timeout, exporter.export(span)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ExportError::Export(e)),
            Err(_) => Err(ExportError::Timeout(timeout)),
        };
        // The exporter holds no buffered data; shutting it down only releases the client.
        let _ = exporter.shutdown();
        outcome
    });
    // Do not wait for a blocking DNS lookup or connection attempt that may still be pending.
    runtime.shutdown_background();
    result
}

fn build_exporter(
    protocol: Protocol,
    timeout: Duration,
) -> Result<opentelemetry_otlp::SpanExporter, ExportError> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let exporter = match protocol {
        Protocol::Grpc => builder
            .with_tonic()
            .with_timeout(timeout)
            .with_retry_policy(retry_policy())
            .build()?,
        http => builder
            .with_http()
            .with_protocol(http)
            .with_timeout(timeout)
            .with_retry_policy(retry_policy())
            .build()?,
    };
    Ok(exporter)
}

/// One quick retry for a transient failure. The crate's recommended policy (3 retries, backoff
/// from 100 ms) spends ~1 s on a collector that is down; a CLI exporting one span right
/// before it exits should not.
fn retry_policy() -> RetryPolicy {
    RetryPolicy::recommended()
        .with_max_retries(1)
        .with_initial_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_millis(50))
        .with_max_jitter(Duration::from_millis(20))
}

/// Protocol from `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`,
/// else gRPC. Unknown values fall back to gRPC (with a debug note).
fn protocol_in(env: Env<'_>) -> Protocol {
    let value =
        env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"));
    match value.as_deref().map(str::trim) {
        None | Some("grpc") => Protocol::Grpc,
        Some("http/protobuf") => Protocol::HttpBinary,
        Some("http/json") => Protocol::HttpJson,
        Some(other) => {
            debug_log(&format!("unknown OTLP protocol {other:?}, using grpc"));
            Protocol::Grpc
        }
    }
}

/// Timeout from `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT`
/// (milliseconds), else 10 s; never more than 3 s. Zero or unparsable values are ignored.
pub(crate) fn timeout_in(env: Env<'_>) -> Duration {
    [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]
    .iter()
    .find_map(|k| {
        env(k)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|ms| *ms > 0)
    })
    .map_or(DEFAULT_TIMEOUT, Duration::from_millis)
    .min(MAX_TIMEOUT)
}

/// The resource every span is exported with: `OTEL_RESOURCE_ATTRIBUTES`, the SDK's
/// `telemetry.sdk.*`, `service.name` (from `OTEL_SERVICE_NAME`, else from
/// `OTEL_RESOURCE_ATTRIBUTES`, else `agentrun`) and `service.version` (unless
/// `OTEL_RESOURCE_ATTRIBUTES` sets one).
pub(crate) fn resource_in(env: Env<'_>) -> Resource {
    let from_env: Vec<KeyValue> = env("OTEL_RESOURCE_ATTRIBUTES")
        .map(|s| parse_resource_attributes(&s))
        .unwrap_or_default();
    let lookup = |key: &str| {
        from_env
            .iter()
            .rev()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
    };
    let service_name = env("OTEL_SERVICE_NAME")
        .map(opentelemetry::Value::from)
        .or_else(|| lookup("service.name"))
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.into());
    let service_version =
        lookup("service.version").unwrap_or_else(|| env!("CARGO_PKG_VERSION").into());
    Resource::builder_empty()
        .with_detector(Box::new(TelemetryResourceDetector))
        .with_attributes(from_env.iter().cloned())
        .with_attribute(KeyValue::new("service.name", service_name))
        .with_attribute(KeyValue::new("service.version", service_version))
        .build()
}

/// Parses `key1=value1,key2=value2` (values percent-decoded, per the OTel resource SDK spec).
/// Malformed entries are skipped.
fn parse_resource_attributes(s: &str) -> Vec<KeyValue> {
    s.split(',')
        .filter_map(|entry| {
            let (k, v) = entry.split_once('=')?;
            let k = k.trim();
            if k.is_empty() {
                return None;
            }
            Some(KeyValue::new(k.to_owned(), percent_decode(v.trim())))
        })
        .collect()
}

/// Decodes `%XX` escapes; invalid escapes are kept literally.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = &bytes[i + 1..i + 3];
            let parsed = std::str::from_utf8(hex)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(b) = parsed {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of `key` if it is set, valid Unicode and non-empty.
pub(crate) fn env_nonempty(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// Writes `msg` to stderr when `OTEL_LOG_LEVEL=debug`.
pub(crate) fn debug_log(msg: &str) {
    if env_nonempty("OTEL_LOG_LEVEL").is_some_and(|v| v.trim().eq_ignore_ascii_case("debug")) {
        eprintln!("agentrun: telemetry: {msg}");
    }
}

/// A fake environment for tests, read as [`env_nonempty`] reads the real one (an empty value
/// is unset); the real process environment is never modified by the tests.
#[cfg(test)]
pub(crate) fn fake_env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: std::collections::HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).filter(|v| !v.is_empty()).cloned()
}

#[cfg(test)]
mod tests {
    use super::fake_env as env;
    use super::*;

    fn res_get(r: &Resource, k: &'static str) -> Option<String> {
        r.get(&opentelemetry::Key::new(k)).map(|v| v.to_string())
    }

    #[test]
    fn enabled_only_with_an_endpoint() {
        assert!(!enabled_in(&env(&[])));
        assert!(!enabled_in(&env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "")])));
        assert!(enabled_in(&env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4317"
        )])));
        assert!(enabled_in(&env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4318/v1/traces"
        )])));
    }

    #[test]
    fn disabled_by_sdk_disabled_or_exporter_none() {
        let ep = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317");
        assert!(!enabled_in(&env(&[ep, ("OTEL_SDK_DISABLED", "TRUE")])));
        assert!(enabled_in(&env(&[ep, ("OTEL_SDK_DISABLED", "false")])));
        assert!(!enabled_in(&env(&[ep, ("OTEL_TRACES_EXPORTER", "none")])));
        assert!(enabled_in(&env(&[ep, ("OTEL_TRACES_EXPORTER", "otlp")])));
    }

    #[test]
    fn protocol_resolution() {
        assert_eq!(protocol_in(&env(&[])), Protocol::Grpc);
        let generic = ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
        assert_eq!(protocol_in(&env(&[generic])), Protocol::HttpBinary);
        assert_eq!(
            protocol_in(&env(&[
                generic,
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
            ])),
            Protocol::Grpc,
            "signal-specific wins"
        );
        assert_eq!(
            protocol_in(&env(&[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")])),
            Protocol::HttpJson
        );
        assert_eq!(
            protocol_in(&env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")])),
            Protocol::Grpc
        );
    }

    #[test]
    fn timeout_resolution() {
        assert_eq!(timeout_in(&env(&[])), MAX_TIMEOUT, "10 s default is capped");
        let generic = ("OTEL_EXPORTER_OTLP_TIMEOUT", "500");
        assert_eq!(timeout_in(&env(&[generic])), Duration::from_millis(500));
        assert_eq!(
            timeout_in(&env(&[
                generic,
                ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "250")
            ])),
            Duration::from_millis(250),
            "signal-specific wins"
        );
        assert_eq!(
            timeout_in(&env(&[
                generic,
                ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "bogus")
            ])),
            Duration::from_millis(500)
        );
        assert_eq!(
            timeout_in(&env(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "60000")])),
            MAX_TIMEOUT
        );
        assert_eq!(
            timeout_in(&env(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "0")])),
            MAX_TIMEOUT
        );
    }

    #[test]
    fn resource_defaults() {
        let r = resource_in(&env(&[]));
        assert_eq!(res_get(&r, "service.name").as_deref(), Some("agentrun"));
        assert_eq!(
            res_get(&r, "service.version").as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        assert_eq!(
            res_get(&r, "telemetry.sdk.language").as_deref(),
            Some("rust")
        );
    }

    #[test]
    fn resource_from_env() {
        let attrs = (
            "OTEL_RESOURCE_ATTRIBUTES",
            "service.name=fromattrs, deployment.environment=ci,bad,team=a%2Cb",
        );
        let r = resource_in(&env(&[attrs]));
        assert_eq!(res_get(&r, "service.name").as_deref(), Some("fromattrs"));
        assert_eq!(res_get(&r, "deployment.environment").as_deref(), Some("ci"));
        assert_eq!(res_get(&r, "team").as_deref(), Some("a,b"));
        let r = resource_in(&env(&[attrs, ("OTEL_SERVICE_NAME", "fromname")]));
        assert_eq!(res_get(&r, "service.name").as_deref(), Some("fromname"));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b"), "a b");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%C3%A9"), "é");
    }

    #[test]
    fn export_to_closed_port_is_bounded() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let span = crate::RunSpan::start("sandbox.exec", None)
            .into_span_data(std::time::SystemTime::now());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let timeout = Duration::from_millis(300);
        let result = rt.block_on(async {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(format!("http://127.0.0.1:{port}"))
                .with_timeout(timeout)
                .build()
                .unwrap();
            tokio::time::timeout(timeout, exporter.export(vec![span])).await
        });
        rt.shutdown_background();
        assert!(
            !matches!(result, Ok(Ok(()))),
            "export to a closed port must fail"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
