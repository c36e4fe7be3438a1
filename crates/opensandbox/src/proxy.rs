//! execd's port proxy: `{execd endpoint}/proxy/{port}/...` (also reached through
//! [`crate::server_proxy`]) forwards HTTP, streaming both
//! ways, and upgrades (WebSocket and the like) to `127.0.0.1:{port}` inside the sandbox. The
//! endpoint lookup of any port other than execd's and egress's points here, as the official
//! server's does (its execd runs the same proxy).
//!
//! The connection is made in the sandbox's network namespace from the host side
//! ([`agentrun_runtime::netns`]); the sandbox itself still has no route out. The per-sandbox
//! tokens and the API key are stripped from what is forwarded: code in the sandbox never
//! sees a credential that would let it drive its own (or another) sandbox.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use axum::routing::any;
use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::net::TcpSocket;

use crate::auth::ExecdSandbox;
use crate::error::{ApiError, ApiResult};
use crate::{Record, Server};

/// Headers that carry agentrun credentials: never forwarded into the sandbox.
const CREDENTIAL_HEADERS: [&str; 3] = [
    crate::EXECD_TOKEN_HEADER,
    crate::EGRESS_TOKEN_HEADER,
    "OPEN-SANDBOX-API-KEY",
];

pub fn routes(server: Arc<Server>) -> Router {
    Router::new()
        .route("/proxy/{port}", any(proxy))
        .route("/proxy/{port}/", any(proxy))
        .route("/proxy/{port}/{*rest}", any(proxy))
        .with_state(server)
}

fn bad_gateway(message: String) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "PROXY::UPSTREAM_UNAVAILABLE",
        message,
    )
}

/// A TCP connection to `127.0.0.1:port` in the sandbox's network namespace.
async fn connect(rec: &Record, port: u16) -> ApiResult<tokio::net::TcpStream> {
    let sockets = match rec.netns.get() {
        Some(s) => s.clone(),
        None => {
            // A thread in the shell's network namespace: its shell is not reused after the
            // sandbox.
            rec.sandbox.taint("netns_sockets");
            let made = agentrun_runtime::netns::NetnsSockets::of_process(rec.sandbox.init_pid())
                .map_err(|e| ApiError::internal(format!("entering the sandbox's network: {e}")))?;
            rec.netns.get_or_init(|| made).clone()
        }
    };
    let fd = sockets
        .socket()
        .await
        .map_err(|e| ApiError::internal(format!("a socket in the sandbox: {e}")))?;
    let socket = TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
    socket
        .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .await
        .map_err(|e| {
            bad_gateway(format!(
                "nothing answers on port {port} in the sandbox: {e}"
            ))
        })
}

async fn proxy(
    ExecdSandbox(rec): ExecdSandbox,
    Path(p): Path<HashMap<String, String>>,
    mut req: Request,
) -> ApiResult<Response> {
    let port = p
        .get("port")
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            ApiError::bad_request("the proxy's port must be a number from 1 to 65535")
        })?;
    let rest = p.get("rest").map(String::as_str).unwrap_or("");
    let target = match req.uri().query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    let client_upgrade = req
        .headers()
        .contains_key(header::UPGRADE)
        .then(|| hyper::upgrade::on(&mut req));
    let stream = connect(&rec, port).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| bad_gateway(format!("port {port}: {e}")))?;
    tokio::spawn(conn.with_upgrades());

    let (mut parts, body) = req.into_parts();
    parts.uri = target
        .parse::<Uri>()
        .map_err(|e| ApiError::bad_request(format!("proxy path: {e}")))?;
    for h in CREDENTIAL_HEADERS {
        parts.headers.remove(h);
    }
    if let Ok(host) = HeaderValue::from_str(&format!("127.0.0.1:{port}")) {
        parts.headers.insert(header::HOST, host);
    }
    let mut upstream = sender
        .send_request(axum::http::Request::from_parts(parts, body))
        .await
        .map_err(|e| bad_gateway(format!("port {port}: {e}")))?;

    if upstream.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(bad_gateway(format!(
                "port {port} switched protocols without being asked to"
            )));
        };
        let upstream_upgrade = hyper::upgrade::on(&mut upstream);
        tokio::spawn(async move {
            if let (Ok(c), Ok(u)) = (client_upgrade.await, upstream_upgrade.await) {
                let _ =
                    tokio::io::copy_bidirectional(&mut TokioIo::new(c), &mut TokioIo::new(u)).await;
            }
        });
        let (parts, _) = upstream.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (parts, body) = upstream.into_parts();
    Ok(Response::from_parts(parts, Body::new(body)))
}
