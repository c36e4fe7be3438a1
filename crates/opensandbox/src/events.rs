//! The event streams of execd: a run's output, one bare-JSON event per line
//! (`{"type":"stdout","text":...}` and a blank line), as real execd streams them, through a
//! bounded queue: a client that reads slowly (or not at all) makes its process wait on its
//! pipe, as a terminal or `docker attach` does.

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::now_ms;

/// Events a run's stream holds for its client (each at most one line, 64 KiB of text).
pub const EVENT_QUEUE: usize = 16;

/// One event of a stream, as execd encodes it.
pub fn event(kind: &str, extra: Value) -> Bytes {
    let mut v = json!({"type": kind, "timestamp": now_ms()});
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    let mut s = serde_json::to_string(&v).expect("json");
    s.push_str("\n\n");
    Bytes::from(s)
}

/// The queue of a run's event stream: [`EVENT_QUEUE`] events, then senders wait for the client.
pub fn event_queue() -> (mpsc::Sender<Bytes>, mpsc::Receiver<Bytes>) {
    mpsc::channel(EVENT_QUEUE)
}

/// A streaming response of events.
pub fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let body = Body::from_stream(tokio_stream::StreamExt::map(
        stream,
        Ok::<_, std::convert::Infallible>,
    ));
    (
        [
            ("content-type", "text/event-stream"),
            ("cache-control", "no-cache"),
            ("x-accel-buffering", "no"),
        ],
        body,
    )
        .into_response()
}
