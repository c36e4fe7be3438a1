//! One host rule: a `HOST[:PORT]` pattern (a name, a `*.domain` wildcard, `*`, an address
//! or a range) with its action, and the address ranges it may name. Below both the network
//! policy ([`crate::network`]) and the HTTP rules ([`crate::http`]), which match hosts with it.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// Allow, deny, or ask a person (escalate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleAction {
    Allow,
    Deny,
    /// Only from a profile's `[network] escalate`: never read from an OpenSandbox
    /// `networkPolicy` (whose API has allow and deny only, and no one to ask).
    #[serde(skip_deserializing)]
    Escalate,
}

/// One rule: a host pattern and an optional port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRule {
    /// Where the rule comes from, e.g. `network.allow[0]` or `cli.allow_host[1]`.
    pub id: String,
    pub action: RuleAction,
    /// Lower-case host name, `*.suffix` wildcard, `*`, or a literal IP address.
    pub host: String,
    /// `None`: any port.
    pub port: Option<u16>,
}

impl HostRule {
    /// Parses `HOST[:PORT]` (`[v6addr]:port` for IPv6). Errors say why in a few words.
    pub fn parse(
        id: impl Into<String>,
        action: RuleAction,
        spec: &str,
    ) -> Result<Self, HostRuleError> {
        let spec = spec.trim();
        let (host, port) = split_host_port(spec)?;
        validate_host_pattern(&host)?;
        Ok(HostRule {
            id: id.into(),
            action,
            host,
            port,
        })
    }

    /// Whether this rule covers `host:port` (`host` already lower-cased).
    pub fn matches(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        let literal = parse_ip(host);
        if let Some(net) = self.address() {
            return literal.is_some_and(|ip| net.contains(ip));
        }
        match self.host.strip_prefix("*.") {
            _ if self.host == "*" => true,
            // An address is not a name under a domain: `*.1` does not cover 10.0.0.1.
            _ if literal.is_some() => false,
            // `*.example.com` covers sub.example.com and a.b.example.com, not example.com.
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
            None => self.host == host,
        }
    }

    /// The address or range this rule names, if it names one.
    pub fn address(&self) -> Option<IpNet> {
        IpNet::parse(&self.host)
    }

    /// Whether the rule names one host exactly (not a wildcard, `*`, an address or a range).
    pub fn names_exact_host(&self) -> bool {
        !self.host.starts_with('*') && self.address().is_none()
    }

    /// `host[:port]` as written in a profile.
    pub fn target(&self) -> String {
        match self.port {
            Some(p) if self.host.contains(':') => format!("[{}]:{p}", self.host),
            Some(p) => format!("{}:{p}", self.host),
            None if self.host.contains(':') => format!("[{}]", self.host),
            None => self.host.clone(),
        }
    }
}

/// An address or a range of addresses (`10.0.0.0/8`, `fd00::/8`; a bare address is a
/// range of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// `ADDR` or `ADDR/PREFIX`; `None` if it is neither.
    pub fn parse(s: &str) -> Option<IpNet> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr = parse_ip(addr)?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().ok().filter(|p| *p <= max)?
            }
            Some(_) => return None,
            None => max,
        };
        Some(IpNet { addr, prefix })
    }

    /// Whether `ip` is in this range (IPv4-mapped IPv6 is compared as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// An IP literal (IPv4-mapped IPv6 as IPv4), or `None` for a name.
pub(crate) fn parse_ip(host: &str) -> Option<IpAddr> {
    host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// Why a `HOST[:PORT]` rule does not parse; the words say it, `spec` is the rule as written.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum HostRuleError {
    #[error("empty host")]
    Empty,
    #[error("{spec:?}: missing ']'")]
    MissingBracket { spec: String },
    #[error("{spec:?}: expected ':PORT' after ']'")]
    PortAfterBracket { spec: String },
    #[error("{spec:?}: write IPv6 addresses as [ADDR]:PORT")]
    BareIpv6 { spec: String },
    #[error("{spec:?}: invalid port {port:?} (1-65535)")]
    Port { spec: String, port: String },
    #[error("{host:?} is not an address range (ADDR/PREFIX, e.g. 10.0.0.0/8)")]
    Range { host: String },
    #[error("{host:?} is not a host name, '*.domain' wildcard, IP address or ADDR/PREFIX range")]
    Host { host: String },
}

/// Splits `HOST[:PORT]`; the host is lower-cased.
fn split_host_port(spec: &str) -> Result<(String, Option<u16>), HostRuleError> {
    if spec.is_empty() {
        return Err(HostRuleError::Empty);
    }
    let (host, port) = if let Some(rest) = spec.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| HostRuleError::MissingBracket { spec: spec.into() })?;
        match after {
            "" => (h, None),
            p => (
                h,
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| HostRuleError::PortAfterBracket { spec: spec.into() })?,
                ),
            ),
        }
    } else {
        match spec.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return Err(HostRuleError::BareIpv6 { spec: spec.into() }),
            None => (spec, None),
        }
    };
    let port = port
        .map(|p| match p.parse::<u16>() {
            Ok(0) | Err(_) => Err(HostRuleError::Port {
                spec: spec.into(),
                port: p.into(),
            }),
            Ok(n) => Ok(n),
        })
        .transpose()?;
    Ok((host.to_ascii_lowercase(), port))
}

fn validate_host_pattern(host: &str) -> Result<(), HostRuleError> {
    if host == "*" || host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    if host.contains('/') {
        return IpNet::parse(host)
            .map(drop)
            .ok_or_else(|| HostRuleError::Range { host: host.into() });
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(HostRuleError::Host { host: host.into() });
    }
    Ok(())
}
