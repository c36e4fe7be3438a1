//! Streams of the Docker API: the 8-byte multiplexed frame format (non-TTY output), the
//! hijacked connection (`101 UPGRADED`, then a raw bidirectional pipe: stdin in, frames out,
//! a read EOF meaning "stdin closed"), a process's output pumped into a channel and its
//! stdin written from one (on tokio, through [`agentrun_pool::stdio`]).

use std::os::fd::{OwnedFd, RawFd};
use std::time::{Duration, Instant};

use agentrun_pool::stdio::{pump, StdioStream};
use bytes::Bytes;
use hyper::upgrade::Upgraded;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::http::Reply;

/// One frame: `[stream, 0, 0, 0, len (u32 BE)]` + payload; raw bytes when `tty`.
pub fn frame(stream: u8, data: &[u8], tty: bool) -> Vec<u8> {
    if tty {
        return data.to_vec();
    }
    let mut v = Vec::with_capacity(8 + data.len());
    v.extend_from_slice(&[stream, 0, 0, 0]);
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// The `101 UPGRADED` answer to a hijack request.
pub fn upgraded_reply(tty: bool) -> Reply {
    let mut r = Response::new(crate::http::boxed(http_body_util::Empty::<Bytes>::new()));
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert("connection", "Upgrade".parse().expect("header"));
    h.insert("upgrade", "tcp".parse().expect("header"));
    let ct = if tty {
        "application/vnd.docker.raw-stream"
    } else {
        "application/vnd.docker.multiplexed-stream"
    };
    h.insert("content-type", ct.parse().expect("header"));
    r
}

/// Whether the request asks to hijack the connection.
pub fn wants_upgrade<B>(req: &hyper::Request<B>) -> bool {
    req.headers()
        .get("upgrade")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("tcp"))
}

/// Reads a process's output (our end, `fd`) on the current tokio runtime into `tx` as
/// `(stream, bytes)`, until EOF or until nobody receives ([`agentrun_pool::stdio::pump`]: a
/// full channel holds the reading up).
pub fn pump_to(fd: OwnedFd, stream: u8, tx: mpsc::Sender<(u8, Bytes)>) {
    tokio::spawn(pump(fd, move |b| {
        let tx = tx.clone();
        async move { tx.send((stream, b)).await.is_ok() }
    }));
}

/// Chunks of a client's stdin queued for a process (16 KiB each at most).
const STDIN_QUEUE: usize = 4;

/// Writes what arrives on the returned channel to a process's stdin (our end, `fd`), on the
/// current tokio runtime; dropping the sender closes it (the process sees EOF on stdin). The
/// channel holds [`STDIN_QUEUE`] chunks: while a process does not read its stdin, the
/// client's bytes wait in its connection, not in the daemon.
pub fn stdin_writer(fd: OwnedFd) -> mpsc::Sender<Bytes> {
    let (tx, mut rx) = mpsc::channel::<Bytes>(STDIN_QUEUE);
    tokio::spawn(async move {
        let Ok(mut stdin) = StdioStream::new(fd) else {
            return;
        };
        while let Some(chunk) = rx.recv().await {
            if stdin.write_all(&chunk).await.is_err() {
                break;
            }
        }
    });
    tx
}

/// The two directions of a hijacked connection.
pub type HijackIo = TokioIo<Upgraded>;

/// The raw fd of the connection a request came on (a request extension, set where
/// connections are accepted): what [`answer_read`] watches. Valid while the connection is,
/// i.e. while its request or the upgraded stream lives.
#[derive(Clone, Copy, Debug)]
pub struct ConnFd(pub RawFd);

/// How long [`answer_read`] waits for the client to read the answer at most (a client that
/// reads nothing before it gets output).
const ANSWER_READ_LIMIT: Duration = Duration::from_secs(1);

/// Waits until the client has read everything sent on `conn` so far (the hijack answer):
/// on a unix stream socket the bytes sent stay charged to the sender until the peer read
/// them, so `SIOCOUTQ` (`TIOCOUTQ`) reaching 0 says the peer's read took all of them. Polled
/// with a short backoff (tens of microseconds, doubling to 1 ms), bounded by
/// [`ANSWER_READ_LIMIT`]; returns at once without a fd or when the ioctl fails. The Docker
/// API is served on a unix socket only: on TCP the same ioctl drains once the peer's kernel
/// acknowledged the bytes, not once the client read them (`SIOCINQ` on the client's side
/// would be the signal there, which a server cannot see).
///
/// docker-py reads the answer through a buffered reader and then the raw socket: output in
/// the same read as the answer would be lost to it. After this, no output can be.
pub async fn answer_read(conn: Option<ConnFd>) {
    let Some(ConnFd(fd)) = conn else { return };
    let unsent = move || {
        let mut n: libc::c_int = 0;
        // SAFETY: TIOCOUTQ writes one c_int through the pointer, which is valid; `fd` is the
        // connection's socket, open while the caller holds the connection.
        let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n as *mut libc::c_int) };
        (rc == 0).then_some(n)
    };
    if !matches!(unsent(), Some(n) if n > 0) {
        return;
    }
    // A JoinHandle: the wait is bounded and cannot fail.
    let _ = tokio::task::spawn_blocking(move || {
        let t0 = Instant::now();
        let mut pause = Duration::from_micros(20);
        while matches!(unsent(), Some(n) if n > 0) && t0.elapsed() < ANSWER_READ_LIMIT {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    })
    .await;
}

/// Copies the client's bytes to `stdin` until the client half-closes (then `stdin` is
/// dropped: EOF for the process). Returns when the client's side is done.
pub async fn client_to_stdin(
    mut rd: tokio::io::ReadHalf<HijackIo>,
    stdin: Option<mpsc::Sender<Bytes>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(tx) = &stdin {
                    let _ = tx.send(Bytes::copy_from_slice(&buf[..n])).await;
                }
            }
        }
    }
    drop(stdin);
}

/// Writes one chunk of output; false when the client is gone.
pub async fn send(
    wr: &mut tokio::io::WriteHalf<HijackIo>,
    stream: u8,
    data: &[u8],
    tty: bool,
) -> bool {
    wr.write_all(&frame(stream, data, tty)).await.is_ok() && wr.flush().await.is_ok()
}

/// A streamed body for clients that did not hijack (output only).
pub fn body_sender() -> (Reply, mpsc::Sender<Bytes>) {
    crate::http::streaming("application/vnd.docker.raw-stream")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_as_docker_writes_them() {
        assert_eq!(
            frame(2, b"to-stderr\n", false),
            b"\x02\x00\x00\x00\x00\x00\x00\x0ato-stderr\n".to_vec()
        );
        assert_eq!(frame(1, b"raw", true), b"raw".to_vec());
    }
}
