//! The `Host` allowlist and the `Origin` check of every HTTP listener.
//!
//! - `Host`: a request is answered only when its `Host` names this server: `localhost`, a
//!   loopback address, the listen address itself (any IP address when listening on
//!   `0.0.0.0`/`::`: an address cannot be rebound), or a name configured with
//!   `serve --allowed-host NAME` (`*` turns the check off, for a proxy that rewrites
//!   `Host`). A page on a DNS name rebound to 127.0.0.1 sends its own name and is refused
//!   (403 `HOST_NOT_ALLOWED`), whatever the port.
//! - `Origin`: a state-changing request (any method but GET, HEAD, OPTIONS; and any upgrade,
//!   such as a WebSocket, whatever its method) that carries an
//!   `Origin` is refused (403 `ORIGIN_NOT_ALLOWED`) unless that origin is the server's own
//!   (its host and port those of `Host`) or its host is a configured name. Browsers send
//!   `Origin` on every cross-site POST (and `null` from sandboxed frames, refused too); the
//!   SDKs, curl and Prometheus send none and are not affected.
//!
//! The parsers take header text as it came and never panic ([`authority`],
//! [`origin_authority`]; fuzzed by `fuzz/fuzz_targets/webguard.rs`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// A configured name that cannot be one.
#[derive(Debug, thiserror::Error)]
#[error("--allowed-host {0:?}: not a host name or address (e.g. sandbox.example.com, 10.0.0.5, *)")]
pub struct HostGuardError(pub String);

/// Which `Host` names and origins a listener answers.
#[derive(Debug, Clone)]
pub struct HostGuard {
    listen: SocketAddr,
    /// Configured names, lower case, without a final dot.
    names: Vec<String>,
    /// `*` was configured: any `Host`.
    any: bool,
}

/// The host part of a `Host` header value (`host[:port]`, `[v6][:port]`), lower case, and
/// its port if one was given. `None` for anything else (empty, user info, a path, a bad
/// port, characters no host name has).
pub fn authority(value: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        v6.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(parse_port(p.strip_prefix(':')?)?),
        };
        (format!("[{}]", v6.to_ascii_lowercase()), port)
    } else {
        let (host, port) = match value.rsplit_once(':') {
            Some((h, p)) => (h, Some(parse_port(p)?)),
            None => (value, None),
        };
        let ok = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if !ok {
            return None;
        }
        (host.to_ascii_lowercase(), port)
    };
    Some((host, port))
}

fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok()
}

/// An `Origin` header value's scheme and authority (`http://host[:port]`); `None` for
/// `null`, a path or anything else.
pub fn origin_authority(value: &str) -> Option<(&str, String, Option<u16>)> {
    let (scheme, rest) = value.split_once("://")?;
    let scheme = match scheme {
        s if s.eq_ignore_ascii_case("http") => "http",
        s if s.eq_ignore_ascii_case("https") => "https",
        _ => return None,
    };
    let (host, port) = authority(rest)?;
    Some((scheme, host, port))
}

/// The address a host part names, if it is one (`[::1]` and `127.0.0.1` alike).
fn ip_of(host: &str) -> Option<IpAddr> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse().ok()
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

impl HostGuard {
    /// The guard of a listener on `listen` that also answers `names` (`*`: any).
    pub fn new(listen: SocketAddr, names: &[String]) -> Result<HostGuard, HostGuardError> {
        let mut guard = HostGuard {
            listen,
            names: Vec::new(),
            any: false,
        };
        for n in names {
            let n = n.trim();
            if n == "*" {
                guard.any = true;
                continue;
            }
            let lowered = n.trim_end_matches('.').to_ascii_lowercase();
            match authority(&lowered) {
                Some((host, None)) => guard.names.push(host),
                _ => return Err(HostGuardError(n.to_owned())),
            }
        }
        Ok(guard)
    }

    /// Is `host` (a host part from [`authority`]) a configured name?
    fn configured(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        self.names.iter().any(|n| n == host)
    }

    /// May a request with this `Host` header value be answered?
    pub fn host_allowed(&self, value: Option<&str>) -> bool {
        if self.any {
            return true;
        }
        let Some((host, _)) = value.and_then(authority) else {
            return false;
        };
        if host == "localhost" || host == "localhost." || self.configured(&host) {
            return true;
        }
        match ip_of(&host) {
            Some(ip) => {
                is_loopback(ip) || ip == self.listen.ip() || self.listen.ip().is_unspecified()
            }
            None => false,
        }
    }

    /// May a state-changing request from `origin` (its `Origin` header) to `host` (its
    /// `Host` header) be served?
    pub fn origin_allowed(&self, origin: &str, host: Option<&str>) -> bool {
        let Some((scheme, o_host, o_port)) = origin_authority(origin) else {
            return false;
        };
        if self.configured(&o_host) {
            return true;
        }
        let Some((h_host, h_port)) = host.and_then(authority) else {
            return false;
        };
        let default = if scheme == "https" { 443 } else { 80 };
        o_host == h_host && o_port.unwrap_or(default) == h_port.unwrap_or(default)
    }
}

/// A 403 JSON error as every agentrun API answers (`{"code","message"}`); the connection
/// is closed (the request's body is never read).
fn refuse(code: &'static str, message: String) -> Response {
    (
        StatusCode::FORBIDDEN,
        [(header::CONNECTION, "close")],
        axum::Json(serde_json::json!({"code": code, "message": message})),
    )
        .into_response()
}

/// The middleware: the `Host` check on every request, the `Origin` check on state-changing
/// ones, before anything else (and before any body is read).
pub async fn guard(State(g): State<Arc<HostGuard>>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    if !g.host_allowed(host) {
        let shown: String = host.unwrap_or("").chars().take(100).collect();
        return refuse(
            "HOST_NOT_ALLOWED",
            format!(
                "Host {shown:?} is not a name of this server (allowed: localhost, loopback and \
                 listen addresses; add a name with `agentrun serve --allowed-host NAME`)"
            ),
        );
    }
    // An upgrade (WebSocket) is a GET a page may open cross-site with the browser's
    // credentials: checked as a state change.
    let safe = matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS)
        && !req.headers().contains_key(header::UPGRADE);
    if !safe {
        if let Some(origin) = req.headers().get(header::ORIGIN) {
            let allowed = origin.to_str().is_ok_and(|o| g.origin_allowed(o, host));
            if !allowed {
                let shown: String = String::from_utf8_lossy(origin.as_bytes())
                    .chars()
                    .take(100)
                    .collect();
                return refuse(
                    "ORIGIN_NOT_ALLOWED",
                    format!(
                        "Origin {shown:?} is not this server's own: cross-site requests are \
                         refused (add a name with `agentrun serve --allowed-host NAME`)"
                    ),
                );
            }
        }
    }
    next.run(req).await
}

/// Is a `Content-Type` value JSON (`application/json`, any parameters)? The only type a
/// JSON body is read with: a browser sends a cross-site POST without a preflight only as
/// `text/plain`, form or multipart, so refusing those (415) stops a page from posting
/// JSON-looking bodies.
pub fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(listen: &str, names: &[&str]) -> HostGuard {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        HostGuard::new(listen.parse().unwrap(), &names).unwrap()
    }

    #[test]
    fn parses_authorities() {
        assert_eq!(
            authority("LocalHost:8080"),
            Some(("localhost".into(), Some(8080)))
        );
        assert_eq!(authority("127.0.0.1"), Some(("127.0.0.1".into(), None)));
        assert_eq!(authority("[::1]:80"), Some(("[::1]".into(), Some(80))));
        assert_eq!(authority("[::1]"), Some(("[::1]".into(), None)));
        for bad in [
            "",
            ":80",
            "a:",
            "a:99999",
            "a:8x",
            "u@host",
            "host/path",
            "[::1",
            "[zz]:1",
            "[::1]x",
            "a b",
            "::1",
        ] {
            assert_eq!(authority(bad), None, "{bad:?}");
        }
        assert_eq!(
            origin_authority("HTTP://evil.test:81"),
            Some(("http", "evil.test".into(), Some(81)))
        );
        assert_eq!(origin_authority("null"), None);
        assert_eq!(origin_authority("http://a/path"), None);
        assert_eq!(origin_authority("file://x"), None);
    }

    #[test]
    fn loopback_names_the_listen_address_and_configured_names_only() {
        let g = guard("127.0.0.1:8080", &["Sandbox.Example.com."]);
        for ok in [
            "localhost:8080",
            "localhost",
            "127.0.0.1:8080",
            "127.0.0.2",
            "[::1]:8080",
            "sandbox.example.com",
            "SANDBOX.example.com:443",
            "sandbox.example.com.",
        ] {
            assert!(g.host_allowed(Some(ok)), "{ok}");
        }
        for bad in [
            None,
            Some(""),
            Some("evil.test"),
            Some("evil.test:8080"),
            Some("localhost.evil.test"),
            Some("10.0.0.5:8080"),
            Some("example.com"),
        ] {
            assert!(!g.host_allowed(bad), "{bad:?}");
        }
        let wide = guard("0.0.0.0:8080", &[]);
        assert!(wide.host_allowed(Some("10.0.0.5:8080")));
        assert!(!wide.host_allowed(Some("rebind.evil.test:8080")));
        let exact = guard("10.0.0.5:8080", &[]);
        assert!(exact.host_allowed(Some("10.0.0.5:8080")));
        assert!(!exact.host_allowed(Some("10.0.0.6:8080")));
        assert!(guard("127.0.0.1:1", &["*"]).host_allowed(Some("anything.test")));
        assert!(HostGuard::new("127.0.0.1:1".parse().unwrap(), &["a/b".into()]).is_err());
        assert!(HostGuard::new("127.0.0.1:1".parse().unwrap(), &["a:80".into()]).is_err());
    }

    #[test]
    fn only_the_servers_own_origin_changes_state() {
        let g = guard("127.0.0.1:8080", &["ui.example.com"]);
        let h = Some("127.0.0.1:8080");
        assert!(g.origin_allowed("http://127.0.0.1:8080", h));
        assert!(g.origin_allowed("https://ui.example.com", h));
        assert!(!g.origin_allowed("http://127.0.0.1:3000", h));
        assert!(!g.origin_allowed("http://localhost:8080", h));
        assert!(!g.origin_allowed("https://evil.test", h));
        assert!(!g.origin_allowed("null", h));
        assert!(!g.origin_allowed("http://127.0.0.1:8080", None));
        assert!(g.origin_allowed("http://localhost", Some("localhost:80")));
        assert!(g.origin_allowed("https://localhost", Some("localhost:443")));
        assert!(!g.origin_allowed("https://localhost", Some("localhost:80")));
    }

    /// The fuzz target's properties (`fuzz/fuzz_targets/webguard.rs`) over pseudo-random
    /// header text, so that `cargo test` checks them too.
    #[test]
    fn random_header_values_keep_the_properties() {
        let g = guard("127.0.0.1:8080", &["agentrun.example.test"]);
        let alphabet = b"aZ09.-_:[]@/ %\x00\xffhtps:/localhost127.0.0.1::1evil";
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 40) as usize;
            let bytes: Vec<u8> = (0..len)
                .map(|i| alphabet[((x >> (i % 57)) as usize + i * 7) % alphabet.len()])
                .collect();
            let text = String::from_utf8_lossy(&bytes);
            if let Some((host, _)) = authority(&text) {
                assert!(!host.is_empty() && host == host.to_ascii_lowercase());
                assert_eq!(authority(&host).map(|(h, _)| h), Some(host.clone()));
            }
            if g.host_allowed(Some(&text)) {
                let (host, _) = authority(&text).expect("an allowed Host parses");
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                assert!(
                    host.trim_end_matches('.') == "localhost"
                        || host.trim_end_matches('.') == "agentrun.example.test"
                        || bare.parse::<IpAddr>().is_ok(),
                    "{text:?}"
                );
            }
            if g.origin_allowed(&text, Some("127.0.0.1:8080")) {
                assert!(origin_authority(&text).is_some(), "{text:?}");
            }
            if let Ok(k) = crate::keyfile::parse(&bytes) {
                assert!((16..=512).contains(&k.len()));
            }
        }
    }

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        for bad in [
            "text/plain",
            "",
            "application/x-www-form-urlencoded",
            "application/jsonx",
            "multipart/form-data",
        ] {
            assert!(!is_json(bad), "{bad}");
        }
    }
}
