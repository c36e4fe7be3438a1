//! The server-side proxy: `/v1/sandboxes/{id}/proxy/{port}[/...]`, the endpoints the lookup
//! hands out with `?use_server_proxy=true` (`ConnectionConfig(use_server_proxy=True)`), for
//! clients that reach the server but not the sandboxes' own endpoints.
//!
//! A request there is authenticated as the rest of `/v1` (`OPEN-SANDBOX-API-KEY` when a key
//! is set, from the headers, before any body is read), then handed, its body and upgrade
//! untouched, to the route the direct endpoint of that port names, with that sandbox's
//! token put in by the server: port 44772 to `/execd/{id}/...`, 18080 to `/egress/{id}/...`,
//! any other to execd's port proxy `/execd/{id}/proxy/{port}/...` ([`crate::proxy`], which
//! forwards neither the token nor the key into the sandbox; nor, through this route,
//! `Authorization` and `Cookie`: all sandboxes share the server's origin here). In this mode the tokens never
//! leave the server: the lookup returns no `headers`, and whatever credential a client sends
//! is replaced, so the API key is the one credential of the route.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Uri};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use tower_service::Service;

use crate::auth::{require_api_key, Token};
use crate::error::{ApiError, ApiResult};
use crate::Server;

/// Headers carrying agentrun credentials: removed from every request through the server
/// proxy before the route's own token is put in.
const CREDENTIAL_HEADERS: [&str; 3] = [
    crate::EXECD_TOKEN_HEADER,
    crate::EGRESS_TOKEN_HEADER,
    "OPEN-SANDBOX-API-KEY",
];

/// Headers not forwarded to a user's port through the server proxy (as upstream's server
/// proxy): every sandbox is reached at the server's own origin here, so a browser's cookies
/// and credentials for one sandbox's app (or for the server) would reach every other's.
const SHARED_ORIGIN_HEADERS: [header::HeaderName; 2] = [header::AUTHORIZATION, header::COOKIE];

/// The prefix of the endpoints the lookup returns with `use_server_proxy=true`.
pub fn endpoint(host: &str, sid: &str, port: u16) -> String {
    format!("{host}/v1/sandboxes/{sid}/proxy/{port}")
}

#[derive(Clone)]
struct ProxyState {
    server: Arc<Server>,
    /// The per-sandbox APIs (`/execd/{sid}`, `/egress/{sid}`) requests are handed to.
    sandboxes: Router,
}

/// The proxy's routes, handing requests to `sandboxes` (the `/execd` and `/egress` routers
/// with their token checks).
pub fn routes(server: Arc<Server>, sandboxes: Router) -> Router {
    let state = ProxyState {
        server: server.clone(),
        sandboxes,
    };
    // Under `/v1` and at the root, as upstream's server mounts every route twice.
    let mut router = Router::new();
    for prefix in ["/v1", ""] {
        router = router
            .route(
                &format!("{prefix}/sandboxes/{{id}}/proxy/{{port}}"),
                any(forward),
            )
            .route(
                &format!("{prefix}/sandboxes/{{id}}/proxy/{{port}}/"),
                any(forward),
            )
            .route(
                &format!("{prefix}/sandboxes/{{id}}/proxy/{{port}}/{{*rest}}"),
                any(forward),
            );
    }
    router
        .route_layer(from_fn_with_state(server, require_api_key))
        .with_state(state)
}

/// Where a request for `port` of sandbox `sid` goes (`rest` is the raw path after the port,
/// empty or starting with `/`), and which token that route takes.
fn target(sid: &str, port: u16, rest: &str) -> (String, Token) {
    match port {
        crate::EXECD_PORT => (format!("/execd/{sid}{rest}"), Token::Execd),
        crate::EGRESS_PORT => (format!("/egress/{sid}{rest}"), Token::Egress),
        p => (format!("/execd/{sid}/proxy/{p}{rest}"), Token::Execd),
    }
}

/// `/v1/sandboxes/{sid}/proxy/{port}{rest}` split from the raw (still percent-encoded)
/// path, so that the path reaches the route it is handed to exactly as it was sent.
fn split_path(path: &str) -> ApiResult<(&str, u16, &str)> {
    let bad = || ApiError::bad_request(format!("not a server-proxy path: {path}"));
    let tail = path
        .strip_prefix("/v1/sandboxes/")
        .or_else(|| path.strip_prefix("/sandboxes/"))
        .ok_or_else(bad)?;
    let (sid, tail) = tail.split_once('/').ok_or_else(bad)?;
    let tail = tail.strip_prefix("proxy/").ok_or_else(bad)?;
    let (port, rest) = match tail.find('/') {
        Some(i) => tail.split_at(i),
        None => (tail, ""),
    };
    let port = port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
        ApiError::bad_request("the proxy's port must be a number from 1 to 65535")
    })?;
    Ok((sid, port, rest))
}

async fn forward(State(state): State<ProxyState>, req: Request) -> Response {
    match rewrite(&state.server, req) {
        Ok(req) => {
            let mut sandboxes = state.sandboxes.clone();
            match sandboxes.call(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            }
        }
        Err(e) => e.into_response(),
    }
}

/// The request as the direct endpoint's route takes it: its path there, the credentials it
/// came with removed and the sandbox's token for that route put in (404 for no such
/// sandbox).
fn rewrite(server: &Server, mut req: Request) -> ApiResult<Request> {
    let (sid, port, rest) = split_path(req.uri().path())?;
    let (path, token) = target(sid, port, rest);
    let rec = server.record(sid)?;
    rec.renew_on_access();
    let target = match req.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    *req.uri_mut() = target
        .parse::<Uri>()
        .map_err(|e| ApiError::bad_request(format!("proxy path: {e}")))?;
    let headers = req.headers_mut();
    for h in CREDENTIAL_HEADERS {
        headers.remove(h);
    }
    if !matches!(port, crate::EXECD_PORT | crate::EGRESS_PORT) {
        for h in SHARED_ORIGIN_HEADERS {
            headers.remove(h);
        }
    }
    let value = HeaderValue::from_str(token.of(&rec))
        .map_err(|_| ApiError::internal("a sandbox token is not a header value"))?;
    headers.insert(token.header(), value);
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_the_raw_path() {
        let p = "/v1/sandboxes/ab/proxy";
        for (rest, port, tail) in [
            ("/44772/files/download", 44772, "/files/download"),
            ("/8000", 8000, ""),
            ("/8000/", 8000, "/"),
            ("/8000/a%2Fb", 8000, "/a%2Fb"),
        ] {
            let path = format!("{p}{rest}");
            assert_eq!(split_path(&path).unwrap(), ("ab", port, tail), "{path}");
        }
        for rest in ["/0/x", "/70000", "/http/x"] {
            assert!(split_path(&format!("{p}{rest}")).is_err(), "{rest}");
        }
    }

    #[test]
    fn each_port_goes_to_its_direct_route() {
        for (port, rest, route, token) in [
            (44772, "/command", "/execd/ab/command", Token::Execd),
            (18080, "/policy", "/egress/ab/policy", Token::Egress),
            (8000, "/x?", "/execd/ab/proxy/8000/x?", Token::Execd),
            (8000, "", "/execd/ab/proxy/8000", Token::Execd),
        ] {
            assert_eq!(
                target("ab", port, rest),
                (route.into(), token),
                "{port}{rest}"
            );
        }
    }
}
