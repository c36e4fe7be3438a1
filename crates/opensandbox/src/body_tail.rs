//! The rest of a request body its handler did not read, so the connection stays usable.
//!
//! hyper keeps an HTTP/1 connection alive after a response only when the request's body was
//! read to its end. When a handler drops the body earlier (multer stops at a multipart body's
//! closing boundary, before the CRLF the SDKs send after it; an error answered before the body
//! is read), hyper polls the body once more and, when its last bytes have not arrived yet,
//! closes the connection, after a response that did not say `Connection: close`. A client
//! that reuses the connection sees "Server disconnected without sending a response" on its
//! next request. Under load the last bytes often come in a TCP segment of their own, so SDK
//! calls failed at random after an upload (issue 36).
//!
//! [`finish_body`] hands the handler the body through a shared cell and, when the handler is
//! done with it before its end, reads the rest before the answer goes out (a lingering read,
//! as web servers do): up to [`MAX_TAIL`] bytes of a body whose length is known, within
//! [`TAIL_WAIT`] (a client sends its whole body without waiting for the answer, so this is the
//! time its last segment takes). A longer or unknown rest, or one that does not come, is not
//! waited for: the response says `Connection: close`, so no client reuses the connection.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::{HeaderValue, CONNECTION};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Body as _, Frame, SizeHint};

/// Most bytes of an unread rest that are read (and thrown away) to keep the connection.
pub const MAX_TAIL: u64 = 64 * 1024;

/// How long the rest may take to arrive; then the connection is given up.
pub const TAIL_WAIT: Duration = Duration::from_secs(10);

type Shared = Arc<Mutex<Body>>;

fn lock(body: &Shared) -> MutexGuard<'_, Body> {
    // A panic while polling leaves nothing half-done in the body worth refusing it for.
    body.lock().unwrap_or_else(|e| e.into_inner())
}

/// The request body as the handler sees it: the same body, still reachable afterwards.
struct SharedBody(Shared);

impl http_body::Body for SharedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut *lock(&self.0)).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        lock(&self.0).is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        lock(&self.0).size_hint()
    }
}

/// What to do with a body after its handler answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Tail {
    /// Read to its end (or never had one): nothing to do.
    Done,
    /// Still held by the handler (a body it streams on, e.g. into a proxied request).
    InUse,
    /// A known rest small enough to read before answering.
    Drain,
    /// Unknown or too long: the response closes the connection.
    Close,
}

/// The decision, from what is known of the body when the handler returned.
pub fn tail(ended: bool, holders: usize, rest: Option<u64>) -> Tail {
    if ended {
        Tail::Done
    } else if holders > 1 {
        Tail::InUse
    } else if rest.is_some_and(|n| n <= MAX_TAIL) {
        Tail::Drain
    } else {
        Tail::Close
    }
}

/// Middleware: see the module doc.
pub async fn finish_body(req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        return next.run(Request::from_parts(parts, body)).await;
    }
    let shared: Shared = Arc::new(Mutex::new(body));
    let req = Request::from_parts(parts, Body::new(SharedBody(shared.clone())));
    let mut response = next.run(req).await;
    let (ended, rest) = {
        let b = lock(&shared);
        (b.is_end_stream(), b.size_hint().exact())
    };
    match tail(ended, Arc::strong_count(&shared), rest) {
        Tail::Done | Tail::InUse => {}
        Tail::Drain if drain(&shared).await => {}
        Tail::Drain | Tail::Close => {
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
    }
    response
}

/// Reads the body to its end (bounded by [`TAIL_WAIT`]), throwing it away; whether it got
/// there.
async fn drain(shared: &Shared) -> bool {
    let rest = std::future::poll_fn(|cx| {
        let mut body = lock(shared);
        loop {
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(Some(Ok(_))) => continue,
                Poll::Ready(Some(Err(_))) => return Poll::Ready(false),
                Poll::Ready(None) => return Poll::Ready(true),
                Poll::Pending => return Poll::Pending,
            }
        }
    });
    let done = tokio::time::timeout(TAIL_WAIT, rest).await.unwrap_or(false);
    if !done {
        tracing::debug!(target: "agentrun::opensandbox", "a request body's rest did not come within {TAIL_WAIT:?}: the connection closes");
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        assert_eq!(tail(true, 1, Some(0)), Tail::Done);
        assert_eq!(tail(false, 2, Some(2)), Tail::InUse);
        assert_eq!(tail(false, 1, Some(2)), Tail::Drain);
        assert_eq!(tail(false, 1, Some(MAX_TAIL)), Tail::Drain);
        assert_eq!(tail(false, 1, Some(MAX_TAIL + 1)), Tail::Close);
        assert_eq!(tail(false, 1, None), Tail::Close);
    }
}
