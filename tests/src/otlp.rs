//! A real OTLP trace (and metrics) receiver for end-to-end tests.
//!
//! [`OtlpReceiver::grpc`] runs an OTLP/gRPC collector (tonic, the generated
//! `TraceService` and `MetricsService` from `opentelemetry-proto`); [`OtlpReceiver::http`]
//! runs an OTLP/HTTP receiver (`POST /v1/traces`, protobuf or JSON body, and
//! `POST /v1/metrics`, protobuf, hyper). Both listen on an ephemeral
//! port on 127.0.0.1, in a background thread with its own tokio runtime, and store every span
//! they receive. Dropping the receiver stops the server.
//!
//! ```no_run
//! use agentrun_e2e::otlp::OtlpReceiver;
//! use std::time::Duration;
//!
//! let rx = OtlpReceiver::grpc();
//! // ... run something with OTEL_EXPORTER_OTLP_ENDPOINT=rx.endpoint() ...
//! let spans = rx.wait_for_spans(1, Duration::from_secs(10));
//! assert_eq!(spans[0].name, "sandbox.exec");
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValueKind;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use prost::Message as _;
use tokio::sync::oneshot;

/// Largest request body the HTTP receiver accepts.
const MAX_BODY: usize = 16 << 20;

/// Which OTLP transport a receiver speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`).
    Grpc,
    /// OTLP/HTTP (`OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`; JSON bodies are accepted too).
    HttpProtobuf,
}

impl Protocol {
    /// The `OTEL_EXPORTER_OTLP_PROTOCOL` value for this transport.
    pub fn env_value(self) -> &'static str {
        match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// One span as received, flattened for assertions.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedSpan {
    /// Span name.
    pub name: String,
    /// Trace id, 32 lowercase hex digits.
    pub trace_id: String,
    /// Span id, 16 lowercase hex digits.
    pub span_id: String,
    /// Parent span id, 16 lowercase hex digits; empty for a root span.
    pub parent_span_id: String,
    /// Span kind as the OTLP enum value (1 internal, 2 server, 3 client, ...).
    pub kind: i32,
    /// Span attributes; values rendered as strings (`true`, `3`, `0.5`, `text`).
    pub attributes: HashMap<String, String>,
    /// The OTLP type of each attribute: `string`, `bool`, `int`, `double`, `bytes`, `array`,
    /// `kvlist` (or `empty`).
    pub attribute_types: HashMap<String, &'static str>,
    /// Status code: 0 unset, 1 ok, 2 error.
    pub status_code: i32,
    /// Status message.
    pub status_message: String,
    /// Resource attributes, rendered like `attributes`.
    pub resource: HashMap<String, String>,
    /// Instrumentation scope name.
    pub scope_name: String,
    /// Start time, ns since the Unix epoch.
    pub start_time_unix_nano: u64,
    /// End time, ns since the Unix epoch.
    pub end_time_unix_nano: u64,
}

impl ReceivedSpan {
    /// Status code value for `Error`.
    pub const STATUS_ERROR: i32 = 2;

    /// Asserts that attribute `key` exists with OTLP type `ty` (`string`, `int`, `bool`,
    /// `double`, ...) and returns its string rendering.
    pub fn typed_attr(&self, key: &str, ty: &str) -> &str {
        let value = self.attr(key);
        let actual = self.attribute_types.get(key).copied().unwrap_or("missing");
        assert_eq!(
            actual, ty,
            "attribute {key:?} = {value:?} of span {:?} has type {actual}, expected {ty}",
            self.name
        );
        value
    }

    /// Duration from start to end.
    pub fn duration(&self) -> Duration {
        Duration::from_nanos(
            self.end_time_unix_nano
                .saturating_sub(self.start_time_unix_nano),
        )
    }

    /// An attribute's string rendering, or a panic naming the missing key and what is there.
    pub fn attr(&self, key: &str) -> &str {
        match self.attributes.get(key) {
            Some(v) => v,
            None => panic!(
                "span {:?} has no attribute {key:?}; attributes: {:#?}",
                self.name, self.attributes
            ),
        }
    }
}

/// One number data point of a received metric, flattened for assertions.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedPoint {
    /// Metric name.
    pub name: String,
    /// `sum` or `gauge` (others are not flattened).
    pub kind: &'static str,
    /// Sums: monotonic.
    pub monotonic: bool,
    /// Sums: 1 delta, 2 cumulative.
    pub temporality: i32,
    /// The value (doubles truncated).
    pub value: i64,
    /// Data point attributes, rendered like span attributes.
    pub attributes: HashMap<String, String>,
}

/// Received spans plus a condition variable to wait on them.
#[derive(Default)]
struct Store {
    /// Metric data points received.
    points: Mutex<Vec<ReceivedPoint>>,
    spans: Mutex<Vec<ReceivedSpan>>,
    changed: Condvar,
    requests: AtomicUsize,
    /// Request headers (gRPC metadata) of each export request, names lowercase.
    headers: Mutex<Vec<HashMap<String, String>>>,
}

impl Store {
    fn add_metrics(&self, request: ExportMetricsServiceRequest) {
        use opentelemetry_proto::tonic::metrics::v1::{metric::Data, number_data_point::Value};
        let mut out = Vec::new();
        for rm in request.resource_metrics {
            for sm in rm.scope_metrics {
                for m in sm.metrics {
                    let (kind, monotonic, temporality, points) = match m.data {
                        Some(Data::Sum(s)) => (
                            "sum",
                            s.is_monotonic,
                            s.aggregation_temporality,
                            s.data_points,
                        ),
                        Some(Data::Gauge(g)) => ("gauge", false, 0, g.data_points),
                        _ => continue,
                    };
                    for p in points {
                        out.push(ReceivedPoint {
                            name: m.name.clone(),
                            kind,
                            monotonic,
                            temporality,
                            value: match p.value {
                                Some(Value::AsInt(i)) => i,
                                Some(Value::AsDouble(d)) => d as i64,
                                None => 0,
                            },
                            attributes: attributes(&p.attributes),
                        });
                    }
                }
            }
        }
        self.points
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(out);
        self.changed.notify_all();
    }

    fn add(&self, headers: &hyper::HeaderMap, request: ExportTraceServiceRequest) {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let headers = headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        self.headers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(headers);
        let spans = flatten(request);
        let mut guard = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        guard.extend(spans);
        self.changed.notify_all();
    }
}

/// An OTLP trace receiver on 127.0.0.1. Stops when dropped.
pub struct OtlpReceiver {
    protocol: Protocol,
    addr: SocketAddr,
    store: Arc<Store>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl OtlpReceiver {
    /// Starts an OTLP/gRPC collector.
    pub fn grpc() -> Self {
        Self::start(Protocol::Grpc)
    }

    /// Starts an OTLP/HTTP receiver (`POST /v1/traces`).
    pub fn http() -> Self {
        Self::start(Protocol::HttpProtobuf)
    }

    /// Starts a receiver for `protocol`. Panics if it cannot bind or start (test helper).
    pub fn start(protocol: Protocol) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("set listener non-blocking");
        let addr = listener.local_addr().expect("listener address");
        let store = Arc::new(Store::default());
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread_store = Arc::clone(&store);
        let thread = std::thread::Builder::new()
            .name(format!("otlp-{}-receiver", protocol.env_value()))
            .spawn(move || serve(protocol, listener, thread_store, shutdown_rx, ready_tx))
            .expect("spawn receiver thread");
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("OTLP receiver failed to start: {e}"),
            Err(e) => panic!("OTLP receiver did not start within 10 s: {e}"),
        }
        OtlpReceiver {
            protocol,
            addr,
            store,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        }
    }

    /// The transport this receiver speaks.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base endpoint, `http://127.0.0.1:<port>`, suitable for `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// (for HTTP the exporter appends `/v1/traces`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The environment that points an OTLP exporter at this receiver.
    pub fn otel_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint()),
            (
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                self.protocol.env_value().to_owned(),
            ),
        ]
    }

    /// Number of export requests received so far (including ones with no spans).
    pub fn request_count(&self) -> usize {
        self.store.requests.load(Ordering::SeqCst)
    }

    /// The headers (gRPC: metadata) of each export request received so far; names lowercase.
    pub fn request_headers(&self) -> Vec<HashMap<String, String>> {
        self.store
            .headers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until at least `n` metric data points have arrived (or `timeout` passed) and
    /// returns all of them.
    pub fn wait_for_points(&self, n: usize, timeout: Duration) -> Vec<ReceivedPoint> {
        let deadline = Instant::now() + timeout;
        let mut guard = self.store.spans.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let points = self
                .store
                .points
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let now = Instant::now();
            if points.len() >= n || now >= deadline {
                return points;
            }
            guard = self
                .store
                .changed
                .wait_timeout(guard, (deadline - now).min(Duration::from_millis(100)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The spans received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.store
            .spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until at least `n` spans have arrived or `timeout` has passed, and returns all
    /// spans received by then (possibly fewer than `n`).
    pub fn wait_for_spans(&self, n: usize, timeout: Duration) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        let mut guard = self.store.spans.lock().unwrap_or_else(|e| e.into_inner());
        while guard.len() < n {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            guard = self
                .store
                .changed
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        guard.clone()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            // The server thread stops within ~1 s of the signal (see `serve`).
            let _ = thread.join();
        }
    }
}

/// Body of the receiver thread: runs the server until `shutdown` fires.
fn serve(
    protocol: Protocol,
    listener: std::net::TcpListener,
    store: Arc<Store>,
    shutdown: oneshot::Receiver<()>,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("tokio runtime: {e}")));
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                let _ = ready.send(Err(format!("tokio listener: {e}")));
                return;
            }
        };
        let _ = ready.send(Ok(()));
        match protocol {
            Protocol::Grpc => {
                let incoming = tonic::transport::server::TcpIncoming::from(listener);
                let (stop_tx, stop_rx) = oneshot::channel::<()>();
                let server = tonic::transport::Server::builder()
                    .add_service(TraceServiceServer::new(GrpcCollector {
                        store: Arc::clone(&store),
                    }))
                    .add_service(MetricsServiceServer::new(GrpcCollector { store }))
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stop_rx.await;
                    });
                tokio::pin!(server);
                tokio::select! {
                    _ = &mut server => {}
                    _ = shutdown => {
                        // Graceful shutdown waits for open connections: not for long.
                        let _ = stop_tx.send(());
                        let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
                    }
                }
            }
            Protocol::HttpProtobuf => {
                tokio::select! {
                    _ = http_accept_loop(listener, store) => {}
                    _ = shutdown => {}
                }
            }
        }
    });
    // Abandon connection tasks still open (an exporter that keeps a connection alive).
    runtime.shutdown_timeout(Duration::from_secs(1));
}

/// The gRPC `TraceService`.
struct GrpcCollector {
    store: Arc<Store>,
}

#[tonic::async_trait]
impl TraceService for GrpcCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let headers = request.metadata().clone().into_headers();
        self.store.add(&headers, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tonic::async_trait]
impl MetricsService for GrpcCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.store.add_metrics(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

/// Accepts HTTP/1.1 connections forever, one task per connection.
async fn http_accept_loop(listener: tokio::net::TcpListener, store: Arc<Store>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let store = Arc::clone(&store);
                async move { Ok::<_, Infallible>(handle_http(req, &store).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// `POST /v1/traces` with an `application/x-protobuf` or `application/json` body.
async fn handle_http(req: Request<Incoming>, store: &Store) -> Response<Full<Bytes>> {
    if req.uri().path() == "/v1/metrics" && req.method() == Method::POST {
        let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return text(StatusCode::BAD_REQUEST, &format!("reading body: {e}")),
        };
        return match ExportMetricsServiceRequest::decode(body) {
            Ok(r) => {
                store.add_metrics(r);
                Response::builder()
                    .status(StatusCode::OK)
                    .header(hyper::header::CONTENT_TYPE, "application/x-protobuf")
                    .body(Full::new(Bytes::from(
                        ExportMetricsServiceResponse {
                            partial_success: None,
                        }
                        .encode_to_vec(),
                    )))
                    .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "response"))
            }
            Err(e) => text(StatusCode::BAD_REQUEST, &format!("decoding protobuf: {e}")),
        };
    }
    if req.uri().path() != "/v1/traces" {
        return text(
            StatusCode::NOT_FOUND,
            "only /v1/traces and /v1/metrics are served",
        );
    }
    if req.method() != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "POST only");
    }
    let headers = req.headers().clone();
    let json = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return text(StatusCode::BAD_REQUEST, &format!("reading body: {e}")),
    };
    let request = if json {
        match serde_json::from_slice::<ExportTraceServiceRequest>(&body) {
            Ok(r) => r,
            Err(e) => return text(StatusCode::BAD_REQUEST, &format!("decoding JSON: {e}")),
        }
    } else {
        match ExportTraceServiceRequest::decode(body) {
            Ok(r) => r,
            Err(e) => return text(StatusCode::BAD_REQUEST, &format!("decoding protobuf: {e}")),
        }
    };
    store.add(&headers, request);
    let response = ExportTraceServiceResponse {
        partial_success: None,
    };
    let (content_type, body) = if json {
        (
            "application/json",
            Bytes::from(serde_json::to_vec(&response).unwrap_or_else(|_| b"{}".to_vec())),
        )
    } else {
        (
            "application/x-protobuf",
            Bytes::from(response.encode_to_vec()),
        )
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(hyper::header::CONTENT_TYPE, content_type)
        .body(Full::new(body))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn text(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(msg.to_owned())));
    *r.status_mut() = status;
    r
}

/// Flattens an export request into one [`ReceivedSpan`] per span.
fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for rs in request.resource_spans {
        let resource = rs
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            let scope_name = ss.scope.map(|s| s.name).unwrap_or_default();
            for span in ss.spans {
                let (status_code, status_message) =
                    span.status.map(|s| (s.code, s.message)).unwrap_or_default();
                out.push(ReceivedSpan {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    attributes: attributes(&span.attributes),
                    attribute_types: span
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), type_name(kv.value.as_ref())))
                        .collect(),
                    status_code,
                    status_message,
                    resource: resource.clone(),
                    scope_name: scope_name.clone(),
                    start_time_unix_nano: span.start_time_unix_nano,
                    end_time_unix_nano: span.end_time_unix_nano,
                });
            }
        }
    }
    out
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), render(kv.value.as_ref())))
        .collect()
}

/// The OTLP type name of a value.
fn type_name(value: Option<&AnyValue>) -> &'static str {
    match value.and_then(|v| v.value.as_ref()) {
        None => "empty",
        Some(AnyValueKind::StringValue(_)) => "string",
        Some(AnyValueKind::BoolValue(_)) => "bool",
        Some(AnyValueKind::IntValue(_)) => "int",
        Some(AnyValueKind::DoubleValue(_)) => "double",
        Some(AnyValueKind::BytesValue(_)) => "bytes",
        Some(AnyValueKind::ArrayValue(_)) => "array",
        Some(AnyValueKind::KvlistValue(_)) => "kvlist",
        Some(_) => "other",
    }
}

/// Renders an OTLP value as a string: `true`, `3`, `0.5`, `text`, `[a, b]`.
fn render(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        None => String::new(),
        Some(AnyValueKind::StringValue(s)) => s.clone(),
        Some(AnyValueKind::BoolValue(b)) => b.to_string(),
        Some(AnyValueKind::IntValue(i)) => i.to_string(),
        Some(AnyValueKind::DoubleValue(d)) => d.to_string(),
        Some(AnyValueKind::BytesValue(b)) => hex(b),
        Some(AnyValueKind::ArrayValue(a)) => {
            let items: Vec<String> = a.values.iter().map(|v| render(Some(v))).collect();
            format!("[{}]", items.join(", "))
        }
        Some(AnyValueKind::KvlistValue(l)) => {
            let items: Vec<String> = l
                .values
                .iter()
                .map(|kv| format!("{}={}", kv.key, render(kv.value.as_ref())))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        Some(other) => format!("{other:?}"),
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    //! The receivers against a real OTLP client: the `opentelemetry-otlp` exporter through
    //! `agentrun-telemetry` is exercised by `tests/otel.rs`; here, raw requests.
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};

    fn request() -> ExportTraceServiceRequest {
        let kv = |k: &str, v: AnyValueKind| KeyValue {
            key: k.into(),
            value: Some(AnyValue { value: Some(v) }),
            ..Default::default()
        };
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", AnyValueKind::StringValue("t".into()))],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![Span {
                        trace_id: vec![0xab; 16],
                        span_id: vec![0x01; 8],
                        name: "sandbox.exec".into(),
                        attributes: vec![
                            kv("process.exit.code", AnyValueKind::IntValue(3)),
                            kv("sandbox.timed_out", AnyValueKind::BoolValue(false)),
                        ],
                        status: Some(Status {
                            code: 2,
                            message: "boom".into(),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    fn check(spans: &[ReceivedSpan]) {
        assert_eq!(spans.len(), 1, "{spans:#?}");
        let s = &spans[0];
        assert_eq!(s.name, "sandbox.exec");
        assert_eq!(s.trace_id, "ab".repeat(16));
        assert_eq!(s.span_id, "01".repeat(8));
        assert_eq!(s.parent_span_id, "");
        assert_eq!(s.typed_attr("process.exit.code", "int"), "3");
        assert_eq!(s.typed_attr("sandbox.timed_out", "bool"), "false");
        assert_eq!(s.status_code, ReceivedSpan::STATUS_ERROR);
        assert_eq!(
            s.resource.get("service.name").map(String::as_str),
            Some("t")
        );
    }

    #[test]
    fn grpc_receiver_collects_spans() {
        let rx = OtlpReceiver::grpc();
        let endpoint = rx.endpoint();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut client = TraceServiceClient::connect(endpoint).await.unwrap();
            client.export(request()).await.unwrap();
        });
        check(&rx.wait_for_spans(1, Duration::from_secs(10)));
        assert_eq!(rx.request_count(), 1);
    }

    #[test]
    fn http_receiver_collects_spans() {
        use std::io::{Read, Write};
        let rx = OtlpReceiver::http();
        let body = request().encode_to_vec();
        let mut conn = std::net::TcpStream::connect(rx.addr()).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write!(
            conn,
            "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .unwrap();
        conn.write_all(&body).unwrap();
        let mut response = String::new();
        let _ = conn.read_to_string(&mut response);
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        check(&rx.wait_for_spans(1, Duration::from_secs(10)));
    }

    #[test]
    fn wait_is_bounded() {
        let rx = OtlpReceiver::http();
        let t = Instant::now();
        assert!(rx.wait_for_spans(1, Duration::from_millis(200)).is_empty());
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
