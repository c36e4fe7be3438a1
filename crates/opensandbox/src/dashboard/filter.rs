//! The audit search of the dashboard: `GET /ui/api/audit?since=&until=&kind=&decision=
//! &refused=&sandbox=&rule=&q=&trace=&limit=` parsed strictly into an [`AuditQuery`] (an
//! unknown parameter or a bad value is a one-line 400; an empty value is no filter, as an
//! HTML form sends it).

use agentrun_telemetry::AuditQuery;
use chrono::{DateTime, Utc};

/// Records one search returns at most, and by default.
pub const MAX_LIMIT: usize = 1000;
pub const DEFAULT_LIMIT: usize = 200;
/// Longest value a text filter takes.
const MAX_TEXT: usize = 256;

/// The record kinds the log holds (see [`agentrun_telemetry::AuditRecord`]).
pub const KINDS: &[&str] = &["decision", "run", "policy", "error"];
/// Their decisions: a policy decision's (`allow`, `deny`, `escalate`), a run's (`ran`,
/// `denied`, `error` from `agentrun exec` and the daemon; `ok`, `error` from the MCP
/// server), an egress policy change's (`applied`), a failed connection's (`error`).
pub const DECISIONS: &[&str] = &[
    "allow", "deny", "escalate", "ran", "denied", "ok", "error", "applied",
];

/// A bad search: which parameter and why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("query parameter {name}: {message}")]
pub struct FilterError {
    pub name: String,
    pub message: String,
}

fn bad(name: &str, message: impl Into<String>) -> FilterError {
    FilterError {
        name: name.to_string(),
        message: message.into(),
    }
}

/// An RFC 3339 time, or a duration ago (`30s`, `10m`, `2h`), as `agentrun audit --since`.
fn parse_time(name: &str, v: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, FilterError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(v) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = agentrun_policy::parse_duration(v).map_err(|_| {
        bad(
            name,
            format!("{v:?} is not an RFC 3339 time or a duration (10m)"),
        )
    })?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .ok_or_else(|| bad(name, format!("{v:?} is too long ago")))
}

fn one_of(name: &str, v: &str, allowed: &[&str]) -> Result<String, FilterError> {
    if allowed.contains(&v) {
        Ok(v.to_string())
    } else {
        Err(bad(
            name,
            format!("{v:?} is not one of {}", allowed.join(", ")),
        ))
    }
}

fn text(name: &str, v: &str) -> Result<String, FilterError> {
    if v.len() > MAX_TEXT {
        return Err(bad(name, format!("longer than {MAX_TEXT} bytes")));
    }
    Ok(v.to_string())
}

/// The search with no filter: the newest [`DEFAULT_LIMIT`] records.
pub fn unfiltered() -> AuditQuery {
    AuditQuery {
        limit: DEFAULT_LIMIT,
        ..AuditQuery::default()
    }
}

/// Parses a raw query string (`None`: no parameter), times relative to `now`.
pub fn parse(query: Option<&str>, now: DateTime<Utc>) -> Result<AuditQuery, FilterError> {
    let mut f = unfiltered();
    let mut seen: Vec<String> = Vec::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if seen.iter().any(|s| *s == k) {
            return Err(bad(&k, "given twice"));
        }
        seen.push(k.to_string());
        let v = v.trim();
        if v.is_empty() {
            if !matches!(
                &*k,
                "since"
                    | "until"
                    | "kind"
                    | "decision"
                    | "refused"
                    | "sandbox"
                    | "rule"
                    | "q"
                    | "trace"
                    | "limit"
            ) {
                return Err(bad(&k, "no such parameter"));
            }
            continue;
        }
        match &*k {
            "since" => f.since = Some(parse_time("since", v, now)?),
            "until" => f.until = Some(parse_time("until", v, now)?),
            "kind" => f.kind = Some(one_of("kind", v, KINDS)?),
            "decision" => f.decision = Some(one_of("decision", v, DECISIONS)?),
            "refused" => {
                f.refused = match v {
                    "1" | "true" | "on" => true,
                    "0" | "false" | "off" => false,
                    _ => return Err(bad("refused", format!("{v:?} is not true or false"))),
                }
            }
            "sandbox" => f.sandbox = Some(text("sandbox", v)?),
            "rule" => f.rule = Some(text("rule", v)?),
            "q" => f.text = Some(text("q", v)?),
            "trace" => f.trace = Some(text("trace", v)?),
            "limit" => {
                f.limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        bad(
                            "limit",
                            format!("{v:?} is not a number from 1 to {MAX_LIMIT}"),
                        )
                    })?
            }
            other => return Err(bad(other, "no such parameter")),
        }
    }
    if let (Some(s), Some(u)) = (f.since, f.until) {
        if s > u {
            return Err(bad("until", "before since"));
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-27T06:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn parse(q: &str) -> Result<AuditQuery, FilterError> {
        super::parse(Some(q), now())
    }

    #[test]
    fn every_filter_parses() {
        let f = parse(
            "since=10m&until=2026-11-27T05:59:00Z&kind=decision&decision=deny&refused=1\
             &sandbox=sb-1&rule=network.default&q=evil&trace=abc&limit=5",
        )
        .unwrap();
        assert_eq!(f.since.unwrap().to_rfc3339(), "2026-11-27T05:50:00+00:00");
        assert_eq!(f.until.unwrap().to_rfc3339(), "2026-11-27T05:59:00+00:00");
        assert_eq!(f.kind.as_deref(), Some("decision"));
        assert_eq!(f.decision.as_deref(), Some("deny"));
        assert!(f.refused);
        assert_eq!(f.sandbox.as_deref(), Some("sb-1"));
        assert_eq!(f.rule.as_deref(), Some("network.default"));
        assert_eq!(f.text.as_deref(), Some("evil"));
        assert_eq!(f.trace.as_deref(), Some("abc"));
        assert_eq!(f.limit, 5);
    }

    #[test]
    fn empty_values_are_no_filter() {
        let f = parse("since=&kind=&decision=&sandbox=&q=&limit=").unwrap();
        assert_eq!(f, unfiltered());
        assert_eq!(super::parse(None, now()).unwrap(), unfiltered());
    }

    #[test]
    fn bad_values_say_which_parameter() {
        for (q, name) in [
            ("kind=nope", "kind"),
            ("decision=maybe", "decision"),
            ("since=yesterday", "since"),
            ("until=soon", "until"),
            ("limit=0", "limit"),
            ("limit=100000", "limit"),
            ("limit=-1", "limit"),
            ("refused=yes", "refused"),
            ("color=red", "color"),
            ("color=", "color"),
            ("kind=run&kind=decision", "kind"),
            ("since=1m&until=2h", "until"),
        ] {
            let e = parse(q).unwrap_err();
            assert_eq!(e.name, name, "{q}: {e}");
        }
        let long = format!("q={}", "a".repeat(300));
        assert_eq!(parse(&long).unwrap_err().name, "q");
    }
}
