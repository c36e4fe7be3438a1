//! L7 rules: what a sandbox may send to a host, by method, path prefix and header, decided
//! by the egress proxy per request (inside intercepted TLS, or in a forwarded plain-HTTP
//! request).
//!
//! A profile lists them in `[network]` as `http_deny`, `http_allow` and `http_escalate`
//! (evaluated in that order; the first match decides), each entry one string:
//!
//! ```text
//! METHOD HOST[:PORT][/PATH_PREFIX] [HEADER[=VALUE]]
//! ```
//!
//! `METHOD` is a method name or `*`; `HOST` a name, `*.suffix` or an address as in host
//! rules (port: any when left out); `PATH_PREFIX` matches the request's path (without the
//! query) by prefix, `/` when left out; `HEADER` requires the field to be present, with
//! `=VALUE` to have exactly that value. Example: `http_deny = ["DELETE api.github.com/repos/"]`,
//! `http_allow = ["GET api.github.com", "POST api.github.com/graphql"]`.
//!
//! A request to a host no L7 rule names is not decided here (its connection was). For a host
//! some rule names, a request no rule matches is denied when an `http_allow` rule names the
//! host (an allowlist of requests), else allowed (rule `network.http_default`). Paths are
//! compared as sent; a path with a dot segment, an empty segment, a backslash or an encoded
//! `.`, `/` or `\` is denied for such a host (rule `network.http_path`): a prefix rule could
//! otherwise be walked around by a path the upstream normalizes.

use serde::{Deserialize, Serialize};

use crate::decision::Decision;
use crate::host::{HostRule, HostRuleError, RuleAction};
use crate::request::HttpRequest;

/// One L7 rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpRule {
    /// `network.http_deny[0]`, ...
    pub id: String,
    pub action: RuleAction,
    /// Upper-case method, or `None` for any.
    pub method: Option<String>,
    /// The host (and port) part, matched as a host rule.
    pub host: HostRule,
    /// Path prefix, starting with `/`.
    pub path: String,
    /// Lower-case field name and the exact value required, if any.
    pub header: Option<(String, Option<String>)>,
}

fn token_ok(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Why an HTTP rule does not parse; `spec` is the rule as written.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum HttpRuleError {
    #[error("{spec:?}: expected \"METHOD HOST[:PORT][/PATH] [HEADER[=VALUE]]\"")]
    Shape { spec: String },
    #[error("{spec:?}: {method:?} is not a method or *")]
    Method { spec: String, method: String },
    #[error("{spec:?}: the path prefix has a space, control character, '?' or '#'")]
    Path { spec: String },
    #[error("{spec:?}: {source}")]
    Host { spec: String, source: HostRuleError },
    #[error("{spec:?}: {name:?} is not a header name")]
    Header { spec: String, name: String },
}

impl HttpRule {
    /// Parses `METHOD HOST[:PORT][/PATH] [HEADER[=VALUE]]` (see the module docs).
    pub fn parse(
        id: impl Into<String>,
        action: RuleAction,
        spec: &str,
    ) -> Result<Self, HttpRuleError> {
        let parts: Vec<&str> = spec.split_whitespace().collect();
        let (method, target, header) = match parts.as_slice() {
            [m, t] => (*m, *t, None),
            [m, t, h] => (*m, *t, Some(*h)),
            _ => return Err(HttpRuleError::Shape { spec: spec.into() }),
        };
        let method = match method {
            "*" => None,
            m if token_ok(m) && m.bytes().all(|b| b.is_ascii_alphabetic()) => {
                Some(m.to_ascii_uppercase())
            }
            m => {
                return Err(HttpRuleError::Method {
                    spec: spec.into(),
                    method: m.into(),
                })
            }
        };
        // The path starts at the first '/' that is not inside brackets (an IPv6 address).
        let split = match target.find(']') {
            Some(close) => target[close..].find('/').map(|i| close + i),
            None => target.find('/'),
        };
        let (hostport, path) = match split {
            Some(i) => (&target[..i], &target[i..]),
            None => (target, "/"),
        };
        if path
            .bytes()
            .any(|b| b <= b' ' || b == 0x7f || b == b'?' || b == b'#')
        {
            return Err(HttpRuleError::Path { spec: spec.into() });
        }
        let host = HostRule::parse("", action, hostport).map_err(|source| HttpRuleError::Host {
            spec: spec.into(),
            source,
        })?;
        let header = match header {
            None => None,
            Some(h) => {
                let (name, value) = match h.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_owned())),
                    None => (h, None),
                };
                if !token_ok(name) {
                    return Err(HttpRuleError::Header {
                        spec: spec.into(),
                        name: name.into(),
                    });
                }
                Some((name.to_ascii_lowercase(), value))
            }
        };
        let id = id.into();
        Ok(HttpRule {
            host: HostRule {
                id: id.clone(),
                ..host
            },
            id,
            action,
            method,
            path: path.to_owned(),
            header,
        })
    }

    fn matches_host(&self, host: &str, port: u16) -> bool {
        self.host.matches(host, port)
    }

    /// Whether the rule matches `req` (its host lowercased without a trailing dot, its path
    /// without the query).
    fn matches(&self, req: &HttpRequest<'_>) -> bool {
        self.matches_host(req.host, req.port)
            && self
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(req.method))
            && req.path.starts_with(&self.path)
            && self.header.as_ref().is_none_or(|(name, value)| {
                req.fields
                    .iter()
                    .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                    .any(|(_, v)| value.as_ref().is_none_or(|want| want.as_bytes() == v))
            })
    }

    /// The rule as written (for reasons).
    pub fn target(&self) -> String {
        let mut s = format!(
            "{} {}{}",
            self.method.as_deref().unwrap_or("*"),
            self.host.target(),
            if self.path == "/" { "" } else { &self.path }
        );
        if let Some((n, v)) = &self.header {
            s.push(' ');
            s.push_str(n);
            if v.is_some() {
                s.push_str("=...");
            }
        }
        s
    }
}

/// A path a prefix rule cannot be trusted on: dot or empty segments, backslashes, encoded
/// `.`, `/`, `\`.
fn ambiguous_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || path.contains('\\')
        || path.contains("//")
        || path.split('/').any(|seg| seg == "." || seg == "..")
}

/// Decides one request against `rules`; `None` when no rule names its `host:port` (the
/// request is not an L7 decision).
pub fn check_http(rules: &[HttpRule], req: &HttpRequest<'_>) -> Option<Decision> {
    let HttpRequest {
        method, port, path, ..
    } = *req;
    let host = req.host.trim_end_matches('.').to_ascii_lowercase();
    if !rules.iter().any(|r| r.matches_host(&host, port)) {
        return None;
    }
    let path = path.split('?').next().unwrap_or(path);
    if ambiguous_path(path) {
        return Some(Decision::deny(
            "network.http_path",
            format!("{method} {path}: a path with dot or empty segments or encoded separators is refused for {host}:{port}, which has HTTP rules"),
        ));
    }
    let what = format!("{method} {host}:{port}{path}");
    let normal = HttpRequest {
        host: &host,
        path,
        ..*req
    };
    if let Some(r) = rules.iter().find(|r| r.matches(&normal)) {
        return Some(match r.action {
            RuleAction::Allow => {
                Decision::allow(r.id.clone(), format!("{what} allowed by {}", r.target()))
            }
            RuleAction::Deny => {
                Decision::deny(r.id.clone(), format!("{what} denied by {}", r.target()))
            }
            RuleAction::Escalate => Decision::escalate(r.id.clone(), &format!("sending {what}")),
        });
    }
    let allowlist = rules
        .iter()
        .any(|r| r.action == RuleAction::Allow && r.matches_host(&host, port));
    Some(if allowlist {
        Decision::deny(
            "network.http_default",
            format!("{what}: no http_allow rule matches (the host has an allowlist of requests)"),
        )
    } else {
        Decision::allow(
            "network.http_default",
            format!("{what}: no HTTP rule matches"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Vec<HttpRule> {
        let profile = r#"
[network]
mode = "allowlist"
allow = ["*.example.com:443"]
http_deny = ["DELETE api.example.com/repos/", "* api.example.com X-Admin"]
http_allow = ["GET api.example.com", "POST api.example.com:443/graphql"]
http_escalate = ["PUT *.example.com/ X-Mode=write"]
"#;
        crate::Profile::parse(profile, "t").unwrap().network.http
    }

    /// The verdict and rule deciding `request` (`METHOD host/path [field=value]`) sent to
    /// port 443, `none` when no rule names the host.
    fn decided(request: &str) -> String {
        let mut words = request.split(' ');
        let (method, target) = (words.next().unwrap(), words.next().unwrap());
        let (host, path) = target.split_at(target.find('/').unwrap());
        let fields: Vec<(String, Vec<u8>)> = words
            .map(|f| f.split_once('=').unwrap())
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect();
        let req = HttpRequest {
            method,
            host,
            port: 443,
            path,
            fields: &fields,
        };
        check_http(&rules(), &req)
            .map_or("none".into(), |d| format!("{} {}", d.verdict(), d.rule_id))
    }

    #[test]
    fn first_match_decides_and_allowlisted_hosts_default_deny() {
        for case in [
            "GET api.example.com/repos/x?y=1 -> allow network.http_allow[0]",
            "DELETE api.example.com/repos/x -> deny network.http_deny[0]",
            "GET API.example.com./ x-admin=1 -> deny network.http_deny[1]",
            "POST api.example.com/graphql -> allow network.http_allow[1]",
            "POST api.example.com/other -> deny network.http_default",
            "PUT w.example.com/a X-Mode=write -> escalate network.http_escalate[0]",
            "PUT w.example.com/a X-Mode=read -> allow network.http_default",
            "GET other.test/ -> none",
            "GET api.example.com/repos/../admin -> deny network.http_path",
            "GET api.example.com/a/./b -> deny network.http_path",
            "GET api.example.com/a//b -> deny network.http_path",
            "GET api.example.com/a/%2e%2e/b -> deny network.http_path",
            "GET api.example.com/a%2Fb -> deny network.http_path",
            "GET api.example.com/a\\b -> deny network.http_path",
            "GET api.example.com/a/b/ -> allow network.http_allow[0]",
        ] {
            let (request, want) = case.split_once(" -> ").unwrap();
            assert_eq!(decided(request), want, "{request}");
        }
    }

    #[test]
    fn bad_specs_are_refused_with_a_reason() {
        for (spec, says) in [
            ("api.example.com", "expected"),
            ("G-T api.example.com", "not a method"),
            ("GET a b:c d", "expected"),
            ("GET bad ho(st", "not a header name"),
            ("GET api.example.com/a?b", "'?'"),
            ("GET a..b", ""),
        ] {
            let e = HttpRule::parse("x", RuleAction::Deny, spec).unwrap_err();
            assert!(e.to_string().contains(says), "{spec}: {e}");
        }
        let r = HttpRule::parse("x", RuleAction::Allow, "get [::1]:8080/v1 X-A=b").unwrap();
        assert_eq!(r.method.as_deref(), Some("GET"));
        assert_eq!(r.path, "/v1");
        assert_eq!(r.target(), "GET [::1]:8080/v1 x-a=...");
    }
}
