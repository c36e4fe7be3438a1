//! The Connect protocol's wire format for envd's RPCs, JSON codec (the codec the E2B SDKs use
//! for envd: `ENVD_JSON_CODEC`), on the `connectrpc` crate (connectrpc.com's Rust runtime,
//! <https://github.com/connectrpc/connect-rust>): its envelope codec ([`Envelope`]), error
//! codes and error JSON ([`ConnectError`]), content-type detection ([`Protocol::detect`]) and
//! compression ([`CompressionRegistry`], gzip). This module only says which of them a call
//! takes:
//! - unary: a `POST /pkg.Service/Method` with `Content-Type: application/json` and the
//!   request message as its body (`Content-Encoding: gzip` decompressed); the answer is the
//!   response message (`200`, `application/json`) or an error (`{"code","message"}` with the
//!   code's HTTP status).
//! - server streaming: request and answer are `application/connect+json` and made of
//!   envelopes; the request is one message (compressed with its `Connect-Content-Encoding`
//!   if flagged so), the answer messages then an end-of-stream envelope holding `{}` or
//!   `{"error": {"code","message"}}`.
//! - client streaming ([`ClientStream`]): the request is envelopes read as they arrive, the
//!   answer one message then the end-of-stream envelope.
//!
//! The binary protobuf codec (`application/proto`, `application/connect+proto`) is refused
//! (`unimplemented`): the SDKs send JSON, and the message types are serde structs of the
//! proto3 JSON mapping (docs/e2b.md says why the crate's generated service layer is not used).

use std::sync::LazyLock;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use connectrpc::codec::CodecFormat;
use connectrpc::compression::{CompressionRegistry, GzipProvider};
use connectrpc::envelope::{flags, Envelope};
use connectrpc::error::ConnectError;
use connectrpc::protocol::{Protocol, RequestProtocol};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::error::{Code, RpcError, RpcResult};

/// Flag of a compressed envelope.
pub const FLAG_COMPRESSED: u8 = flags::COMPRESSED;
/// Flag of the end-of-stream envelope.
pub const FLAG_END_STREAM: u8 = flags::END_STREAM;
/// Length of an envelope's prefix.
pub const PREFIX: usize = 5;
/// Content type of a unary JSON message.
pub const UNARY_JSON: &str = "application/json";
/// Content type of a streaming JSON RPC.
pub const STREAM_JSON: &str = "application/connect+json";
/// Envelopes of a stream queued ahead of a slow client (then the producer waits).
pub const STREAM_QUEUE: usize = 16;
/// Largest request message, decompressed (a request body is bounded by the listener's
/// `--max-request-body` before this).
pub const MAX_MESSAGE: usize = 16 << 20;

/// The encodings a request may be compressed with: gzip.
static COMPRESSION: LazyLock<CompressionRegistry> =
    LazyLock::new(|| CompressionRegistry::new().register(GzipProvider::default()));

impl From<ConnectError> for RpcError {
    fn from(e: ConnectError) -> Self {
        RpcError::new(e.code, e.message.unwrap_or_default())
    }
}

/// One envelope: `flags`, the length, `payload`.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    Envelope {
        flags,
        data: Bytes::copy_from_slice(payload),
    }
    .encode()
}

/// A message envelope of `msg` as JSON.
pub fn message<T: Serialize>(msg: &T) -> Bytes {
    Envelope::data(Bytes::from(
        serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec()),
    ))
    .encode()
}

/// The end-of-stream envelope: `{}`, or `{"error": ...}`.
pub fn end_stream(error: Option<&RpcError>) -> Bytes {
    let v = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({ "error": e.json() }),
    };
    Envelope::end_stream(Bytes::from(v.to_string())).encode()
}

/// The one message envelope of a server-streaming request's body (its flags: data or
/// compressed). Errors (`invalid_argument`) for a short body, a length past its end, more
/// than one envelope or an end-of-stream flag; `resource_exhausted` past [`MAX_MESSAGE`].
pub fn single_envelope(body: &[u8]) -> RpcResult<Envelope> {
    if body.len() < PREFIX {
        return Err(RpcError::invalid(format!(
            "request body of {} bytes: shorter than an envelope's prefix",
            body.len()
        )));
    }
    let mut buf = BytesMut::from(body);
    let Some(env) = Envelope::decode_with_limit(&mut buf, MAX_MESSAGE)? else {
        return Err(RpcError::invalid(format!(
            "request envelope of {} bytes, {} sent",
            u32::from_be_bytes([body[1], body[2], body[3], body[4]]),
            body.len() - PREFIX
        )));
    };
    if !buf.is_empty() {
        return Err(RpcError::invalid(
            "more than one request envelope: the RPC takes one message",
        ));
    }
    if env.flags & !FLAG_COMPRESSED != 0 {
        return Err(RpcError::invalid(format!(
            "request envelope flags {:#04x}: expected a message",
            env.flags
        )));
    }
    Ok(env)
}

/// The request's codec, by its content type (the crate's detection).
fn detect(headers: &HeaderMap) -> Option<RequestProtocol> {
    Protocol::detect(headers).filter(|p| p.protocol == Protocol::Connect)
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

fn decode<T: DeserializeOwned>(json: &[u8]) -> RpcResult<T> {
    let json = if json.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        json
    };
    serde_json::from_slice(json).map_err(|e| RpcError::invalid(format!("invalid message: {e}")))
}

/// `data` decompressed by `encoding` (none: identity), within [`MAX_MESSAGE`];
/// `unimplemented` for an encoding other than gzip.
fn decompress(encoding: Option<&str>, data: Bytes) -> RpcResult<Bytes> {
    let encoding = encoding.unwrap_or("identity").to_ascii_lowercase();
    Ok(COMPRESSION.decompress_with_limit(&encoding, data, MAX_MESSAGE)?)
}

fn wrong_type(headers: &HeaderMap, want: &str) -> RpcError {
    let got = header(headers, "content-type").unwrap_or("");
    RpcError::new(
        Code::InvalidArgument,
        format!("content type {got:?}: expected {want}"),
    )
}

/// A unary request's message (`application/json`, gzip or not).
pub fn unary_request<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> RpcResult<T> {
    match detect(headers) {
        Some(p) if !p.is_streaming && p.codec_format == CodecFormat::Json => {
            let body = decompress(
                header(headers, "content-encoding"),
                Bytes::copy_from_slice(body),
            )?;
            decode(&body)
        }
        Some(p) if !p.is_streaming => Err(RpcError::unimplemented(
            "the binary protobuf codec is not served: use JSON (application/json)",
        )),
        _ => Err(wrong_type(headers, UNARY_JSON)),
    }
}

/// A unary RPC's request message, as a handler's last argument: [`unary_request`] of the
/// body ([`read`]); an error answered as the [`RpcError`].
pub struct Unary<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Unary<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        Ok(Unary(
            read(req, state, unary_request, IntoResponse::into_response).await?,
        ))
    }
}

/// A server-streaming RPC's request message, as a handler's last argument: [`stream_request`]
/// of the body ([`read`]); an error answered as the stream's end ([`stream_error`]).
pub struct Streamed<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Streamed<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        Ok(Streamed(
            read(req, state, stream_request, |e| stream_error(&e)).await?,
        ))
    }
}

/// A request's message: its whole body read as axum reads [`Bytes`] (within the body limit;
/// a rejection answered as axum answers it), then `decode`d with the request's headers (an
/// error answered by `refuse`).
async fn read<T, S: Send + Sync>(
    req: Request,
    state: &S,
    decode: fn(&HeaderMap, &[u8]) -> RpcResult<T>,
    refuse: fn(RpcError) -> Response,
) -> Result<T, Response> {
    let headers = req.headers().clone();
    let body = Bytes::from_request(req, state)
        .await
        .map_err(IntoResponse::into_response)?;
    decode(&headers, &body).map_err(refuse)
}

/// A server-streaming request's message (`application/connect+json`, one envelope).
pub fn stream_request<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> RpcResult<T> {
    match detect(headers) {
        Some(p) if p.is_streaming && p.codec_format == CodecFormat::Json => {
            let env = single_envelope(body)?;
            let data = if env.is_compressed() {
                let Some(enc) = header(headers, "connect-content-encoding") else {
                    return Err(RpcError::invalid(
                        "a compressed envelope without Connect-Content-Encoding",
                    ));
                };
                decompress(Some(enc), env.data)?
            } else {
                env.data
            };
            decode(&data)
        }
        Some(p) if p.is_streaming => Err(RpcError::unimplemented(
            "the binary protobuf codec is not served: use JSON (application/connect+json)",
        )),
        _ => Err(wrong_type(headers, STREAM_JSON)),
    }
}

/// The messages of a client-streaming request (`application/connect+json`), read from its
/// body as they arrive: each envelope within [`MAX_MESSAGE`], compressed ones by the
/// request's `Connect-Content-Encoding`; an end-of-stream envelope from the client is a
/// protocol error.
pub struct ClientStream {
    body: axum::body::BodyDataStream,
    buf: BytesMut,
    encoding: Option<String>,
    done: bool,
}

impl ClientStream {
    /// The stream of a request with these headers; the codec is checked as for
    /// [`stream_request`].
    pub fn new(headers: &HeaderMap, body: Body) -> RpcResult<ClientStream> {
        match detect(headers) {
            Some(p) if p.is_streaming && p.codec_format == CodecFormat::Json => {}
            Some(p) if p.is_streaming => {
                return Err(RpcError::unimplemented(
                    "the binary protobuf codec is not served: use JSON (application/connect+json)",
                ))
            }
            _ => return Err(wrong_type(headers, STREAM_JSON)),
        }
        Ok(ClientStream {
            body: body.into_data_stream(),
            buf: BytesMut::new(),
            encoding: header(headers, "connect-content-encoding").map(str::to_owned),
            done: false,
        })
    }

    /// The next message; `None` once the body ended after a whole envelope.
    pub async fn next<T: DeserializeOwned>(&mut self) -> RpcResult<Option<T>> {
        use futures_util::StreamExt;
        loop {
            if let Some(env) = Envelope::decode_with_limit(&mut self.buf, MAX_MESSAGE)? {
                if env.flags & !FLAG_COMPRESSED != 0 {
                    return Err(RpcError::invalid(format!(
                        "request envelope flags {:#04x}: expected a message",
                        env.flags
                    )));
                }
                let data = if env.is_compressed() {
                    let Some(enc) = self.encoding.as_deref() else {
                        return Err(RpcError::invalid(
                            "a compressed envelope without Connect-Content-Encoding",
                        ));
                    };
                    decompress(Some(enc), env.data)?
                } else {
                    env.data
                };
                return decode(&data).map(Some);
            }
            if self.done {
                return match self.buf.len() {
                    0 => Ok(None),
                    n => Err(RpcError::invalid(format!(
                        "the request ended inside an envelope ({n} bytes of it)"
                    ))),
                };
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    return Err(RpcError::new(
                        Code::Canceled,
                        format!("reading the request: {e}"),
                    ))
                }
                None => self.done = true,
            }
        }
    }
}

/// The answer of a client-streaming RPC: its one message `{}` and the end of the stream, or
/// only the end carrying `error`.
pub fn client_stream_response(error: Option<&RpcError>) -> Response {
    match error {
        Some(e) => stream_error(e),
        None => {
            let mut body = BytesMut::from(&message(&serde_json::json!({}))[..]);
            body.extend_from_slice(&end_stream(None));
            (
                StatusCode::OK,
                [("content-type", STREAM_JSON)],
                body.freeze(),
            )
                .into_response()
        }
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

    fn gzip(data: &[u8]) -> Vec<u8> {
        COMPRESSION.compress("gzip", data).unwrap().to_vec()
    }

    #[test]
    fn envelopes_round_trip() {
        let e = envelope(0, br#"{"a":1}"#);
        assert_eq!(&e[..PREFIX], &[0, 0, 0, 0, 7]);
        assert_eq!(&single_envelope(&e).unwrap().data[..], br#"{"a":1}"#);
    }

    #[test]
    fn bad_envelopes_are_refused() {
        let code = |b: &[u8]| single_envelope(b).unwrap_err().code;
        assert_eq!(code(&[0, 0, 0]), Code::InvalidArgument);
        // Length past the end.
        assert_eq!(code(&[0, 0, 0, 0, 9, b'{', b'}']), Code::InvalidArgument);
        // Two envelopes.
        let mut two = envelope(0, b"{}").to_vec();
        two.extend_from_slice(&envelope(0, b"{}"));
        assert_eq!(code(&two), Code::InvalidArgument);
        assert_eq!(
            code(&envelope(FLAG_END_STREAM, b"{}")),
            Code::InvalidArgument
        );
        // A declared length past the limit: refused before it is read.
        assert_eq!(code(&[0, 0xff, 0xff, 0xff, 0xff]), Code::ResourceExhausted);
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

    #[derive(serde::Deserialize)]
    struct M {
        #[serde(default)]
        path: String,
    }

    /// A request of `content_type` and `body`, as a handler gets it.
    fn request(content_type: &str, body: impl Into<Body>) -> Request {
        Request::builder()
            .header("content-type", content_type)
            .body(body.into())
            .unwrap()
    }

    /// What the client reads when extractor `T` refuses `req`: (status, content type, body).
    async fn refusal<T: FromRequest<(), Rejection = Response>>(
        req: Request,
    ) -> (StatusCode, String, Bytes) {
        let Err(r) = T::from_request(req, &()).await else {
            panic!("the request was taken")
        };
        let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
        let status = r.status();
        let body = axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, ct, body)
    }

    #[tokio::test]
    async fn handlers_get_the_decoded_message_or_the_connect_error() {
        let req = request(UNARY_JSON, r#"{"path":"/u"}"#);
        let Ok(Unary(m)) = Unary::<M>::from_request(req, &()).await else {
            panic!("a unary JSON message refused");
        };
        assert_eq!(m.path, "/u");
        let req = request(STREAM_JSON, envelope(0, br#"{"path":"/s"}"#));
        let Ok(Streamed(m)) = Streamed::<M>::from_request(req, &()).await else {
            panic!("a streaming JSON message refused");
        };
        assert_eq!(m.path, "/s");
        // A unary RPC's error is a Connect error JSON with its code's status.
        let (status, ct, body) = refusal::<Unary<M>>(request(STREAM_JSON, "{}")).await;
        assert_eq!((status, ct.as_str()), (StatusCode::BAD_REQUEST, UNARY_JSON));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], "invalid_argument", "{v}");
        // A streaming RPC's error is the end of the stream (200), carrying the error.
        let (status, ct, body) = refusal::<Streamed<M>>(request(UNARY_JSON, "{}")).await;
        assert_eq!((status, ct.as_str()), (StatusCode::OK, STREAM_JSON));
        assert_eq!(body[0], FLAG_END_STREAM);
        let v: serde_json::Value = serde_json::from_slice(&body[PREFIX..]).unwrap();
        assert_eq!(v["error"]["code"], "invalid_argument", "{v}");
    }

    #[test]
    fn requests_need_the_json_codec() {
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
        h.insert("content-type", "text/plain".parse().unwrap());
        assert_eq!(
            unary_request::<M>(&h, b"{}").err().unwrap().code,
            Code::InvalidArgument
        );
        h.insert("content-type", "application/connect+json".parse().unwrap());
        let m: M = stream_request(&h, &envelope(0, br#"{"path":"/y"}"#)).unwrap();
        assert_eq!(m.path, "/y");
    }

    fn client_stream(headers: &HeaderMap, chunks: Vec<Vec<u8>>) -> ClientStream {
        let stream = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::convert::Infallible>(Bytes::from(c))),
        );
        ClientStream::new(headers, Body::from_stream(stream)).unwrap()
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_client_stream_reads_envelopes_across_chunks() {
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/connect+json".parse().unwrap());
        h.insert("connect-content-encoding", "gzip".parse().unwrap());
        let mut all = envelope(0, br#"{"path":"/a"}"#).to_vec();
        all.extend_from_slice(&envelope(FLAG_COMPRESSED, &gzip(br#"{"path":"/b"}"#)));
        // Split mid-prefix and mid-message.
        let chunks = vec![all[..3].to_vec(), all[3..9].to_vec(), all[9..].to_vec()];
        block_on(async {
            let mut s = client_stream(&h, chunks);
            assert_eq!(s.next::<M>().await.unwrap().unwrap().path, "/a");
            assert_eq!(s.next::<M>().await.unwrap().unwrap().path, "/b");
            assert!(s.next::<M>().await.unwrap().is_none());
            // Cut inside an envelope, or a client's end-of-stream flag: protocol errors.
            let cut = envelope(0, b"{}")[..4].to_vec();
            let mut s = client_stream(&h, vec![cut]);
            assert_eq!(
                s.next::<M>().await.err().unwrap().code,
                Code::InvalidArgument
            );
            let mut s = client_stream(&h, vec![envelope(FLAG_END_STREAM, b"{}").to_vec()]);
            assert_eq!(
                s.next::<M>().await.err().unwrap().code,
                Code::InvalidArgument
            );
        });
        h.insert("content-type", "application/json".parse().unwrap());
        assert!(ClientStream::new(&h, Body::empty()).is_err());
    }

    #[test]
    fn a_client_streams_answer_is_one_message_then_its_end() {
        let r = client_stream_response(None);
        assert_eq!(r.headers()["content-type"], STREAM_JSON);
        let body = block_on(axum::body::to_bytes(r.into_body(), 1024)).unwrap();
        let mut expect = message(&serde_json::json!({})).to_vec();
        expect.extend_from_slice(&end_stream(None));
        assert_eq!(&body[..], &expect[..]);
    }

    #[test]
    fn gzip_requests_are_decompressed_and_other_encodings_refused() {
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/json".parse().unwrap());
        h.insert("content-encoding", "gzip".parse().unwrap());
        let m: M = unary_request(&h, &gzip(br#"{"path":"/z"}"#)).unwrap();
        assert_eq!(m.path, "/z");
        h.insert("content-encoding", "br".parse().unwrap());
        assert_eq!(
            unary_request::<M>(&h, b"{}").err().unwrap().code,
            Code::Unimplemented
        );
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/connect+json".parse().unwrap());
        let body = envelope(FLAG_COMPRESSED, &gzip(br#"{"path":"/w"}"#));
        // Flagged compressed with no encoding named: a protocol error.
        assert_eq!(
            stream_request::<M>(&h, &body).err().unwrap().code,
            Code::InvalidArgument
        );
        h.insert("connect-content-encoding", "gzip".parse().unwrap());
        let m: M = stream_request(&h, &body).unwrap();
        assert_eq!(m.path, "/w");
        // A gzip bomb stops at the limit.
        let bomb = envelope(FLAG_COMPRESSED, &gzip(&vec![b' '; MAX_MESSAGE + 1]));
        assert_eq!(
            stream_request::<M>(&h, &bomb).err().unwrap().code,
            Code::ResourceExhausted
        );
    }
}
