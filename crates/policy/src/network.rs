//! The network part of a profile: `none`, an ordered list of host rules, or `all`.
//!
//! A sandbox always has its own network namespace with only loopback. With `allowlist` or
//! `all`, its HTTP(S) traffic leaves through agentrun's egress proxy, which asks
//! [`NetworkPolicy::check`] about every `host:port` before it resolves or connects anything.
//! Rules are evaluated in order; the first match decides; otherwise the default action does.
//! [`NetworkPolicy::from_opensandbox`] maps an OpenSandbox `networkPolicy` onto this model.

use serde::{Deserialize, Serialize};

use crate::decision::Decision;

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

/// Allow or deny.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleAction {
    Allow,
    Deny,
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
    pub fn parse(id: impl Into<String>, action: RuleAction, spec: &str) -> Result<Self, String> {
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
        match self.host.strip_prefix("*.") {
            _ if self.host == "*" => true,
            // `*.example.com` covers sub.example.com and a.b.example.com, not example.com.
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
            None => self.host == host,
        }
    }

    /// `host[:port]` as written in a profile.
    pub fn target(&self) -> String {
        match self.port {
            Some(p) if self.host.contains(':') => format!("[{}]:{p}", self.host),
            Some(p) => format!("{}:{p}", self.host),
            None => self.host.clone(),
        }
    }
}

/// Splits `HOST[:PORT]`; the host is lower-cased.
fn split_host_port(spec: &str) -> Result<(String, Option<u16>), String> {
    if spec.is_empty() {
        return Err("empty host".into());
    }
    let (host, port) = if let Some(rest) = spec.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{spec:?}: missing ']'"))?;
        match after {
            "" => (h, None),
            p => (
                h,
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| format!("{spec:?}: expected ':PORT' after ']'"))?,
                ),
            ),
        }
    } else {
        match spec.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return Err(format!("{spec:?}: write IPv6 addresses as [ADDR]:PORT")),
            None => (spec, None),
        }
    };
    let port = port
        .map(|p| match p.parse::<u16>() {
            Ok(0) | Err(_) => Err(format!("{spec:?}: invalid port {p:?} (1-65535)")),
            Ok(n) => Ok(n),
        })
        .transpose()?;
    Ok((host.to_ascii_lowercase(), port))
}

fn validate_host_pattern(host: &str) -> Result<(), String> {
    if host == "*" || host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
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
        return Err(format!(
            "{host:?} is not a host name, '*.domain' wildcard or IP address"
        ));
    }
    Ok(())
}

/// The network policy of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NetworkPolicy {
    pub mode: NetworkMode,
    /// Evaluated in order, first match wins.
    pub rules: Vec<HostRule>,
}

/// Errors mapping an OpenSandbox `networkPolicy`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NetworkPolicyError {
    #[error("networkPolicy: {0}")]
    Invalid(String),
}

/// An OpenSandbox `networkPolicy` (`{"defaultAction", "egress": [{"action", "target"}]}`),
/// normalised: `defaultAction` is always present (a missing one means deny; a `null` or `{}`
/// policy means allow-all), targets are trimmed and lower-cased and checked. This is the form
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
    /// The rule with its target normalised, or why it is not valid (`what` names it).
    fn checked(&self, what: &str) -> Result<Self, NetworkPolicyError> {
        let target = self
            .target
            .trim()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if target.contains(':') || target.contains('/') {
            return Err(NetworkPolicyError::Invalid(format!(
                "{what}.target {target:?}: only FQDNs and '*.domain' wildcards are supported"
            )));
        }
        HostRule::parse("", self.action, &target)
            .map_err(|e| NetworkPolicyError::Invalid(format!("{what}.target: {e}")))?;
        Ok(OpenSandboxRule {
            action: self.action,
            target,
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

    /// `PATCH /policy`: merges `rules` in. Incoming rules come first (they win over existing
    /// ones), an existing rule for a target named in `rules` is replaced, and within `rules`
    /// the first rule for a target wins. Nothing changes when a rule is invalid.
    pub fn patch(&mut self, rules: &[OpenSandboxRule]) -> Result<(), NetworkPolicyError> {
        if rules.is_empty() {
            return Err(NetworkPolicyError::Invalid(
                "at least one rule is required".into(),
            ));
        }
        let mut merged: Vec<OpenSandboxRule> = Vec::with_capacity(rules.len() + self.egress.len());
        for (i, r) in rules.iter().enumerate() {
            let r = r.checked(&format!("rules[{i}]"))?;
            if !merged.iter().any(|m| m.target == r.target) {
                merged.push(r);
            }
        }
        let kept: Vec<OpenSandboxRule> = self
            .egress
            .iter()
            .filter(|e| !merged.iter().any(|m| m.target == e.target))
            .cloned()
            .collect();
        merged.extend(kept);
        self.egress = merged;
        Ok(())
    }

    /// `DELETE /policy`: removes the rules for `targets`; unknown targets are ignored.
    /// Returns how many rules were removed.
    pub fn remove(&mut self, targets: &[String]) -> Result<usize, NetworkPolicyError> {
        if targets.is_empty() {
            return Err(NetworkPolicyError::Invalid(
                "at least one target is required".into(),
            ));
        }
        let targets: Vec<String> = targets
            .iter()
            .map(|t| t.trim().trim_end_matches('.').to_ascii_lowercase())
            .collect();
        let before = self.egress.len();
        self.egress.retain(|r| !targets.contains(&r.target));
        Ok(before - self.egress.len())
    }

    /// The rules agentrun decides with: `networkPolicy.egress[i]` in order, then the
    /// default (`allow`: mode `all`, still through the proxy; `deny`: `allowlist`).
    pub fn to_network_policy(&self) -> NetworkPolicy {
        let rules = self
            .egress
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                HostRule::parse(format!("networkPolicy.egress[{i}]"), r.action, &r.target).ok()
            })
            .collect();
        let mode = match self.default_action {
            RuleAction::Allow => NetworkMode::All,
            RuleAction::Deny => NetworkMode::Allowlist,
        };
        NetworkPolicy { mode, rules }
    }

    /// The JSON form (`{"defaultAction", "egress"}`).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

impl NetworkPolicy {
    /// Whether traffic leaves through the egress proxy at all.
    pub fn needs_proxy(&self) -> bool {
        self.mode != NetworkMode::None
    }

    /// Adds `HOST[:PORT]` allow rules (e.g. `--allow-host`), ids `<id_prefix>[i]`. Turns
    /// `none` into `allowlist`; `all` stays `all`.
    pub fn allow_hosts(&mut self, id_prefix: &str, hosts: &[String]) -> Result<(), String> {
        for (i, h) in hosts.iter().enumerate() {
            self.rules.push(HostRule::parse(
                format!("{id_prefix}[{i}]"),
                RuleAction::Allow,
                h,
            )?);
        }
        if !hosts.is_empty() && self.mode == NetworkMode::None {
            self.mode = NetworkMode::Allowlist;
        }
        Ok(())
    }

    /// Decides a connection to `host:port`. The host is compared case-insensitively and
    /// literally: names are never resolved here (an allowed name does not allow its address).
    pub fn check(&self, host: &str, port: u16) -> Decision {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if self.mode == NetworkMode::None {
            return Decision::deny(
                "network.mode",
                "the profile has no network (mode = \"none\")",
            );
        }
        if let Some(rule) = self.rules.iter().find(|r| r.matches(host, port)) {
            let verb = match rule.action {
                RuleAction::Allow => "allowed",
                RuleAction::Deny => "denied",
            };
            return Decision {
                allow: rule.action == RuleAction::Allow,
                rule_id: rule.id.clone(),
                reason: format!("{host}:{port} {verb} by {}", rule.target()),
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
            assert!(!e.is_empty(), "{bad}");
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

    #[test]
    fn opensandbox_patch_merges_incoming_first() {
        let mut p = OpenSandboxPolicy::from_value(serde_json::json!({
            "egress": [{"action": "allow", "target": "a.com"}, {"action": "allow", "target": "b.com"}]
        }))
        .unwrap();
        assert_eq!(p.default_action, RuleAction::Deny);
        p.patch(&[
            rule(RuleAction::Deny, "B.com."),
            rule(RuleAction::Allow, "c.com"),
            rule(RuleAction::Allow, "b.com"),
        ])
        .unwrap();
        let got: Vec<(RuleAction, &str)> = p
            .egress
            .iter()
            .map(|r| (r.action, r.target.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (RuleAction::Deny, "b.com"),
                (RuleAction::Allow, "c.com"),
                (RuleAction::Allow, "a.com"),
            ]
        );
        let n = p.to_network_policy();
        assert_eq!(n.check("b.com", 443).rule_id, "networkPolicy.egress[0]");
        assert!(!n.check("b.com", 443).allow);
        assert!(n.check("a.com", 80).allow);
        // Invalid rules change nothing.
        let before = p.clone();
        assert!(p
            .patch(&[
                rule(RuleAction::Allow, "d.com"),
                rule(RuleAction::Allow, "10.0.0.0/8")
            ])
            .is_err());
        assert!(p.patch(&[]).is_err());
        assert_eq!(p, before);
        // Delete is by target and idempotent.
        assert_eq!(p.remove(&["B.COM".into(), "nope.com".into()]).unwrap(), 1);
        assert_eq!(p.remove(&["b.com".into()]).unwrap(), 0);
        assert!(p.remove(&[]).is_err());
        assert_eq!(p.egress.len(), 2);
        assert!(!p.to_network_policy().check("b.com", 443).allow);
        assert_eq!(
            p.to_network_policy().check("b.com", 443).rule_id,
            "network.default"
        );
        assert_eq!(
            p.to_value(),
            serde_json::json!({"defaultAction": "deny", "egress": [
                {"action": "allow", "target": "c.com"}, {"action": "allow", "target": "a.com"}]})
        );
    }
}
