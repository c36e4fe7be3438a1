//! The `sandbox.violation_count` counter: denied policy decisions, one data point per run.
//!
//! A CLI run is one short process, so the counter is reported with delta temporality: each
//! run sends its own count (start = run start, time = now) with the run's attributes
//! (`sandbox.id`, `sandbox.profile`), and the backend sums. The OTLP request is built from
//! `opentelemetry-proto` messages and sent once, synchronously, bounded like span export.
//!
//! Configuration: `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` (used as is for HTTP) else
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/metrics` appended for HTTP);
//! `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL` else `OTEL_EXPORTER_OTLP_PROTOCOL` (`grpc` default,
//! or `http/protobuf`); `OTEL_METRICS_EXPORTER=none` or `OTEL_SDK_DISABLED=true` disable it.
//! Limits: plaintext only (`http://` endpoints; TLS and `http/json` are not supported for
//! metrics), no custom headers.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, Metric, NumberDataPoint, ResourceMetrics,
    ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use crate::export::{debug_log, env_nonempty, resource_in, timeout_in, Env};

/// The counter's name.
pub const VIOLATION_COUNT: &str = "sandbox.violation_count";

/// Where and how metrics go, when they go at all.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Grpc(String),
    /// Full URL of the metrics path.
    Http(String),
}

fn target_in(env: Env<'_>) -> Option<Target> {
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || env("OTEL_METRICS_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    if disabled {
        return None;
    }
    let protocol = env("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
        .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|| "grpc".into());
    let specific = env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT");
    let generic = env("OTEL_EXPORTER_OTLP_ENDPOINT");
    match protocol.trim() {
        "http/protobuf" => {
            let url = specific
                .or_else(|| generic.map(|g| format!("{}/v1/metrics", g.trim_end_matches('/'))))?;
            Some(Target::Http(url))
        }
        "grpc" => Some(Target::Grpc(specific.or(generic)?)),
        other => {
            debug_log(&format!(
                "metrics: protocol {other:?} is not supported (grpc, http/protobuf)"
            ));
            None
        }
    }
}

/// Sends one data point of `sandbox.violation_count` (`count` denials between `start` and
/// now) with `attributes`. Does nothing unless an endpoint is configured; never fails.
pub fn export_violation_count(count: u64, start: SystemTime, attributes: &[(&str, String)]) {
    let Some(target) = target_in(&env_nonempty) else {
        return;
    };
    let request = request(count, start, attributes, resource());
    let timeout = timeout_in(&env_nonempty);
    let result = match target {
        Target::Grpc(endpoint) => send_grpc(endpoint, request, timeout),
        Target::Http(url) => send_http(&url, &request.encode_to_vec(), timeout),
    };
    if let Err(e) = result {
        debug_log(&format!("metrics export failed: {e}"));
    }
}

fn resource() -> Resource {
    let r = resource_in(&env_nonempty);
    Resource {
        attributes: r
            .iter()
            .map(|(k, v)| KeyValue {
                key: k.as_str().to_string(),
                value: Some(AnyValue::from(v.clone())),
                key_strindex: 0,
            })
            .collect(),
        ..Default::default()
    }
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn request(
    count: u64,
    start: SystemTime,
    attributes: &[(&str, String)],
    resource: Resource,
) -> ExportMetricsServiceRequest {
    let point = NumberDataPoint {
        attributes: attributes
            .iter()
            .map(|(k, v)| KeyValue {
                key: (*k).to_string(),
                value: Some(AnyValue::from(opentelemetry::Value::from(v.clone()))),
                key_strindex: 0,
            })
            .collect(),
        start_time_unix_nano: nanos(start),
        time_unix_nano: nanos(SystemTime::now()),
        value: Some(number_data_point::Value::AsInt(
            i64::try_from(count).unwrap_or(i64::MAX),
        )),
        ..Default::default()
    };
    let metric = Metric {
        name: VIOLATION_COUNT.into(),
        description: "Policy decisions that denied an action".into(),
        unit: "{violation}".into(),
        data: Some(metric::Data::Sum(Sum {
            data_points: vec![point],
            aggregation_temporality: AggregationTemporality::Delta as i32,
            is_monotonic: true,
        })),
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: crate::span::SCOPE_NAME.into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                metrics: vec![metric],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

/// Why a metrics export failed. Only ever shown on stderr with `OTEL_LOG_LEVEL=debug`.
#[derive(Debug, thiserror::Error)]
enum MetricsError {
    /// The export's runtime, or the HTTP connection and its reads and writes.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Connect(tonic::transport::Error),
    #[error(transparent)]
    Export(tonic::Status),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("{0}: only http:// is supported for metrics")]
    Scheme(String),
    #[error("no address")]
    NoAddress,
    #[error("HTTP status {0}")]
    Status(String),
}

fn send_grpc(
    endpoint: String,
    request: ExportMetricsServiceRequest,
    timeout: Duration,
) -> Result<(), MetricsError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let call = async {
            let mut client = MetricsServiceClient::connect(endpoint)
                .await
                .map_err(MetricsError::Connect)?;
            client
                .export(request)
                .await
                .map(|_| ())
                .map_err(MetricsError::Export)
        };
        tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(MetricsError::Timeout(timeout)))
    });
    runtime.shutdown_background();
    result
}

/// POSTs the protobuf body to a plaintext `http://host[:port]/path` URL.
fn send_http(url: &str, body: &[u8], timeout: Duration) -> Result<(), MetricsError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| MetricsError::Scheme(url.into()))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let addr = with_port
        .to_socket_addrs()?
        .next()
        .ok_or(MetricsError::NoAddress)?;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut status = [0u8; 12];
    s.read_exact(&mut status)?;
    let line = String::from_utf8_lossy(&status);
    if line.starts_with("HTTP/1.1 2") || line.starts_with("HTTP/1.0 2") {
        Ok(())
    } else {
        Err(MetricsError::Status(line.into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::fake_env as env;

    #[test]
    fn target_resolution() {
        assert_eq!(target_in(&env(&[])), None);
        let g = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317");
        assert_eq!(
            target_in(&env(&[g])),
            Some(Target::Grpc("http://127.0.0.1:4317".into()))
        );
        assert_eq!(
            target_in(&env(&[g, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")])),
            Some(Target::Http("http://127.0.0.1:4317/v1/metrics".into()))
        );
        assert_eq!(
            target_in(&env(&[
                ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://h:1/m"),
                ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf")
            ])),
            Some(Target::Http("http://h:1/m".into()))
        );
        assert_eq!(
            target_in(&env(&[g, ("OTEL_METRICS_EXPORTER", "none")])),
            None
        );
        assert_eq!(target_in(&env(&[g, ("OTEL_SDK_DISABLED", "true")])), None);
    }

    #[test]
    fn request_is_a_delta_monotonic_sum() {
        let start = SystemTime::now() - Duration::from_secs(1);
        let r = request(
            3,
            start,
            &[("sandbox.id", "ar-1".into())],
            Resource::default(),
        );
        let m = &r.resource_metrics[0].scope_metrics[0].metrics[0];
        assert_eq!(m.name, VIOLATION_COUNT);
        let Some(metric::Data::Sum(sum)) = &m.data else {
            panic!("not a sum")
        };
        assert!(sum.is_monotonic);
        assert_eq!(
            sum.aggregation_temporality,
            AggregationTemporality::Delta as i32
        );
        let p = &sum.data_points[0];
        assert_eq!(p.value, Some(number_data_point::Value::AsInt(3)));
        assert!(p.time_unix_nano > p.start_time_unix_nano);
        assert_eq!(p.attributes[0].key, "sandbox.id");
    }
}
