//! The Connect protocol's wire format, JSON codec only (the codec the E2B SDKs use for envd:
//! `ENVD_JSON_CODEC`), for envd's RPCs:
//! - unary: a `POST /pkg.Service/Method` with `Content-Type: application/json` and the
//!   request message as its body; the answer is the response message (`200`,
//!   `application/json`) or an error (`{"code","message"}` with the code's HTTP status).
//! - server streaming: request and answer are `application/connect+json` and made of
//!   envelopes, each a flags byte, a 4-byte big-endian length and that many bytes of JSON;
//!   the request is one message, the answer messages then an end-of-stream envelope (flag
//!   `0x02`) holding `{}` or `{"error": {"code","message"}}`.
//!
//! Compressed messages (flag `0x01`, `Connect-Content-Encoding`) and the binary protobuf codec
//! (`application/proto`, `application/connect+proto`) are refused (`unimplemented`): the
//! SDK sends neither (docs/e2b.md). No kept Rust crate serves Connect streaming without a
//! protobuf code generator (see docs/e2b.md), so the framing is this small module.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::error::{Code, RpcError, RpcResult};

/// Flag of a compressed envelope.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag of the end-of-stream envelope.
pub const FLAG_END_STREAM: u8 = 0x02;
/// Length of an envelope's prefix.
pub const PREFIX: usize = 5;
/// Content type of a unary JSON message.
pub const UNARY_JSON: &str = "application/json";
/// Content type of a streaming JSON RPC.
pub const STREAM_JSON: &str = "application/connect+json";
/// Envelopes of a stream queued ahead of a slow client (then the producer waits).
pub const STREAM_QUEUE: usize = 16;

/// One envelope: `flags`, the length, `payload`.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(PREFIX + payload.len());
    out.push(flags);
    // A payload over 4 GiB is never made here (messages are JSON of bounded chunks).
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// A message envelope of `msg` as JSON.
pub fn message<T: Serialize>(msg: &T) -> Bytes {
    envelope(
        0,
        &serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// The end-of-stream envelope: `{}`, or `{"error": ...}`.
pub fn end_stream(error: Option<&RpcError>) -> Bytes {
    let v = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({ "error": e.json() }),
    };
    envelope(FLAG_END_STREAM, v.to_string().as_bytes())
}

/// The one message envelope of a server-streaming request's body: its payload. Errors
/// (`invalid_argument`) for a short or long body, a length past its end, more than one
/// envelope or an end-of-stream flag; `unimplemented` for a compressed one.
pub fn single_envelope(body: &[u8]) -> RpcResult<&[u8]> {
    if body.len() < PREFIX {
        return Err(RpcError::invalid(format!(
            "request body of {} bytes: shorter than an envelope's prefix",
            body.len()
        )));
    }
    let flags = body[0];
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if flags & FLAG_COMPRESSED != 0 {
        return Err(RpcError::unimplemented(
            "compressed messages are not served",
        ));
    }
    if flags != 0 {
        return Err(RpcError::invalid(format!(
            "request envelope flags {flags:#04x}: expected a message (0)"
        )));
    }
    let rest = &body[PREFIX..];
    if rest.len() < len {
        return Err(RpcError::invalid(format!(
            "request envelope of {len} bytes, {} sent",
            rest.len()
        )));
    }
    if rest.len() > len {
        return Err(RpcError::invalid(
            "more than one request envelope: the RPC takes one message",
        ));
    }
    Ok(rest)
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

fn check_encoding(headers: &HeaderMap) -> RpcResult<()> {
    for h in ["content-encoding", "connect-content-encoding"] {
        if let Some(v) = headers.get(h).and_then(|v| v.to_str().ok()) {
            if !v.eq_ignore_ascii_case("identity") {
                return Err(RpcError::unimplemented(format!(
                    "{h}: {v} is not served (identity only)"
                )));
            }
        }
    }
    Ok(())
}

fn decode<T: DeserializeOwned>(json: &[u8]) -> RpcResult<T> {
    let json = if json.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        json
    };
    serde_json::from_slice(json).map_err(|e| RpcError::invalid(format!("invalid message: {e}")))
}

/// A unary request's message (`application/json`).
pub fn unary_request<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> RpcResult<T> {
    check_encoding(headers)?;
    match content_type(headers).as_str() {
        UNARY_JSON => decode(body),
        "application/proto" => Err(RpcError::unimplemented(
            "the binary protobuf codec is not served: use JSON (application/json)",
        )),
        other => Err(RpcError::new(
            Code::InvalidArgument,
            format!("content type {other:?}: expected {UNARY_JSON}"),
        )),
    }
}

/// A server-streaming request's message (`application/connect+json`, one envelope).
pub fn stream_request<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> RpcResult<T> {
    check_encoding(headers)?;
    match content_type(headers).as_str() {
        STREAM_JSON => decode(single_envelope(body)?),
        "application/connect+proto" => Err(RpcError::unimplemented(
            "the binary protobuf codec is not served: use JSON (application/connect+json)",
        )),
        other => Err(RpcError::new(
            Code::InvalidArgument,
            format!("content type {other:?}: expected {STREAM_JSON}"),
        )),
    }
}

/// A unary answer.
pub fn unary_response<T: Serialize>(msg: &T) -> Response {
    (
        StatusCode::OK,
        [("content-type", UNARY_JSON)],
        serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec()),
    )
        .into_response()
}

/// The queue of a stream's envelopes ([`STREAM_QUEUE`]; then the sender waits for the client).
pub fn stream_queue() -> (mpsc::Sender<Bytes>, mpsc::Receiver<Bytes>) {
    mpsc::channel(STREAM_QUEUE)
}

/// A streaming answer of the envelopes `rx` yields, up to and with the end-of-stream
/// envelope ([`end_stream`]): the answer ends there, whoever still holds a sender (a reader
/// of a pipe a child process keeps open).
pub fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures_util::stream::unfold((rx, false), |(mut rx, ended)| async move {
        if ended {
            return None;
        }
        let b = rx.recv().await?;
        let end = b.first().is_some_and(|f| f & FLAG_END_STREAM != 0);
        Some((Ok::<_, std::convert::Infallible>(b), (rx, end)))
    });
    (
        StatusCode::OK,
        [("content-type", STREAM_JSON)],
        Body::from_stream(stream),
    )
        .into_response()
}

/// A stream that is only its end, carrying `error` (a streaming RPC's errors are answered so,
/// with status 200).
pub fn stream_error(error: &RpcError) -> Response {
    (
        StatusCode::OK,
        [("content-type", STREAM_JSON)],
        end_stream(Some(error)),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip() {
        let e = envelope(0, br#"{"a":1}"#);
        assert_eq!(&e[..PREFIX], &[0, 0, 0, 0, 7]);
        assert_eq!(single_envelope(&e).unwrap(), br#"{"a":1}"#);
    }

    #[test]
    fn bad_envelopes_are_refused() {
        assert_eq!(
            single_envelope(&[0, 0, 0]).unwrap_err().code,
            Code::InvalidArgument
        );
        // Length past the end.
        assert_eq!(
            single_envelope(&[0, 0, 0, 0, 9, b'{', b'}'])
                .unwrap_err()
                .code,
            Code::InvalidArgument
        );
        // Two envelopes.
        let mut two = envelope(0, b"{}").to_vec();
        two.extend_from_slice(&envelope(0, b"{}"));
        assert_eq!(
            single_envelope(&two).unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(
            single_envelope(&envelope(FLAG_COMPRESSED, b"x"))
                .unwrap_err()
                .code,
            Code::Unimplemented
        );
        assert_eq!(
            single_envelope(&envelope(FLAG_END_STREAM, b"{}"))
                .unwrap_err()
                .code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn the_end_of_a_stream_carries_its_error() {
        let ok = end_stream(None);
        assert_eq!(ok[0], FLAG_END_STREAM);
        assert_eq!(&ok[PREFIX..], b"{}");
        let err = end_stream(Some(&RpcError::new(Code::NotFound, "gone")));
        let v: serde_json::Value = serde_json::from_slice(&err[PREFIX..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["message"], "gone");
    }

    #[test]
    fn requests_need_the_json_codec() {
        #[derive(serde::Deserialize)]
        struct M {
            #[serde(default)]
            path: String,
        }
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/json".parse().unwrap());
        let m: M = unary_request(&h, br#"{"path":"/x"}"#).unwrap();
        assert_eq!(m.path, "/x");
        let m: M = unary_request(&h, b"").unwrap();
        assert_eq!(m.path, "");
        h.insert("content-type", "application/proto".parse().unwrap());
        assert_eq!(
            unary_request::<M>(&h, b"").err().unwrap().code,
            Code::Unimplemented
        );
        h.insert("content-type", "application/connect+json".parse().unwrap());
        let m: M = stream_request(&h, &envelope(0, br#"{"path":"/y"}"#)).unwrap();
        assert_eq!(m.path, "/y");
        h.insert("connect-content-encoding", "gzip".parse().unwrap());
        assert_eq!(
            stream_request::<M>(&h, &envelope(0, b"{}"))
                .err()
                .unwrap()
                .code,
            Code::Unimplemented
        );
    }
}
