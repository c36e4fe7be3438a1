//! What the HTTP listeners read before anything else (`crates/webguard`, the dashboard's
//! cookies): the first byte picks the input.
//! - 0: a `Host` header value: [`HostGuard::host_allowed`] on a loopback and a wildcard
//!   listener. Property: a host part [`authority`] returns is lower case, non-empty and
//!   re-parses to itself; an allowed host on the loopback listener is a loopback name, an IP
//!   address or the configured name.
//! - 1: an `Origin`, NUL, a `Host`: [`HostGuard::origin_allowed`]. Property: an allowed
//!   origin parses ([`origin_authority`]).
//! - 2: a key file's bytes ([`keyfile::parse`]). Property: an accepted key is 16 to 512
//!   URL-safe characters and parses to itself.
//! - 3: `Cookie` header values (the dashboard's session and login cookies).
//! - 4: `X-Forwarded-Proto`, NUL, `Forwarded` (the `Secure` cookie decision).
//! - 5: a `Content-Type` ([`is_json`]).
#![no_main]

use agentrun_opensandbox::dashboard::session;
use agentrun_webguard::origin::{authority, origin_authority};
use agentrun_webguard::{is_json, keyfile, HostGuard};
use axum::http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;

fn header_map(name: &'static str, values: &[&[u8]]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        if let Ok(v) = HeaderValue::from_bytes(v) {
            h.append(name, v);
        }
    }
    h
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    match which % 6 {
        0 => {
            if let Some((host, _)) = authority(&text) {
                assert!(!host.is_empty());
                assert_eq!(host, host.to_ascii_lowercase());
                assert_eq!(authority(&host).map(|(h, _)| h), Some(host.clone()));
            }
            let names = vec!["agentrun.example.test".to_string()];
            let local = HostGuard::new("127.0.0.1:8080".parse().unwrap(), &names).unwrap();
            let wide = HostGuard::new("[::]:8080".parse().unwrap(), &[]).unwrap();
            if local.host_allowed(Some(&text)) {
                let (host, _) = authority(&text).expect("an allowed Host parses");
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                assert!(
                    host.trim_end_matches('.') == "localhost"
                        || host.trim_end_matches('.') == "agentrun.example.test"
                        || bare.parse::<std::net::IpAddr>().is_ok(),
                    "{text:?} allowed"
                );
            }
            let _ = wide.host_allowed(Some(&text));
        }
        1 => {
            let (origin, host) = text.split_once('\0').unwrap_or((&text, ""));
            let g = HostGuard::new("127.0.0.1:8080".parse().unwrap(), &[]).unwrap();
            if g.origin_allowed(origin, Some(host)) {
                assert!(origin_authority(origin).is_some());
            }
        }
        2 => {
            if let Ok(key) = keyfile::parse(rest) {
                assert!((16..=512).contains(&key.len()));
                assert!(key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.~".contains(&b)));
                assert_eq!(keyfile::parse(key.as_bytes()), Ok(key));
            }
        }
        3 => {
            let parts: Vec<&[u8]> = rest.split(|b| *b == 0).collect();
            let h = header_map("cookie", &parts);
            let _ = session::cookie_of(&h);
            let _ = session::named_cookie(&h, session::LOGIN_COOKIE);
        }
        4 => {
            let (xfp, fwd) = match rest.iter().position(|b| *b == 0) {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &b""[..]),
            };
            let mut h = header_map("x-forwarded-proto", &[xfp]);
            if let Ok(v) = HeaderValue::from_bytes(fwd) {
                h.append("forwarded", v);
            }
            let _ = session::came_over_tls(&h);
        }
        _ => {
            if is_json(&text) {
                assert!(text
                    .split(';')
                    .next()
                    .unwrap()
                    .trim()
                    .eq_ignore_ascii_case("application/json"));
            }
        }
    }
});
