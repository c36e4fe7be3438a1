//! The dashboard's browser sessions: a browser cannot send `OPEN-SANDBOX-API-KEY` when it
//! navigates, so `POST /ui/login` trades the key for a random session id, set as an
//! `HttpOnly; SameSite=Strict; Path=/ui` cookie (`Secure` too when the request came through
//! a TLS proxy: [`came_over_tls`]). The key itself never reaches the cookie;
//! the ids are kept here, server-side, each with its expiry and its CSRF token (which the
//! page's forms carry back: [`Sessions::csrf_ok`]), at most [`MAX_SESSIONS`] of
//! them (the oldest is dropped for a new one). An id is compared with every kept one in
//! constant time. The login form has a CSRF token of its own, a cookie it must repeat
//! ([`LOGIN_COOKIE`]), and [`LoginLimiter`] bounds wrong keys per client address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agentrun_pool::{constant_time_eq, lock};

/// The cookie's name.
pub const COOKIE: &str = "agentrun_ui";
/// How long a session lasts after its login.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most.
pub const MAX_SESSIONS: usize = 256;

/// The login form's CSRF cookie (its value is repeated in the form's `csrf` field).
pub const LOGIN_COOKIE: &str = "agentrun_ui_login";
/// Wrong keys one client address may try per [`LOGIN_WINDOW`].
pub const LOGIN_FAILURES: u32 = 5;
/// The window [`LOGIN_FAILURES`] count in.
pub const LOGIN_WINDOW: Duration = Duration::from_secs(60);
/// Client addresses the limiter remembers at most (the oldest window is forgotten first).
pub const LOGIN_CLIENTS: usize = 4096;

/// A live session: its id, its CSRF token, its expiry.
struct Session {
    id: String,
    csrf: String,
    expires: Instant,
}

/// The live sessions.
#[derive(Default)]
pub struct Sessions {
    /// Oldest first.
    live: Mutex<Vec<Session>>,
}

impl Sessions {
    /// A new session: its id and its CSRF token (32 random hex digits each).
    pub fn create(&self) -> Result<(String, String), agentrun_runtime::random::RandomError> {
        let id = agentrun_runtime::random::hex(16)?;
        let csrf = agentrun_runtime::random::hex(16)?;
        let now = Instant::now();
        let mut live = lock(&self.live);
        live.retain(|s| s.expires > now);
        if live.len() >= MAX_SESSIONS {
            live.remove(0);
        }
        live.push(Session {
            id: id.clone(),
            csrf: csrf.clone(),
            expires: now + SESSION_TTL,
        });
        Ok((id, csrf))
    }

    /// The CSRF token of live session `id`, if it is one. Compared with every one kept, in
    /// constant time each.
    pub fn lookup(&self, id: &str) -> Option<String> {
        let now = Instant::now();
        let live = lock(&self.live);
        let mut found = None;
        for s in live.iter() {
            if constant_time_eq(s.id.as_bytes(), id.as_bytes()) & (s.expires > now) {
                found = Some(s.csrf.clone());
            }
        }
        found
    }

    /// Is `id` a live session?
    pub fn valid(&self, id: &str) -> bool {
        self.lookup(id).is_some()
    }

    /// Is `csrf` the CSRF token of live session `id`?
    pub fn csrf_ok(&self, id: &str, csrf: &str) -> bool {
        self.lookup(id)
            .is_some_and(|t| constant_time_eq(t.as_bytes(), csrf.as_bytes()))
    }

    /// Ends session `id` (logout); nothing if there is none.
    pub fn remove(&self, id: &str) {
        lock(&self.live).retain(|s| !constant_time_eq(s.id.as_bytes(), id.as_bytes()));
    }
}

/// Wrong dashboard keys per client address: at most [`LOGIN_FAILURES`] a
/// [`LOGIN_WINDOW`], then every login from that address is refused (429) until the window
/// ends. Bounded: at most [`LOGIN_CLIENTS`] addresses (IPv6 by their /64), the oldest
/// forgotten first.
#[derive(Default)]
pub struct LoginLimiter {
    clients: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

/// The address a client is counted by (an IPv6 address by its /64: one host has many).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

impl LoginLimiter {
    /// `Err(how long to wait)` while `ip` is over its failures.
    pub fn check(&self, ip: IpAddr) -> Result<(), Duration> {
        let now = Instant::now();
        let clients = lock(&self.clients);
        match clients.get(&client_key(ip)) {
            Some((n, start)) if *n >= LOGIN_FAILURES && now < *start + LOGIN_WINDOW => {
                Err(*start + LOGIN_WINDOW - now)
            }
            _ => Ok(()),
        }
    }

    /// Counts a wrong key from `ip`.
    pub fn failed(&self, ip: IpAddr) {
        let now = Instant::now();
        let mut clients = lock(&self.clients);
        if clients.len() >= LOGIN_CLIENTS {
            clients.retain(|_, (_, start)| now < *start + LOGIN_WINDOW);
            if clients.len() >= LOGIN_CLIENTS {
                if let Some(oldest) = clients.iter().min_by_key(|(_, (_, s))| *s).map(|(k, _)| *k) {
                    clients.remove(&oldest);
                }
            }
        }
        let e = clients.entry(client_key(ip)).or_insert((0, now));
        if now >= e.1 + LOGIN_WINDOW {
            *e = (0, now);
        }
        e.0 += 1;
    }

    /// A right key from `ip`: its count starts over.
    pub fn succeeded(&self, ip: IpAddr) {
        lock(&self.clients).remove(&client_key(ip));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.clients).len()
    }
}

/// Did the request come through a TLS-terminating proxy (`X-Forwarded-Proto: https` or
/// `Forwarded: proto=https`)? agentrun serves no TLS itself. Taken from any client: it only
/// ever adds `Secure` to that client's own cookie (a liar locks itself out over plain
/// HTTP), never takes it away.
pub fn came_over_tls(headers: &axum::http::HeaderMap) -> bool {
    let xfp = headers
        .get_all("x-forwarded-proto")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case("https"));
    let fwd = headers
        .get_all("forwarded")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([',', ';']))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| {
            k.trim().eq_ignore_ascii_case("proto")
                && v.trim().trim_matches('"').eq_ignore_ascii_case("https")
        });
    xfp || fwd
}

/// The session id in a request's `Cookie` headers, if any.
pub fn cookie_of(headers: &axum::http::HeaderMap) -> Option<String> {
    named_cookie(headers, COOKIE)
}

/// Cookie `name`'s value in a request's `Cookie` headers (the first), if any.
pub fn named_cookie(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then(|| v.to_string())
        })
}

fn secure_attr(secure: bool) -> &'static str {
    if secure {
        "; Secure"
    } else {
        ""
    }
}

/// The `Set-Cookie` value of session `id`.
pub fn set_cookie(id: &str, secure: bool) -> String {
    format!(
        "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{}",
        SESSION_TTL.as_secs(),
        secure_attr(secure)
    )
}

/// The `Set-Cookie` value that ends the session in the browser.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0{}",
        secure_attr(secure)
    )
}

/// The `Set-Cookie` value of the login form's CSRF token.
pub fn login_cookie(token: &str, secure: bool) -> String {
    format!(
        "{LOGIN_COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=3600{}",
        secure_attr(secure)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_random_kept_and_removed() {
        let s = Sessions::default();
        let (a, ca) = s.create().unwrap();
        let (b, _) = s.create().unwrap();
        assert_ne!(a, b);
        assert!(s.csrf_ok(&a, &ca) && !s.csrf_ok(&b, &ca) && !s.csrf_ok(&a, ""));
        assert_eq!(a.len(), 32);
        assert!(s.valid(&a) && s.valid(&b));
        assert!(!s.valid("") && !s.valid(&a[..31]) && !s.valid("x"));
        s.remove(&a);
        assert!(!s.valid(&a) && s.valid(&b));
    }

    #[test]
    fn the_oldest_session_goes_when_full() {
        let s = Sessions::default();
        let (first, _) = s.create().unwrap();
        for _ in 0..MAX_SESSIONS {
            s.create().unwrap();
        }
        assert!(!s.valid(&first));
        assert_eq!(lock(&s.live).len(), MAX_SESSIONS);
    }

    #[test]
    fn cookie_is_found_among_others() {
        let mut h = axum::http::HeaderMap::new();
        h.append("cookie", "a=1; agentrun_ui=abc; b=2".parse().unwrap());
        assert_eq!(cookie_of(&h).as_deref(), Some("abc"));
        let mut h = axum::http::HeaderMap::new();
        h.append("cookie", "agentrun_uix=abc".parse().unwrap());
        assert_eq!(cookie_of(&h), None);
        assert!(set_cookie("abc", false).contains("HttpOnly; SameSite=Strict"));
        assert!(!set_cookie("abc", false).contains("Secure"));
        assert!(set_cookie("abc", true).ends_with("; Secure"));
    }

    #[test]
    fn tls_is_what_the_proxy_says() {
        let mut h = axum::http::HeaderMap::new();
        assert!(!came_over_tls(&h));
        h.insert("x-forwarded-proto", "HTTPS".parse().unwrap());
        assert!(came_over_tls(&h));
        let mut h = axum::http::HeaderMap::new();
        h.insert("forwarded", "for=1.2.3.4;proto=\"https\"".parse().unwrap());
        assert!(came_over_tls(&h));
        h.insert("forwarded", "for=1.2.3.4;proto=http".parse().unwrap());
        assert!(!came_over_tls(&h));
    }

    #[test]
    fn wrong_keys_are_limited_per_address_in_bounded_memory() {
        let l = LoginLimiter::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..LOGIN_FAILURES {
            assert!(l.check(a).is_ok());
            l.failed(a);
        }
        assert!(l.check(a).is_err());
        assert!(l.check(b).is_ok());
        l.succeeded(a);
        assert!(l.check(a).is_ok());
        // IPv6 by its /64.
        let v6a: IpAddr = "2001:db8::1".parse().unwrap();
        let v6b: IpAddr = "2001:db8::2".parse().unwrap();
        for _ in 0..LOGIN_FAILURES {
            l.failed(v6a);
        }
        assert!(l.check(v6b).is_err());
        for i in 0..(LOGIN_CLIENTS as u32 + 100) {
            l.failed(IpAddr::V4(std::net::Ipv4Addr::from(i)));
        }
        assert!(l.len() <= LOGIN_CLIENTS);
    }
}
