//! Container endpoints that stream: `wait` (headers at once, the status when the condition
//! is met), `logs` (what is kept, then with `follow` what comes until the exit) and `attach`
//! (a hijacked connection carrying the main process's output, and stdin to it, from before
//! its start if need be, until it exits).

use std::sync::Arc;
use std::time::Duration;

use agentrun_pool::lock;
use axum::extract::{Path, Request, State};
use bytes::Bytes;
use serde_json::json;
use tokio::io::{ReadHalf, WriteHalf};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::broadcast::Receiver;

use crate::container_api::find;
use crate::containers::{Container, Status};
use crate::error::DockerError;
use crate::http::{streaming, DockerResult, Query};
use crate::stream::{self, HijackIo};
use crate::{ApiState, TRACE};

type Api = State<Arc<ApiState>>;
type Key = Path<String>;

/// How long an attach stream of an exited container waits for more output while the
/// process's pipes are still open (a background child may hold them).
const EXITED_DRAIN: Duration = Duration::from_millis(200);
/// Stdin an attached client may send a container before it starts (kept for its start).
const PENDING_STDIN: usize = 1024 * 1024;

/// `POST /containers/{id}/wait?condition=`: headers at once, the status when it is met.
pub async fn wait(State(api): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&api, &key)?;
    let condition = q.get("condition").unwrap_or("not-running").to_owned();
    if !["not-running", "next-exit", "removed"].contains(&condition.as_str()) {
        return Err(DockerError::bad_request(format!(
            "invalid condition: \"{condition}\""
        )));
    }
    let (reply, tx) = streaming("application/json");
    let mut rx = c.changed.subscribe();
    let exits_at_start = lock(&c.state).exits;
    tokio::spawn(async move {
        loop {
            let done = {
                let st = lock(&c.state);
                match condition.as_str() {
                    "next-exit" => st.exits > exits_at_start,
                    "removed" => st.removed,
                    _ => st.status != Status::Running,
                }
            };
            if done {
                break;
            }
            if rx.changed().await.is_err() {
                break;
            }
        }
        let code = lock(&c.state).exit_code;
        let _ = tx
            .send(crate::http::json_line(
                &json!({"StatusCode": code, "Error": null}),
            ))
            .await;
        tracing::debug!(target: TRACE, "wait {} ({condition}): answered", c.id);
    });
    Ok(reply)
}

/// `GET /containers/{id}/logs?stdout=&stderr=&follow=&tail=`
pub async fn logs(State(api): Api, Path(key): Key, q: Query) -> DockerResult {
    let c = find(&api, &key)?;
    let (want_out, want_err) = (q.bool("stdout"), q.bool("stderr"));
    if !want_out && !want_err {
        return Err(DockerError::bad_request(
            "You must choose at least one stream",
        ));
    }
    let tty = c.config.tty;
    let wanted = move |s: u8| (s == 1 && want_out) || (s == 2 && want_err);
    let tail = q.get("tail").and_then(|t| t.parse::<usize>().ok());
    let follow = q.bool("follow");
    let mut live = c.output.subscribe();
    let kept = c.kept_output();
    let (reply, tx) = streaming(if tty {
        "application/vnd.docker.raw-stream"
    } else {
        "application/vnd.docker.multiplexed-stream"
    });
    tokio::spawn(async move {
        let mut chunks: Vec<(u8, Bytes)> = kept.into_iter().filter(|(s, _)| wanted(*s)).collect();
        if let Some(n) = tail {
            chunks = tail_lines(chunks, n);
        }
        for (s, b) in chunks {
            if tx
                .send(Bytes::from(stream::frame(s, &b, tty)))
                .await
                .is_err()
            {
                return;
            }
        }
        if !follow {
            return;
        }
        let mut changed = c.changed.subscribe();
        loop {
            if c.status() != Status::Running {
                // The exit is recorded once the pumps reached EOF (bounded, see
                // `wait_outputs`): what they read is in `live` already; take it, wait for none.
                loop {
                    let (s, b) = match live.try_recv() {
                        Ok(got) => got,
                        Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => continue,
                        Err(_) => break,
                    };
                    if wanted(s)
                        && tx
                            .send(Bytes::from(stream::frame(s, &b, tty)))
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
                return;
            }
            tokio::select! {
                got = live.recv() => match got {
                    Ok((s, b)) => {
                        if wanted(s) && tx.send(Bytes::from(stream::frame(s, &b, tty))).await.is_err() {
                            return;
                        }
                    }
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return,
                },
                _ = changed.changed() => {}
            }
        }
    });
    Ok(reply)
}

/// The last `n` lines of a stream of chunks.
fn tail_lines(chunks: Vec<(u8, Bytes)>, n: usize) -> Vec<(u8, Bytes)> {
    let mut lines: Vec<(u8, Vec<u8>)> = Vec::new();
    for (s, b) in chunks {
        for piece in b.split_inclusive(|c| *c == b'\n') {
            match lines.last_mut() {
                Some((ls, l)) if *ls == s && !l.ends_with(b"\n") => l.extend_from_slice(piece),
                _ => lines.push((s, piece.to_vec())),
            }
        }
    }
    let skip = lines.len().saturating_sub(n);
    lines
        .into_iter()
        .skip(skip)
        .map(|(s, l)| (s, Bytes::from(l)))
        .collect()
}

/// Which output streams a client asked for (`stdout=`, `stderr=`).
#[derive(Debug, Clone, Copy)]
struct Wanted {
    stdout: bool,
    stderr: bool,
}

impl Wanted {
    fn of(q: &Query) -> Self {
        Wanted {
            stdout: q.bool("stdout"),
            stderr: q.bool("stderr"),
        }
    }

    fn wants(self, stream: u8) -> bool {
        (stream == 1 && self.stdout) || (stream == 2 && self.stderr)
    }
}

/// `POST /containers/{id}/attach?stream=&stdin=&stdout=&stderr=&logs=`: a hijack that
/// carries the main process's output (and stdin to it), from before start if need be, until
/// the container exits.
pub async fn attach(State(api): Api, Path(key): Key, q: Query, mut req: Request) -> DockerResult {
    let c = find(&api, &key)?;
    if !stream::wants_upgrade(&req) {
        return Err(DockerError::bad_request(
            "attach needs an upgraded (hijacked) connection",
        ));
    }
    let tty = c.config.tty;
    let wanted = Wanted::of(&q);
    let want_in = q.bool("stdin");
    let with_logs = q.bool("logs");
    let live = c.output.subscribe();
    // The run this attach is for: the current one, or the next (`docker start -a` attaches
    // to an exited container, then starts it).
    let exits_at_attach = lock(&c.state).exits;
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let up = match upgrade.await {
            Ok(up) => up,
            Err(e) => {
                tracing::debug!(target: TRACE, "attach {}: upgrade failed: {e}", c.id);
                return;
            }
        };
        let (rd, mut wr) = tokio::io::split(hyper_util::rt::TokioIo::new(up));
        if with_logs {
            let kept = c.kept_output();
            for (s, b) in kept {
                if wanted.wants(s) && !stream::send(&mut wr, s, &b, tty).await {
                    return;
                }
            }
        }
        let input = tokio::spawn(client_to_container_stdin(c.clone(), rd, want_in));
        forward_output(&c, live, &mut wr, wanted, exits_at_attach).await;
        input.abort();
        // The client may be gone already.
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut wr).await;
        tracing::debug!(target: TRACE, "attach {} done", c.id);
    });
    Ok(stream::upgraded_reply(tty))
}

/// An attached client's stdin: to the main process if it runs (through its bounded writer:
/// a process not reading its stdin holds up this client only), else kept for it (at most
/// [`PENDING_STDIN`]; then the client waits for the start). The client's EOF closes the
/// process's stdin (`StdinOnce` or no tty), or, before start, marks it to be closed at start.
async fn client_to_container_stdin(c: Arc<Container>, mut rd: ReadHalf<HijackIo>, want_in: bool) {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 16 * 1024];
    let mut changed = c.changed.subscribe();
    loop {
        while want_in && {
            let st = lock(&c.state);
            st.status == Status::Created && st.pending_stdin.len() >= PENDING_STDIN
        } {
            if changed.changed().await.is_err() {
                return;
            }
        }
        let n = match rd.read(&mut buf).await {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        if !want_in {
            if n == 0 {
                break;
            }
            continue;
        }
        let writer = {
            let mut guard = lock(&c.state);
            let st = &mut *guard;
            if n == 0 {
                if st.status == Status::Created {
                    st.stdin_closed_early = true;
                } else if c.config.stdin_once || !c.config.tty {
                    st.stdin = None;
                }
                break;
            }
            match st.stdin.as_ref() {
                Some(w) => Some(w.clone()),
                None => {
                    if st.status == Status::Created {
                        st.pending_stdin.extend_from_slice(&buf[..n]);
                    }
                    None
                }
            }
        };
        if let Some(w) = writer {
            let _ = w.send(Bytes::copy_from_slice(&buf[..n])).await;
        }
    }
}

/// Sends the main process's output to an attached client until the run it attached to has
/// exited and its output is drained ([`drain_after_exit`]), or the client is gone.
async fn forward_output(
    c: &Container,
    mut live: Receiver<(u8, Bytes)>,
    wr: &mut WriteHalf<HijackIo>,
    wanted: Wanted,
    exits_at_attach: u64,
) {
    let tty = c.config.tty;
    let mut changed = c.changed.subscribe();
    loop {
        // Exited (a fast container may have run and exited between two looks).
        let ended = {
            let st = lock(&c.state);
            st.status == Status::Exited && st.exits > exits_at_attach
        };
        if ended {
            return drain_after_exit(c, live, wr, wanted).await;
        }
        tokio::select! {
            got = live.recv() => match got {
                Ok((s, b)) => {
                    if wanted.wants(s) && !stream::send(wr, s, &b, tty).await {
                        return;
                    }
                }
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            },
            _ = changed.changed() => {}
        }
    }
}

/// The rest of an exited process's output: until its pumps reached EOF (then what is queued
/// is all there is) or, bounded, [`EXITED_DRAIN`] without output.
async fn drain_after_exit(
    c: &Container,
    mut live: Receiver<(u8, Bytes)>,
    wr: &mut WriteHalf<HijackIo>,
    wanted: Wanted,
) {
    let tty = c.config.tty;
    let mut changed = c.changed.subscribe();
    let mut deadline = tokio::time::Instant::now() + EXITED_DRAIN;
    loop {
        if !c.outputs_open() {
            loop {
                match live.try_recv() {
                    Ok((s, b)) => {
                        if wanted.wants(s) && !stream::send(wr, s, &b, tty).await {
                            return;
                        }
                    }
                    Err(TryRecvError::Lagged(_)) => {}
                    Err(_) => return,
                }
            }
        }
        tokio::select! {
            got = tokio::time::timeout_at(deadline, live.recv()) => match got {
                Ok(Ok((s, b))) => {
                    deadline = tokio::time::Instant::now() + EXITED_DRAIN;
                    if wanted.wants(s) && !stream::send(wr, s, &b, tty).await {
                        return;
                    }
                }
                Ok(Err(RecvError::Lagged(_))) => {}
                _ => return,
            },
            _ = changed.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_counts_lines_across_chunks_per_stream() {
        let chunks = vec![
            (1, Bytes::from_static(b"a\nb")),
            (1, Bytes::from_static(b"c\nd\n")),
            (2, Bytes::from_static(b"err\n")),
            (1, Bytes::from_static(b"last")),
        ];
        let got: Vec<(u8, Bytes)> = tail_lines(chunks.clone(), 3);
        assert_eq!(
            got,
            vec![
                (1, Bytes::from_static(b"d\n")),
                (2, Bytes::from_static(b"err\n")),
                (1, Bytes::from_static(b"last")),
            ]
        );
        assert_eq!(tail_lines(chunks.clone(), 0), vec![]);
        assert_eq!(tail_lines(chunks, 10)[1], (1, Bytes::from_static(b"bc\n")));
    }
}
