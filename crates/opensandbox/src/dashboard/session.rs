//! The dashboard's browser sessions: a browser cannot send `OPEN-SANDBOX-API-KEY` when it
//! navigates, so `POST /ui/login` trades the key for a random session id, set as an
//! `HttpOnly; SameSite=Strict; Path=/ui` cookie. The key itself never reaches the cookie;
//! the ids are kept here, server-side, each with its expiry, at most [`MAX_SESSIONS`] of
//! them (the oldest is dropped for a new one). An id is compared with every kept one in
//! constant time.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use agentrun_pool::{constant_time_eq, lock};

/// The cookie's name.
pub const COOKIE: &str = "agentrun_ui";
/// How long a session lasts after its login.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most.
pub const MAX_SESSIONS: usize = 256;

/// The live sessions.
#[derive(Default)]
pub struct Sessions {
    /// `(id, expiry)`, oldest first.
    live: Mutex<Vec<(String, Instant)>>,
}

impl Sessions {
    /// A new session: its id (32 random hex digits).
    pub fn create(&self) -> Result<String, agentrun_runtime::random::RandomError> {
        let id = agentrun_runtime::random::hex(16)?;
        let now = Instant::now();
        let mut live = lock(&self.live);
        live.retain(|(_, exp)| *exp > now);
        if live.len() >= MAX_SESSIONS {
            live.remove(0);
        }
        live.push((id.clone(), now + SESSION_TTL));
        Ok(id)
    }

    /// Is `id` a live session? Compared with every one kept, in constant time each.
    pub fn valid(&self, id: &str) -> bool {
        let now = Instant::now();
        let live = lock(&self.live);
        live.iter().fold(false, |found, (s, exp)| {
            found | (constant_time_eq(s.as_bytes(), id.as_bytes()) & (*exp > now))
        })
    }

    /// Ends session `id` (logout); nothing if there is none.
    pub fn remove(&self, id: &str) {
        lock(&self.live).retain(|(s, _)| !constant_time_eq(s.as_bytes(), id.as_bytes()));
    }
}

/// The session id in a request's `Cookie` headers, if any.
pub fn cookie_of(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == COOKIE).then(|| v.to_string())
        })
}

/// The `Set-Cookie` value of session `id`.
pub fn set_cookie(id: &str) -> String {
    format!(
        "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_TTL.as_secs()
    )
}

/// The `Set-Cookie` value that ends the session in the browser.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_random_kept_and_removed() {
        let s = Sessions::default();
        let a = s.create().unwrap();
        let b = s.create().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(s.valid(&a) && s.valid(&b));
        assert!(!s.valid("") && !s.valid(&a[..31]) && !s.valid("x"));
        s.remove(&a);
        assert!(!s.valid(&a) && s.valid(&b));
    }

    #[test]
    fn the_oldest_session_goes_when_full() {
        let s = Sessions::default();
        let first = s.create().unwrap();
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
        assert!(set_cookie("abc").contains("HttpOnly; SameSite=Strict"));
    }
}
