//! The network part of a profile: `none`, an ordered list of host rules, or `all`.
//!
//! A sandbox always has its own network namespace with only loopback. With `allowlist` or
//! `all`, its HTTP(S) traffic leaves through agentrun's egress proxy, which asks
//! [`NetworkPolicy::check`] about every `host:port` before it resolves or connects anything.
//! Rules are evaluated in order; the first match decides; otherwise the default action does.
//! [`NetworkPolicy::from_opensandbox`] maps an OpenSandbox `networkPolicy` onto this model.
//!
//! A rule names a host (`pypi.org`), a wildcard (`*.pythonhosted.org`, never matching an IP
//! literal), every host (`*`), an address (`127.0.0.1`, `[::1]`) or a range (`10.0.0.0/8`,
//! `[fd00::/8]`), each with an optional port. What a connection may reach once its name is
//! resolved is decided by [`NetworkPolicy::check_address`], by the [`AddressScope`] of each
//! address:
//! - **public**: whatever the rules decided for the name;
//! - **private** (RFC 1918, CGNAT, benchmarking, unique-local `fc00::/7`, site-local): through
//!   a name only when an allow rule names that exact host (`internal.corp:443`, not
//!   `*.corp`, `*` or `mode = "all"`) or an allow rule names the address or its range; asked
//!   for literally, only when an allow rule names the address or its range;
//! - **host-internal** (loopback, link-local incl. `169.254.169.254`, cloud metadata such as
//!   `168.63.129.16`, `100.100.100.200`, `fd00:ec2::254`, unspecified, multicast, broadcast,
//!   reserved): never through a name; asked for literally, only when an allow rule names the
//!   address or its range.
//!
//! IPv4 embedded in IPv6 (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, NAT64
//! `64:ff9b::/96` and `64:ff9b:1::/48`, 6to4 `2002::/16`, Teredo `2001::/32`) is judged as the
//! IPv4 address it reaches. A deny rule naming an address or range denies it whatever name
//! led there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use crate::decision::Decision;
use crate::host::parse_ip;
pub use crate::host::{HostRule, HostRuleError, IpNet, RuleAction};

/// How much network a sandbox gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Own network namespace with only loopback: nothing outside is reachable.
    #[default]
    None,
    /// Only the hosts the rules allow, through the egress proxy.
    Allowlist,
    /// Every host, still only through the egress proxy (every connection is decided and traced).
    All,
}

/// What an address reaches (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressScope {
    /// The internet.
    Public,
    /// A private network the host is on.
    Private,
    /// The host itself, its link, or a cloud metadata service.
    HostInternal,
}

impl AddressScope {
    /// The scope of `ip`.
    pub fn of(ip: IpAddr) -> AddressScope {
        match ip {
            IpAddr::V4(v4) => scope_v4(v4),
            IpAddr::V6(v6) => scope_v6(v6),
        }
    }

    /// How it reads in a reason.
    pub fn describe(self) -> &'static str {
        match self {
            AddressScope::Public => "public",
            AddressScope::Private => "private",
            AddressScope::HostInternal => "host-internal",
        }
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn scope_v4(ip: Ipv4Addr) -> AddressScope {
    const INTERNAL: [([u8; 4], u32); 8] = [
        ([0, 0, 0, 0], 8),          // "this network", unspecified
        ([127, 0, 0, 0], 8),        // loopback
        ([169, 254, 0, 0], 16),     // link-local, incl. 169.254.169.254 (metadata)
        ([224, 0, 0, 0], 4),        // multicast
        ([240, 0, 0, 0], 4),        // reserved, broadcast
        ([168, 63, 129, 16], 32),   // Azure wireserver / metadata
        ([100, 100, 100, 200], 32), // Alibaba Cloud metadata
        ([192, 0, 0, 192], 32),     // Oracle Cloud metadata (legacy)
    ];
    const PRIVATE: [([u8; 4], u32); 6] = [
        ([10, 0, 0, 0], 8),
        ([172, 16, 0, 0], 12),
        ([192, 168, 0, 0], 16),
        ([100, 64, 0, 0], 10), // carrier-grade NAT
        ([198, 18, 0, 0], 15), // benchmarking
        ([192, 0, 0, 0], 24),  // IETF protocol assignments
    ];
    if INTERNAL.iter().any(|(n, p)| in_v4(ip, *n, *p)) {
        AddressScope::HostInternal
    } else if PRIVATE.iter().any(|(n, p)| in_v4(ip, *n, *p)) {
        AddressScope::Private
    } else {
        AddressScope::Public
    }
}

/// The IPv4 address an IPv6 address reaches through a translation or tunnel mechanism.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(ip);
    let seg = ip.segments();
    let low32 = Ipv4Addr::from(bits as u32);
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4); // ::ffff:a.b.c.d
    }
    if bits >> 32 == 0 && bits > 1 {
        return Some(low32); // ::a.b.c.d (deprecated IPv4-compatible)
    }
    if bits >> 32 == 0xffff_0000 {
        return Some(low32); // ::ffff:0:a.b.c.d (SIIT)
    }
    if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
        return Some(low32); // 64:ff9b::/96 (NAT64)
    }
    if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2] == 1 {
        return Some(low32); // 64:ff9b:1::/48 (local NAT64)
    }
    if seg[0] == 0x2002 {
        return Some(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32)); // 6to4
    }
    if seg[0] == 0x2001 && seg[1] == 0 {
        return Some(Ipv4Addr::from(!(bits as u32))); // Teredo client
    }
    None
}

fn scope_v6(ip: Ipv6Addr) -> AddressScope {
    if let Some(v4) = embedded_v4(ip) {
        return scope_v4(v4);
    }
    let seg = ip.segments();
    let internal = ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (seg[0] & 0xffc0) == 0xfe80 // link-local
        || ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) // AWS metadata
        || (seg[0] == 0x100 && seg[1..4] == [0, 0, 0]); // discard-only 100::/64
    if internal {
        AddressScope::HostInternal
    } else if (seg[0] & 0xfe00) == 0xfc00 || (seg[0] & 0xffc0) == 0xfec0 {
        AddressScope::Private // unique-local fc00::/7 (incl. fd00::/8), site-local
    } else {
        AddressScope::Public
    }
}

/// `host:port`, `[v6]:port` for an IPv6 address.
fn connect_target(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The network policy of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NetworkPolicy {
    pub mode: NetworkMode,
    /// Evaluated in order, first match wins.
    pub rules: Vec<HostRule>,
    /// L7 rules, decided per request ([`crate::http`]); first match wins.
    #[serde(default)]
    pub http: Vec<crate::http::HttpRule>,
    /// `[network] credentials`: the profile's credential specs as written
    /// (`[AUTH:]NAME@HOST[:PORT][/PATH]=env:VAR|file:PATH`, checked by [`credential_target`]);
    /// whoever loads the profile reads the values and holds them (never the sandbox). Each
    /// one's `HOST:PORT` is allowed by a rule `network.credentials[i]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
}

/// Why a profile's credential spec is refused; the value is never quoted (it may be a
/// secret pasted in).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CredentialSpecError {
    #[error("no '@' ({CREDENTIAL_USAGE})")]
    NoAt,
    #[error("no '=' ({CREDENTIAL_USAGE})")]
    NoEquals,
    #[error("the credential needs a NAME ({CREDENTIAL_USAGE})")]
    NoName,
    #[error(
        "credential {0:?}: a profile names where the value comes from (env:VAR or \
         file:PATH, read by whoever loads the profile), never the value itself"
    )]
    InlineValue(String),
    #[error("credential {name:?}: bad port {port:?}")]
    Port { name: String, port: String },
    #[error("credential {0:?}: no HOST ({CREDENTIAL_USAGE})")]
    NoHost(String),
}

const CREDENTIAL_USAGE: &str = "expected [AUTH:]NAME@HOST[:PORT][/PATH]=env:VAR|file:PATH";

/// The `HOST:PORT` a credential spec (`[AUTH:]NAME@HOST[:PORT][/PATH]=SOURCE`, as `agentrun
/// exec --credential` takes it) is bound to; PORT defaults to 443. A profile's spec must take
/// its value from `env:VAR` or `file:PATH`: a value written in the profile is refused (a
/// profile is policy, shared and committed; a secret in it is a leaked secret).
pub fn credential_target(spec: &str) -> Result<String, CredentialSpecError> {
    let (left, right) = spec.split_once('@').ok_or(CredentialSpecError::NoAt)?;
    let (target, source) = right.split_once('=').ok_or(CredentialSpecError::NoEquals)?;
    let name = left.rsplit_once(':').map_or(left, |(_, n)| n);
    if name.is_empty() {
        return Err(CredentialSpecError::NoName);
    }
    let source_ok = source
        .strip_prefix("env:")
        .or_else(|| source.strip_prefix("file:"))
        .is_some_and(|s| !s.is_empty());
    if !source_ok {
        // Never quote the source: it may be a value someone pasted in.
        return Err(CredentialSpecError::InlineValue(name.into()));
    }
    let hostport = target.split('/').next().unwrap_or(target);
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| CredentialSpecError::Port {
                    name: name.into(),
                    port: p.into(),
                })?,
        ),
        None => (hostport, 443),
    };
    if host.is_empty() {
        return Err(CredentialSpecError::NoHost(name.into()));
    }
    Ok(format!("{}:{port}", host.to_ascii_lowercase()))
}

/// Errors mapping an OpenSandbox `networkPolicy`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetworkPolicyError {
    #[error("networkPolicy: {0}")]
    Invalid(String),
    /// A change would leave more than [`MAX_OPENSANDBOX_RULES`] rules.
    #[error("egress rule total count {0} exceeds limit {MAX_OPENSANDBOX_RULES}")]
    TooManyRules(usize),
}

/// The most rules an OpenSandbox policy may have after a `PATCH` (upstream's egress
/// sidecar's default `OPENSANDBOX_EGRESS_MAX_RULES`).
pub const MAX_OPENSANDBOX_RULES: usize = 4096;

/// An OpenSandbox `networkPolicy` (`{"defaultAction", "egress": [{"action", "target"}]}`),
/// normalised: `defaultAction` is always present (a missing one means deny; a `null` or `{}`
/// policy means allow-all), targets are trimmed and checked, and kept as written (as
/// upstream's sidecar shows them); they are compared by [`OpenSandboxRule::key`]. This is the form
/// the egress endpoint's `/policy` serves and changes; [`OpenSandboxPolicy::to_network_policy`]
/// gives the rules [`NetworkPolicy::check`] decides with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OpenSandboxPolicy {
    pub default_action: RuleAction,
    pub egress: Vec<OpenSandboxRule>,
}

/// One OpenSandbox egress rule: an FQDN or `*.domain` wildcard, any port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenSandboxRule {
    pub action: RuleAction,
    pub target: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct OsNetworkPolicy {
    default_action: Option<RuleAction>,
    #[serde(default)]
    egress: Vec<OpenSandboxRule>,
}

impl OpenSandboxRule {
    /// What a target is matched, deduplicated and deleted by: trimmed, lower-cased, without
    /// a trailing dot (`"PyPI.org."` and `"pypi.org"` are one target).
    pub fn key(target: &str) -> String {
        target.trim().trim_end_matches('.').to_ascii_lowercase()
    }

    /// The rule with its target trimmed, or why it is not valid (`what` names it).
    fn checked(&self, what: &str) -> Result<Self, NetworkPolicyError> {
        let target = self.target.trim();
        let key = Self::key(target);
        if key.contains(':') || key.contains('/') {
            return Err(NetworkPolicyError::Invalid(format!(
                "{what}.target {target:?}: only FQDNs and '*.domain' wildcards are supported"
            )));
        }
        HostRule::parse("", self.action, &key)
            .map_err(|e| NetworkPolicyError::Invalid(format!("{what}.target: {e}")))?;
        Ok(OpenSandboxRule {
            action: self.action,
            target: target.to_owned(),
        })
    }
}

impl OpenSandboxPolicy {
    /// Parses and checks a `networkPolicy` value. Per the spec a missing `defaultAction`
    /// means deny, and `null` or `{}` means allow-all.
    pub fn from_value(value: serde_json::Value) -> Result<Self, NetworkPolicyError> {
        let empty = value.is_null() || value.as_object().is_some_and(|o| o.is_empty());
        if empty {
            return Ok(OpenSandboxPolicy {
                default_action: RuleAction::Allow,
                egress: Vec::new(),
            });
        }
        let os: OsNetworkPolicy = serde_json::from_value(value)
            .map_err(|e| NetworkPolicyError::Invalid(e.to_string()))?;
        let egress = os
            .egress
            .iter()
            .enumerate()
            .map(|(i, r)| r.checked(&format!("egress[{i}]")))
            .collect::<Result<_, _>>()?;
        Ok(OpenSandboxPolicy {
            default_action: os.default_action.unwrap_or(RuleAction::Deny),
            egress,
        })
    }

    /// `PATCH /policy`: merges `rules` in, as upstream's sidecar does. Incoming rules come
    /// first (they win over existing ones), an existing rule for a target named in `rules` is
    /// dropped, and within `rules` the first rule for a target wins; targets are compared by
    /// [`OpenSandboxRule::key`]. `defaultAction` is never changed. Nothing changes when a
    /// rule is invalid, `rules` is empty, or the result would have more than
    /// [`MAX_OPENSANDBOX_RULES`] rules.
    pub fn patch(&mut self, rules: &[OpenSandboxRule]) -> Result<(), NetworkPolicyError> {
        if rules.is_empty() {
            return Err(NetworkPolicyError::Invalid(
                "at least one rule is required".into(),
            ));
        }
        let mut merged: Vec<OpenSandboxRule> = Vec::with_capacity(rules.len() + self.egress.len());
        let mut seen = std::collections::HashSet::new();
        for (i, r) in rules.iter().enumerate() {
            let r = r.checked(&format!("rules[{i}]"))?;
            if seen.insert(OpenSandboxRule::key(&r.target)) {
                merged.push(r);
            }
        }
        for e in &self.egress {
            if seen.insert(OpenSandboxRule::key(&e.target)) {
                merged.push(e.clone());
            }
        }
        if merged.len() > MAX_OPENSANDBOX_RULES {
            return Err(NetworkPolicyError::TooManyRules(merged.len()));
        }
        self.egress = merged;
        Ok(())
    }

    /// `DELETE /policy`: removes the rules for `targets` (compared by
    /// [`OpenSandboxRule::key`]; blank and unknown targets are ignored). `defaultAction` is
    /// kept. Returns how many rules were removed; an empty `targets` is an error.
    pub fn remove(&mut self, targets: &[String]) -> Result<usize, NetworkPolicyError> {
        if targets.is_empty() {
            return Err(NetworkPolicyError::Invalid(
                "at least one target is required".into(),
            ));
        }
        let keys: std::collections::HashSet<String> = targets
            .iter()
            .map(|t| OpenSandboxRule::key(t))
            .filter(|k| !k.is_empty())
            .collect();
        let before = self.egress.len();
        self.egress
            .retain(|r| !keys.contains(&OpenSandboxRule::key(&r.target)));
        Ok(before - self.egress.len())
    }

    /// The sidecar's derived `mode`, as upstream derives it: `allow_all` / `deny_all` for a
    /// policy without rules (by its `defaultAction`), `enforcing` for one with rules.
    pub fn mode(&self) -> &'static str {
        match (self.egress.is_empty(), self.default_action) {
            (true, RuleAction::Allow) => "allow_all",
            (true, RuleAction::Deny | RuleAction::Escalate) => "deny_all",
            (false, _) => "enforcing",
        }
    }

    /// The rules agentrun decides with: `networkPolicy.egress[i]` in order, then the
    /// default (`allow`: mode `all`, still through the proxy; `deny`: `allowlist`).
    pub fn to_network_policy(&self) -> NetworkPolicy {
        let rules = self
            .egress
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                HostRule::parse(
                    format!("networkPolicy.egress[{i}]"),
                    r.action,
                    &OpenSandboxRule::key(&r.target),
                )
                .ok()
            })
            .collect();
        let mode = match self.default_action {
            RuleAction::Allow => NetworkMode::All,
            RuleAction::Deny | RuleAction::Escalate => NetworkMode::Allowlist,
        };
        NetworkPolicy {
            mode,
            rules,
            http: Vec::new(),
            credentials: Vec::new(),
        }
    }

    /// The JSON form (`{"defaultAction", "egress"}`).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

impl NetworkPolicy {
    /// Whether some L7 rule names `host:port` (its requests are decided one by one, and
    /// TLS to it is intercepted where the sandbox allows interception).
    pub fn has_http_rules(&self, host: &str, port: u16) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.http.iter().any(|r| r.host.matches(&host, port))
    }

    /// Decides one request by the L7 rules; `None` when none names its `host:port`.
    pub fn check_http(&self, req: &crate::request::HttpRequest<'_>) -> Option<Decision> {
        crate::http::check_http(&self.http, req)
    }

    /// Whether traffic leaves through the egress proxy at all.
    pub fn needs_proxy(&self) -> bool {
        self.mode != NetworkMode::None
    }

    /// Adds `HOST[:PORT]` allow rules (e.g. `--allow-host`), ids `<id_prefix>[i]`, after the
    /// allow rules and before any escalate rule (an explicit allow needs no approval). Turns
    /// `none` into `allowlist`; `all` stays `all`.
    pub fn allow_hosts(&mut self, id_prefix: &str, hosts: &[String]) -> Result<(), HostRuleError> {
        let at = self
            .rules
            .iter()
            .position(|r| r.action == RuleAction::Escalate)
            .unwrap_or(self.rules.len());
        let added = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| HostRule::parse(format!("{id_prefix}[{i}]"), RuleAction::Allow, h))
            .collect::<Result<Vec<_>, _>>()?;
        self.rules.splice(at..at, added);
        if !hosts.is_empty() && self.mode == NetworkMode::None {
            self.mode = NetworkMode::Allowlist;
        }
        Ok(())
    }

    /// Decides a connection to `host:port`. The host is compared case-insensitively and
    /// literally: names are never resolved here (an allowed name does not allow its address:
    /// see [`NetworkPolicy::check_address`]).
    pub fn check(&self, host: &str, port: u16) -> Decision {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        // An IPv4-mapped address is its IPv4 address.
        let canonical = parse_ip(host).map(|ip| ip.to_string());
        let host = canonical.as_deref().unwrap_or(host);
        if self.mode == NetworkMode::None {
            return Decision::deny(
                "network.mode",
                "the profile has no network (mode = \"none\")",
            );
        }
        if let Some(rule) = self.rules.iter().find(|r| r.matches(host, port)) {
            return match rule.action {
                RuleAction::Allow => Decision::allow(
                    rule.id.clone(),
                    format!("{host}:{port} allowed by {}", rule.target()),
                ),
                RuleAction::Deny => Decision::deny(
                    rule.id.clone(),
                    format!("{host}:{port} denied by {}", rule.target()),
                ),
                RuleAction::Escalate => Decision::escalate(
                    rule.id.clone(),
                    &format!("connecting to {}", connect_target(host, port)),
                ),
            };
        }
        match self.mode {
            NetworkMode::All => Decision::allow("network.mode", "mode = \"all\" allows any host"),
            _ => Decision::deny(
                "network.default",
                format!("{host}:{port} is not in the allowlist"),
            ),
        }
    }

    /// Decides whether a connection to `host:port` that `decided` allowed may go to `ip`:
    /// `host` itself when it is an address, or one of the addresses the proxy resolved it
    /// to. Returns `decided` when it may, a denial naming why otherwise (see the module doc
    /// for the scopes). Every address a name resolves to must pass.
    pub fn check_address(&self, host: &str, port: u16, decided: &Decision, ip: IpAddr) -> Decision {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let ip = ip.to_canonical();
        let literal = parse_ip(host).is_some();
        let ip_text = ip.to_string();
        // The first rule naming this address or a range holding it.
        let by_address = self
            .rules
            .iter()
            .find(|r| r.address().is_some() && r.matches(&ip_text, port));
        if let Some(r) = by_address.filter(|r| r.action == RuleAction::Deny) {
            return Decision::deny(
                r.id.clone(),
                format!("{host}:{port} reaches {ip}, denied by {}", r.target()),
            );
        }
        let named_by_address = by_address.is_some();
        let scope = AddressScope::of(ip);
        // An allow rule naming this very host (not a wildcard, `*` or `mode = "all"`); an
        // escalate rule counts when the name itself needs approval (asking covers the address).
        let exact_name = self.rules.iter().any(|r| {
            (r.action == RuleAction::Allow
                || (decided.escalate && r.action == RuleAction::Escalate))
                && r.names_exact_host()
                && r.matches(host, port)
        });
        let allowed = match scope {
            AddressScope::Public => true,
            AddressScope::Private => named_by_address || (!literal && exact_name),
            AddressScope::HostInternal => literal && named_by_address,
        };
        if allowed {
            // An address behind an escalate rule needs approval even for an allowed name.
            if let Some(r) = by_address.filter(|r| r.action == RuleAction::Escalate) {
                if !decided.escalate {
                    return Decision::escalate(
                        r.id.clone(),
                        &format!("connecting to {host}:{port} (at {ip})"),
                    );
                }
            }
            return decided.clone();
        }
        let scope = scope.describe();
        if literal {
            Decision::deny(
                "network.internal_address",
                format!(
                    "{ip} is a {scope} address; only a rule naming it (or its range) allows it"
                ),
            )
        } else {
            let how = if scope == "private" {
                "a rule naming this host exactly, or the address or its range, allows it"
            } else {
                "a name never reaches it: use the address, with a rule naming it"
            };
            Decision::deny(
                "network.resolved_address",
                format!("{host} resolves to {ip}, a {scope} address; {how}"),
            )
        }
    }

    /// Maps an OpenSandbox `networkPolicy` (`{"defaultAction": "allow"|"deny", "egress":
    /// [{"action", "target"}]}`) onto agentrun's model (see [`OpenSandboxPolicy`]). Per the
    /// spec a missing `defaultAction` means deny, and `null` or `{}` means allow-all. Targets
    /// are FQDNs or `*.domain` wildcards on any port; rule ids are `networkPolicy.egress[i]`.
    pub fn from_opensandbox(json: &str) -> Result<Self, NetworkPolicyError> {
        let value: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| NetworkPolicyError::Invalid(format!("not JSON: {e}")))?;
        Ok(OpenSandboxPolicy::from_value(value)?.to_network_policy())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowlist(hosts: &[&str]) -> NetworkPolicy {
        let mut p = NetworkPolicy::default();
        p.allow_hosts(
            "network.allow",
            &hosts.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        p
    }

    #[test]
    fn none_denies_everything() {
        let d = NetworkPolicy::default().check("pypi.org", 443);
        assert!(!d.allow);
        assert_eq!(d.rule_id, "network.mode");
    }

    #[test]
    fn allowlist_matches_host_port_and_wildcards() {
        let p = allowlist(&["pypi.org:443", "*.pythonhosted.org", "127.0.0.1:8080"]);
        let d = p.check("PyPI.org.", 443);
        assert!(d.allow, "{d:?}");
        assert_eq!(d.rule_id, "network.allow[0]");
        assert!(!p.check("pypi.org", 80).allow);
        assert_eq!(p.check("pypi.org", 80).rule_id, "network.default");
        assert!(p.check("files.pythonhosted.org", 443).allow);
        assert!(p.check("a.b.pythonhosted.org", 8443).allow);
        assert!(
            !p.check("pythonhosted.org", 443).allow,
            "wildcard needs a label"
        );
        assert!(!p.check("evilpythonhosted.org", 443).allow);
        assert!(p.check("127.0.0.1", 8080).allow);
        assert!(!p.check("127.0.0.2", 8080).allow);
        assert!(!p.check("evil.example", 443).allow);
    }

    #[test]
    fn address_scopes() {
        use AddressScope::*;
        for (a, want) in [
            ("8.8.8.8", Public),
            ("151.101.0.223", Public),
            ("2a04:4e42::223", Public),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("172.32.0.1", Public),
            ("192.168.1.1", Private),
            ("100.64.0.1", Private),
            ("198.18.0.1", Private),
            ("fd00::1", Private),
            ("fc00::1", Private),
            ("127.0.0.1", HostInternal),
            ("127.255.0.9", HostInternal),
            ("0.0.0.0", HostInternal),
            ("0.1.2.3", HostInternal),
            ("169.254.169.254", HostInternal),
            ("168.63.129.16", HostInternal),
            ("100.100.100.200", HostInternal),
            ("224.0.0.1", HostInternal),
            ("255.255.255.255", HostInternal),
            ("::", HostInternal),
            ("::1", HostInternal),
            ("fe80::1", HostInternal),
            ("ff02::1", HostInternal),
            ("fd00:ec2::254", HostInternal),
            // IPv4 inside IPv6 is judged as the IPv4 address it reaches.
            ("::ffff:127.0.0.1", HostInternal),
            ("::ffff:169.254.169.254", HostInternal),
            ("::ffff:10.0.0.1", Private),
            ("::127.0.0.1", HostInternal),
            ("64:ff9b::a9fe:a9fe", HostInternal),
            ("64:ff9b::10.0.0.1", Private),
            ("64:ff9b::8.8.8.8", Public),
            ("64:ff9b:1::7f00:1", HostInternal),
            ("2002:7f00:1::", HostInternal),
            ("2002:a00:1::", Private),
            ("2001:0:4136:e378:8000:63bf:80ff:fffe", HostInternal), // Teredo client 127.0.0.1
        ] {
            assert_eq!(AddressScope::of(a.parse().unwrap()), want, "{a}");
        }
    }

    #[test]
    fn ranges_and_addresses_as_rules() {
        let p = allowlist(&["10.0.0.0/8:443", "[fd00::/8]", "*.1", "[::1]:80"]);
        assert!(p.check("10.1.2.3", 443).allow);
        assert!(!p.check("10.1.2.3", 80).allow);
        assert!(!p.check("11.0.0.1", 443).allow);
        assert!(p.check("fd12::1", 1).allow);
        assert!(p.check("[fd12::1]", 1).allow);
        assert!(p.check("::ffff:10.0.0.9", 443).allow, "mapped is IPv4");
        assert!(p.check("::1", 80).allow);
        // A wildcard never covers an address.
        assert!(!p.check("192.168.0.1", 8080).allow);
        assert!(p.check("host.1", 1).allow);
        assert_eq!(p.rules[1].target(), "[fd00::/8]");
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0.0/x",
            "a.com/8",
            "[fd00::/129]",
        ] {
            assert!(
                HostRule::parse("x", RuleAction::Allow, bad).is_err(),
                "{bad}"
            );
        }
        let n = IpNet::parse("172.16.0.0/12").unwrap();
        assert!(n.contains("172.31.1.1".parse().unwrap()));
        assert!(!n.contains("172.32.0.1".parse().unwrap()));
        assert!(IpNet::parse("0.0.0.0/0")
            .unwrap()
            .contains("1.2.3.4".parse().unwrap()));
    }

    fn reach(p: &NetworkPolicy, host: &str, port: u16, ip: &str) -> Decision {
        let d = p.check(host, port);
        assert!(d.allow, "{host}: {d:?}");
        p.check_address(host, port, &d, ip.parse().unwrap())
    }

    #[test]
    fn resolved_addresses_need_a_rule_naming_them() {
        let p = allowlist(&[
            "*.corp.example",
            "exact.corp.example:443",
            "*.svc.example",
            "10.9.0.0/16",
            "127.0.0.1:8080",
        ]);
        // A wildcard reaches public addresses only.
        assert!(reach(&p, "www.corp.example", 443, "93.184.216.34").allow);
        for (host, port, ip, why) in [
            ("www.corp.example", 443, "10.0.0.1", "private"),
            ("www.corp.example", 443, "fd00::1", "private"),
            ("www.corp.example", 443, "64:ff9b::a00:1", "private"),
            ("www.corp.example", 443, "::ffff:192.168.1.1", "private"),
            (
                "metadata.corp.example",
                80,
                "169.254.169.254",
                "host-internal",
            ),
            ("metadata.corp.example", 80, "127.0.0.1", "host-internal"),
            (
                "metadata.corp.example",
                80,
                "168.63.129.16",
                "host-internal",
            ),
            ("metadata.corp.example", 80, "::1", "host-internal"),
            (
                "metadata.corp.example",
                80,
                "fd00:ec2::254",
                "host-internal",
            ),
        ] {
            let d = reach(&p, host, port, ip);
            assert_eq!(d.rule_id, "network.resolved_address", "{ip}: {d:?}");
            assert!(d.reason.contains(why), "{d:?}");
        }
        // A rule naming the exact host reaches a private address, not a host-internal one.
        // (the wildcard before it decided the name; the exact rule still counts)
        let d = reach(&p, "exact.corp.example", 443, "10.0.0.1");
        assert!(d.allow, "{d:?}");
        assert!(!reach(&p, "exact.corp.example", 8443, "10.0.0.1").allow);
        assert!(!reach(&p, "exact.corp.example", 443, "127.0.0.1").allow);
        // A range rule lets any allowed name reach addresses in it.
        assert!(reach(&p, "db.svc.example", 5432, "10.9.3.4").allow);
        assert!(!reach(&p, "db.svc.example", 5432, "10.8.3.4").allow);
        // A name never reaches a host-internal address, even one a rule names.
        assert!(!reach(&p, "x.svc.example", 8080, "127.0.0.1").allow);
        // Literals: only a rule naming the address (or range).
        assert!(reach(&p, "127.0.0.1", 8080, "127.0.0.1").allow);
        assert!(reach(&p, "10.9.0.1", 1, "10.9.0.1").allow);

        // mode = "all": public yes, private and internal no, unless a rule names them.
        let mut all = NetworkPolicy {
            mode: NetworkMode::All,
            rules: Vec::new(),
            http: Vec::new(),
            credentials: Vec::new(),
        };
        all.allow_hosts("cli.allow_host", &["192.168.7.7:22".into()])
            .unwrap();
        assert!(reach(&all, "example.com", 443, "93.184.216.34").allow);
        for (host, ip, rule) in [
            ("example.com", "10.0.0.1", "network.resolved_address"),
            ("10.0.0.1", "10.0.0.1", "network.internal_address"),
            (
                "169.254.169.254",
                "169.254.169.254",
                "network.internal_address",
            ),
            (
                "::ffff:169.254.169.254",
                "169.254.169.254",
                "network.internal_address",
            ),
        ] {
            assert_eq!(reach(&all, host, 80, ip).rule_id, rule, "{host}");
        }
        assert!(reach(&all, "192.168.7.7", 22, "192.168.7.7").allow);
        // A deny rule naming an address holds whatever name leads there.
        let mut p = NetworkPolicy {
            mode: NetworkMode::All,
            rules: vec![
                HostRule::parse("network.deny[0]", RuleAction::Deny, "93.184.216.0/24").unwrap(),
            ],
            http: Vec::new(),
            credentials: Vec::new(),
        };
        let d = reach(&p, "example.com", 443, "93.184.216.34");
        assert_eq!(d.rule_id, "network.deny[0]");
        p.rules.clear();
        assert!(reach(&p, "example.com", 443, "93.184.216.34").allow);
    }

    #[test]
    fn bad_host_specs_are_explained() {
        for bad in [
            "",
            "a b",
            "pypi.org:0",
            "pypi.org:99999",
            "::1:80",
            "*.",
            "-a.com",
        ] {
            let e = HostRule::parse("x", RuleAction::Allow, bad).unwrap_err();
            assert!(!e.to_string().is_empty(), "{bad}");
        }
        let r = HostRule::parse("x", RuleAction::Allow, "[::1]:8080").unwrap();
        assert!(r.matches("::1", 8080));
        assert_eq!(r.target(), "[::1]:8080");
    }

    #[test]
    fn opensandbox_policy_maps_onto_rules() {
        let p = NetworkPolicy::from_opensandbox(
            r#"{"defaultAction":"deny","egress":[{"action":"deny","target":"bad.pypi.org"},{"action":"allow","target":"*.pypi.org"},{"action":"allow","target":"example.com"}]}"#,
        )
        .unwrap();
        assert_eq!(p.mode, NetworkMode::Allowlist);
        let d = p.check("bad.pypi.org", 443);
        assert!(!d.allow);
        assert_eq!(d.rule_id, "networkPolicy.egress[0]");
        let d = p.check("files.pypi.org", 443);
        assert!(d.allow);
        assert_eq!(d.rule_id, "networkPolicy.egress[1]");
        assert!(p.check("example.com", 80).allow);
        assert_eq!(p.check("other.com", 80).rule_id, "network.default");

        let p = NetworkPolicy::from_opensandbox(
            r#"{"defaultAction":"allow","egress":[{"action":"deny","target":"*.evil.com"}]}"#,
        )
        .unwrap();
        assert_eq!(p.mode, NetworkMode::All);
        assert!(!p.check("x.evil.com", 443).allow);
        assert!(p.check("good.com", 443).allow);

        // Missing defaultAction: deny; empty object or null: allow all.
        let p = NetworkPolicy::from_opensandbox(r#"{"egress":[]}"#).unwrap();
        assert!(!p.check("a.com", 1).allow);
        assert!(
            NetworkPolicy::from_opensandbox("{}")
                .unwrap()
                .check("a.com", 1)
                .allow
        );
        assert!(
            NetworkPolicy::from_opensandbox("null")
                .unwrap()
                .check("a.com", 1)
                .allow
        );
    }

    #[test]
    fn opensandbox_policy_errors() {
        for bad in [
            r#"{"defaultAction":"maybe"}"#,
            r#"{"egress":[{"action":"allow"}]}"#,
            r#"{"egress":[{"action":"allow","target":"10.0.0.0/8"}]}"#,
            r#"{"egress":[{"action":"allow","target":"a.com","port":1}]}"#,
            "[",
        ] {
            assert!(NetworkPolicy::from_opensandbox(bad).is_err(), "{bad}");
        }
    }

    fn rule(action: RuleAction, target: &str) -> OpenSandboxRule {
        OpenSandboxRule {
            action,
            target: target.into(),
        }
    }

    /// `(action, target)` rules of a table.
    type Rules<'a> = &'a [(RuleAction, &'a str)];

    /// A policy of `(action, target)` rules, deny by default.
    fn os_policy(rules: &[(RuleAction, &str)]) -> OpenSandboxPolicy {
        OpenSandboxPolicy {
            default_action: RuleAction::Deny,
            egress: rules.iter().map(|(a, t)| rule(*a, t)).collect(),
        }
    }

    fn pairs(p: &OpenSandboxPolicy) -> Vec<(RuleAction, &str)> {
        p.egress
            .iter()
            .map(|r| (r.action, r.target.as_str()))
            .collect()
    }

    /// `PATCH /policy`, as upstream's sidecar merges (components/egress/policy_utils.go
    /// `mergeEgressRules`): incoming first, first per target wins, targets compared
    /// case-insensitively, wildcards as plain targets, `defaultAction` untouched.
    #[test]
    fn opensandbox_patch_table() {
        use RuleAction::{Allow, Deny};
        let cases: &[(&str, Rules, Rules, Rules)] = &[
            (
                "incoming rules go first",
                &[(Allow, "a.com")],
                &[(Allow, "b.com")],
                &[(Allow, "b.com"), (Allow, "a.com")],
            ),
            (
                "an incoming rule replaces the existing one for its target",
                &[(Allow, "a.com"), (Allow, "b.com")],
                &[(Deny, "b.com")],
                &[(Deny, "b.com"), (Allow, "a.com")],
            ),
            (
                "targets are compared case-insensitively, kept as written",
                &[(Allow, "PyPI.org")],
                &[(Deny, "pypi.ORG"), (Allow, " c.com ")],
                &[(Deny, "pypi.ORG"), (Allow, "c.com")],
            ),
            (
                "within a patch the first rule for a target wins",
                &[],
                &[(Allow, "x.com"), (Deny, "X.com"), (Deny, "y.com")],
                &[(Allow, "x.com"), (Deny, "y.com")],
            ),
            (
                "a wildcard is its own target, not its domain's",
                &[(Allow, "*.a.com"), (Allow, "a.com")],
                &[(Deny, "b.a.com"), (Deny, "*.a.com")],
                &[(Deny, "b.a.com"), (Deny, "*.a.com"), (Allow, "a.com")],
            ),
            (
                "a trailing dot names the same target",
                &[(Allow, "a.com.")],
                &[(Deny, "a.com")],
                &[(Deny, "a.com")],
            ),
        ];
        for (name, before, incoming, after) in cases {
            let mut p = os_policy(before);
            let incoming: Vec<_> = incoming.iter().map(|(a, t)| rule(*a, t)).collect();
            p.patch(&incoming).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(pairs(&p), *after, "{name}");
            assert_eq!(p.default_action, RuleAction::Deny, "{name}");
        }

        // Refused, and nothing changes: no rules, an invalid rule anywhere in the patch,
        // too many rules in the result.
        let mut p = os_policy(&[(Allow, "a.com")]);
        let before = p.clone();
        assert!(matches!(p.patch(&[]), Err(NetworkPolicyError::Invalid(_))));
        for bad in ["10.0.0.0/8", "1.2.3.4:80", "", "a..com", "-a.com"] {
            assert!(
                p.patch(&[rule(Allow, "d.com"), rule(Allow, bad)]).is_err(),
                "{bad:?}"
            );
        }
        let many: Vec<_> = (0..MAX_OPENSANDBOX_RULES)
            .map(|i| rule(Allow, &format!("h{i}.com")))
            .collect();
        assert_eq!(
            p.patch(&many),
            Err(NetworkPolicyError::TooManyRules(MAX_OPENSANDBOX_RULES + 1))
        );
        assert_eq!(p, before);
        // Exactly the limit is fine (the existing a.com is one of them).
        p.patch(&many[1..]).unwrap();
        assert_eq!(p.egress.len(), MAX_OPENSANDBOX_RULES);
    }

    /// `DELETE /policy`, as upstream's `removeRulesByTarget`: by target, case-insensitively,
    /// blank and unknown targets ignored, `defaultAction` kept.
    #[test]
    fn opensandbox_remove_table() {
        use RuleAction::{Allow, Deny};
        let start = [(Deny, "b.com"), (Allow, "*.a.com"), (Allow, "A.com")];
        let cases: &[(&str, &[&str], usize, Rules)] = &[
            (
                "by target, case-insensitively",
                &["B.COM"],
                1,
                &[(Allow, "*.a.com"), (Allow, "A.com")],
            ),
            ("unknown targets are ignored", &["nope.com"], 0, &start),
            ("blank targets are ignored", &["", "  "], 0, &start),
            (
                "a wildcard removes only its own rule",
                &["*.a.com"],
                1,
                &[(Deny, "b.com"), (Allow, "A.com")],
            ),
            (
                "a domain does not remove its wildcard",
                &["a.com", "x.a.com"],
                1,
                &[(Deny, "b.com"), (Allow, "*.a.com")],
            ),
            ("all of them", &["a.com", "*.A.com", "b.com."], 3, &[]),
        ];
        for (name, targets, removed, after) in cases {
            let mut p = os_policy(&start);
            p.default_action = Allow;
            let targets: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
            assert_eq!(p.remove(&targets).unwrap(), *removed, "{name}");
            assert_eq!(pairs(&p), *after, "{name}");
            assert_eq!(p.default_action, Allow, "{name}");
        }
        assert!(os_policy(&start).remove(&[]).is_err());
    }

    /// The sidecar's `mode`, as upstream's `modeFromPolicy`.
    #[test]
    fn opensandbox_mode() {
        let mut p = os_policy(&[]);
        assert_eq!(p.mode(), "deny_all");
        p.default_action = RuleAction::Allow;
        assert_eq!(p.mode(), "allow_all");
        p.egress.push(rule(RuleAction::Deny, "a.com"));
        assert_eq!(p.mode(), "enforcing");
        p.default_action = RuleAction::Deny;
        assert_eq!(p.mode(), "enforcing");
    }

    /// What is decided follows the merged order and the targets' keys.
    #[test]
    fn opensandbox_patched_policy_decides_in_order() {
        let mut p = OpenSandboxPolicy::from_value(serde_json::json!({
            "egress": [{"action": "allow", "target": "a.com"}, {"action": "allow", "target": "B.com"}]
        }))
        .unwrap();
        assert_eq!(p.default_action, RuleAction::Deny);
        p.patch(&[
            rule(RuleAction::Deny, "b.COM."),
            rule(RuleAction::Allow, "*.c.com"),
        ])
        .unwrap();
        let n = p.to_network_policy();
        assert_eq!(n.check("b.com", 443).rule_id, "networkPolicy.egress[0]");
        assert!(!n.check("b.com", 443).allow);
        assert!(n.check("x.c.com", 80).allow);
        assert_eq!(n.check("a.com", 80).rule_id, "networkPolicy.egress[2]");
        assert_eq!(p.remove(&["b.com".into()]).unwrap(), 1);
        let n = p.to_network_policy();
        assert_eq!(n.check("b.com", 443).rule_id, "network.default");
        assert_eq!(
            p.to_value(),
            serde_json::json!({"defaultAction": "deny", "egress": [
                {"action": "allow", "target": "*.c.com"}, {"action": "allow", "target": "a.com"}]})
        );
    }
}
