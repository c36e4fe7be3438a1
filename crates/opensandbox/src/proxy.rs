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
//!
//! What comes back is the sandbox's, served at the API's (and dashboard's) origin: it is
//! made harmless there ([`defuse`]): no `Set-Cookie` (a sandbox sets no cookie on the
//! server's origin), `Content-Security-Policy: sandbox` (a browser runs its HTML in a unique
//! opaque origin: its scripts cannot read `/v1`, `/ui` or another sandbox's pages, nor send
//! the dashboard's cookies), `X-Content-Type-Options: nosniff`. See docs/security.md.

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
                // Ends when either side closes or fails: both end the upgraded connection.
                let _ =
                    tokio::io::copy_bidirectional(&mut TokioIo::new(c), &mut TokioIo::new(u)).await;
            }
        });
        let (mut parts, _) = upstream.into_parts();
        defuse(&mut parts.headers);
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = upstream.into_parts();
    defuse(&mut parts.headers);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// The CSP a sandbox's responses are served with: an opaque origin of their own.
pub const SANDBOX_CSP: &str = "sandbox";

/// Makes a sandbox's response headers safe to serve at the server's origin: its cookies
/// dropped, its content confined to an opaque origin, never sniffed.
pub fn defuse(headers: &mut axum::http::HeaderMap) {
    headers.remove(header::SET_COOKIE);
    headers.remove("set-cookie2");
    // The sandbox's own policy may be stricter: keep it, and add ours (a browser enforces
    // every policy it gets).
    headers.append(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(SANDBOX_CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn sandbox_responses_are_defused() {
        let mut h = axum::http::HeaderMap::new();
        h.append("set-cookie", "a=1".parse().unwrap());
        h.append("set-cookie", "b=2".parse().unwrap());
        h.append("content-security-policy", "default-src *".parse().unwrap());
        super::defuse(&mut h);
        assert!(h.get("set-cookie").is_none());
        let csp: Vec<_> = h.get_all("content-security-policy").iter().collect();
        assert_eq!(csp, ["default-src *", "sandbox"]);
        assert_eq!(h["x-content-type-options"], "nosniff");
    }
}
