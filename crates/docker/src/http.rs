//! HTTP plumbing of the Docker API: version prefixes, query parsing with dockerd's boolean
//! rules (the [`Query`] extractor), JSON and error responses, streamed bodies, request bodies
//! read within [`Limits`]. The routes are in [`crate::routes`].

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body as RequestBody;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Response, StatusCode};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::error::DockerError;

/// The API version agentrun speaks (dockerd 25's), and the oldest prefix it accepts.
pub const API_VERSION: &str = "1.44";
pub const MIN_API_VERSION: &str = "1.24";

/// Why a streamed body stopped short (the client sees the connection end mid-body).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = BoxBody<Bytes, BoxError>;
pub type Reply = Response<Body>;
/// What a handler answers: its reply, or an error as `{"message"}`.
pub type DockerResult<T = Reply> = Result<T, DockerError>;

/// How much of a request body the API reads (`agentrun serve --max-request-body`,
/// `--max-upload`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A JSON body (create, exec), read whole.
    pub max_request_body: u64,
    /// A tar body (`put_archive`, a build context), streamed to disk.
    pub max_upload: u64,
}

/// How long, and how much of, the rest of a body over its limit is still read (and thrown
/// away) while the 413 goes out: a client still sending (the docker CLI, requests) reads the
/// answer instead of a broken pipe. Nothing of it is kept.
const DRAIN_AFTER_LIMIT: Duration = Duration::from_secs(10);
const DRAIN_BYTES: usize = 64 << 20;

/// The data of a request body, at most `limit` bytes: past them an error, `over` set, and the
/// rest of the body drained in the background ([`DRAIN_AFTER_LIMIT`]). A body dropped before
/// its end (its reader refused what it read: a build context over an unpack limit, a tar that
/// is not one) is drained the same way, so the client reads the answer.
struct CappedBody {
    body: Option<RequestBody>,
    left: u64,
    over: Arc<AtomicBool>,
}

impl CappedBody {
    fn new(body: RequestBody, limit: u64) -> (CappedBody, Arc<AtomicBool>) {
        let over = Arc::new(AtomicBool::new(false));
        let capped = CappedBody {
            body: Some(body),
            left: limit,
            over: over.clone(),
        };
        (capped, over)
    }
}

impl tokio_stream::Stream for CappedBody {
    type Item = std::io::Result<Bytes>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let over = || std::io::Error::other("request body over the limit");
        loop {
            let Some(body) = self.body.as_mut() else {
                return Poll::Ready(self.over.load(Ordering::SeqCst).then(|| Err(over())));
            };
            let frame = match hyper::body::Body::poll_frame(std::pin::Pin::new(body), cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.body = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Some(Err(std::io::Error::other(e))))
                }
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            if data.len() as u64 > self.left {
                self.over.store(true, Ordering::SeqCst);
                if let Some(rest) = self.body.take() {
                    drain_in_background(rest);
                }
                return Poll::Ready(Some(Err(over())));
            }
            self.left -= data.len() as u64;
            return Poll::Ready(Some(Ok(data)));
        }
    }
}

impl Drop for CappedBody {
    fn drop(&mut self) {
        if let Some(rest) = self.body.take() {
            drain_in_background(rest);
        }
    }
}

/// Reads and throws away the rest of a body for at most [`DRAIN_AFTER_LIMIT`] and
/// [`DRAIN_BYTES`] (on the runtime this thread belongs to; a blocking task's thread has one).
fn drain_in_background(mut rest: RequestBody) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let until = tokio::time::Instant::now() + DRAIN_AFTER_LIMIT;
        let mut drained = 0;
        while let Ok(Some(Ok(f))) = tokio::time::timeout_at(until, rest.frame()).await {
            drained += f.data_ref().map_or(0, Bytes::len);
            if drained > DRAIN_BYTES {
                break;
            }
        }
    });
}

/// A JSON request body, read whole but at most `limits.max_request_body` bytes: above that
/// the answer is 413 (the rest is drained a while, never kept).
pub async fn read_body(body: RequestBody, limits: &Limits) -> Result<Bytes, DockerError> {
    let (mut capped, over) = CappedBody::new(body, limits.max_request_body);
    let mut whole = Vec::new();
    while let Some(chunk) = capped.next().await {
        match chunk {
            Ok(b) => whole.extend_from_slice(&b),
            Err(_) if over.load(Ordering::SeqCst) => {
                return Err(DockerError::too_large(
                    limits.max_request_body,
                    "max-request-body",
                ))
            }
            Err(e) => return Err(DockerError::bad_request(e.to_string())),
        }
    }
    Ok(Bytes::from(whole))
}

/// A request body as a blocking reader (for a blocking thread: a tar unpacked as it
/// arrives), at most `limit` bytes: reading past them fails, and the returned flag says the
/// limit was why (answer 413).
pub fn body_reader(body: RequestBody, limit: u64) -> (impl std::io::Read + Send, Arc<AtomicBool>) {
    let (capped, over) = CappedBody::new(body, limit);
    let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(capped));
    (reader, over)
}

/// An API version in a request path that we do not speak (a 400 for the client).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("client version {0} is too new. Maximum supported API version is {API_VERSION}")]
    TooNew(String),
    #[error(
        "client version {0} is too old. Minimum supported API version is {MIN_API_VERSION}, please upgrade your client to a newer version"
    )]
    TooOld(String),
}

/// A request path without its optional `/vX.Y` prefix; `Err` for a version we do not speak.
pub fn strip_version(path: &str) -> Result<&str, VersionError> {
    let Some(rest) = path.strip_prefix("/v") else {
        return Ok(path);
    };
    let (ver, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let parse = |v: &str| -> Option<(u32, u32)> {
        let (a, b) = v.split_once('.')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    };
    let Some(asked) = parse(ver) else {
        return Ok(path);
    };
    let ours = parse(API_VERSION).expect("valid");
    if asked > ours {
        return Err(VersionError::TooNew(ver.into()));
    }
    if asked < parse(MIN_API_VERSION).expect("valid") {
        return Err(VersionError::TooOld(ver.into()));
    }
    Ok(tail)
}

/// Query parameters (repeated keys keep every value, in order); an extractor that never
/// fails (a malformed pair is skipped, as dockerd's Go parser does).
#[derive(Debug, Default)]
pub struct Query(BTreeMap<String, Vec<String>>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Query {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut hyper::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Infallible> {
        Ok(Query::parse(parts.uri.query()))
    }
}

impl Query {
    pub fn parse(q: Option<&str>) -> Query {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in url::form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
            map.entry(k.into_owned()).or_default().push(v.into_owned());
        }
        Query(map)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.last()).map(String::as_str)
    }

    pub fn all(&self, key: &str) -> Vec<String> {
        self.0.get(key).cloned().unwrap_or_default()
    }

    /// dockerd's `BoolValue`: "", "0", "no", "false", "none" (any case) are false; anything
    /// else present is true (docker-py sends Python's `False`/`True`).
    pub fn bool(&self, key: &str) -> bool {
        self.get(key).is_some_and(|v| {
            !matches!(
                v.to_ascii_lowercase().as_str(),
                "" | "0" | "no" | "false" | "none"
            )
        })
    }
}

/// A body that cannot fail, as a [`Body`].
pub fn boxed<B>(b: B) -> Body
where
    B: hyper::body::Body<Data = Bytes, Error = Infallible> + Send + Sync + 'static,
{
    b.map_err(|never| match never {}).boxed()
}

pub fn empty(status: StatusCode) -> Reply {
    let mut r = Response::new(boxed(Empty::new()));
    *r.status_mut() = status;
    r
}

pub fn json(status: StatusCode, v: &serde_json::Value) -> Reply {
    let mut r = Response::new(boxed(Full::new(Bytes::from(
        serde_json::to_vec(v).expect("json"),
    ))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", "application/json".parse().expect("header"));
    r
}

pub fn text(status: StatusCode, body: &str) -> Reply {
    let mut r = Response::new(boxed(Full::new(Bytes::from(body.to_owned()))));
    *r.status_mut() = status;
    r
}

/// A streamed 200 body: what is sent on the returned channel, as it comes.
pub fn streaming(content_type: &str) -> (Reply, mpsc::Sender<Bytes>) {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, BoxError>(Frame::data(b)));
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut()
        .insert("content-type", content_type.parse().expect("header"));
    (r, tx)
}

/// One JSON message of a progress stream (`docker build`, `docker pull`), newline-ended.
pub fn json_line(v: &serde_json::Value) -> Bytes {
    let mut b = serde_json::to_vec(v).expect("json");
    b.push(b'\n');
    Bytes::from(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_prefixes() {
        assert_eq!(strip_version("/v1.41/info").ok(), Some("/info"));
        assert_eq!(strip_version("/v1.44/_ping").ok(), Some("/_ping"));
        assert_eq!(strip_version("/info").ok(), Some("/info"));
        assert!(strip_version("/v1.99/info").is_err());
        assert!(strip_version("/v1.12/info").is_err());
        assert_eq!(strip_version("/version").ok(), Some("/version"));
    }

    #[test]
    fn booleans_as_dockerd_reads_them() {
        let q = Query::parse(Some("a=False&b=True&c=1&d=0&e=&f=no&t=x&t=y"));
        assert!(!q.bool("a"));
        assert!(q.bool("b"));
        assert!(q.bool("c"));
        assert!(!q.bool("d"));
        assert!(!q.bool("e"));
        assert!(!q.bool("f"));
        assert!(!q.bool("missing"));
        assert_eq!(q.all("t"), vec!["x", "y"]);
    }
}
