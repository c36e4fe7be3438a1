//! The credential vault: secrets the sandbox never holds, added to its requests by the proxy.
//!
//! A vault holds **credentials** (a name and a secret value) and **bindings** (which requests
//! a credential is added to: hosts, ports, methods, path patterns; and how: bearer, basic,
//! API-key header, custom headers, a query parameter, or a placeholder the sandbox sends that
//! the proxy replaces). It owns the OpenSandbox egress sidecar's `/credential-vault` model
//! ([`VaultCreate`], [`VaultMutation`], [`VaultState`]): create, read sanitized, mutate
//! atomically (optionally guarded by `expectedRevision`), delete.
//!
//! A secret lives in a [`Secret`]: zeroized when dropped, printed `[redacted]` by `Debug` and
//! `Display`, never serialized. Nothing this module returns (state, errors) contains a
//! secret value: errors name credentials and bindings only. The proxy asks
//! [`Vault::binds`] whether a tunnel needs interception, and [`Vault::inject`] to add the
//! credential to one request read inside it.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Deserializer, Serialize};
use zeroize::Zeroizing;

use crate::request::OriginHead;

/// A secret value: zeroized on drop; `Debug` and `Display` print `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    pub fn new(value: String) -> Self {
        Secret(Zeroizing::new(value))
    }

    /// The value, for the one place that writes it into an upstream request.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Secret::new(String::deserialize(d)?))
    }
}

/// Why a vault request is refused: the HTTP status the API answers and one line, which
/// never contains a secret value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct VaultError {
    pub status: u16,
    pub message: String,
}

impl VaultError {
    fn bad(m: impl Into<String>) -> Self {
        VaultError {
            status: 400,
            message: m.into(),
        }
    }
    fn conflict(m: impl Into<String>) -> Self {
        VaultError {
            status: 409,
            message: m.into(),
        }
    }
    fn not_found(m: impl Into<String>) -> Self {
        VaultError {
            status: 404,
            message: m.into(),
        }
    }
}

/// A credential as written (`Credential` in the spec).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialSpec {
    pub name: String,
    pub source: SourceSpec,
}

/// Where a credential's value comes from. The API takes `inline` only (spec:
/// `InlineCredentialSource`; `type` may be left out, as the Python SDK allows); the CLI
/// reads `env:VAR` / `file:PATH` on the caller's side and hands the value in inline,
/// recording where it came from as the source type.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    #[serde(rename = "type", default)]
    pub type_: Option<String>,
    pub value: Secret,
}

/// A binding as written (`CredentialBinding` in the spec).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BindingSpec {
    pub name: String,
    #[serde(rename = "match")]
    pub match_: MatchSpec,
    pub auth: AuthSpec,
}

/// Which requests a binding applies to (`CredentialMatch`; the spec's defaults when absent).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MatchSpec {
    #[serde(default = "default_schemes")]
    pub schemes: Vec<String>,
    #[serde(default = "default_ports")]
    pub ports: Vec<u16>,
    pub hosts: Vec<String>,
    #[serde(default = "default_methods")]
    pub methods: Vec<String>,
    #[serde(default = "default_paths")]
    pub paths: Vec<String>,
}

fn default_schemes() -> Vec<String> {
    vec!["https".into()]
}
fn default_ports() -> Vec<u16> {
    vec![443]
}
fn default_methods() -> Vec<String> {
    ["GET", "POST", "PUT", "PATCH", "DELETE"]
        .map(String::from)
        .to_vec()
}
fn default_paths() -> Vec<String> {
    vec!["/*".into()]
}

/// How a credential is added (`CredentialAuth`, plus agentrun's `query` and `placeholder`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, tag = "type", rename_all = "camelCase")]
pub enum AuthSpec {
    /// `Authorization: Bearer <value>`.
    Bearer { credential: String },
    /// `Authorization: Basic <value>` (the value is base64(user:password) already).
    Basic { credential: String },
    /// `<name>: <value>`.
    ApiKey { name: String, credential: String },
    /// Several `<name>: <value>` fields.
    CustomHeaders { headers: Vec<HeaderEntry> },
    /// `?<name>=<value>` added to the query (agentrun).
    Query { name: String, credential: String },
    /// Every occurrence of `placeholder` in header values replaced by the value (agentrun).
    Placeholder {
        placeholder: String,
        credential: String,
    },
}

/// One header of a `customHeaders` binding.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HeaderEntry {
    pub name: String,
    pub credential: String,
}

impl AuthSpec {
    /// The credential names it uses.
    fn credentials(&self) -> Vec<&str> {
        match self {
            AuthSpec::Bearer { credential }
            | AuthSpec::Basic { credential }
            | AuthSpec::ApiKey { credential, .. }
            | AuthSpec::Query { credential, .. }
            | AuthSpec::Placeholder { credential, .. } => vec![credential],
            AuthSpec::CustomHeaders { headers } => {
                headers.iter().map(|h| h.credential.as_str()).collect()
            }
        }
    }

    fn type_name(&self) -> &'static str {
        match self {
            AuthSpec::Bearer { .. } => "bearer",
            AuthSpec::Basic { .. } => "basic",
            AuthSpec::ApiKey { .. } => "apiKey",
            AuthSpec::CustomHeaders { .. } => "customHeaders",
            AuthSpec::Query { .. } => "query",
            AuthSpec::Placeholder { .. } => "placeholder",
        }
    }
}

/// `POST /credential-vault`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VaultCreate {
    pub credentials: Vec<CredentialSpec>,
    pub bindings: Vec<BindingSpec>,
}

/// `PATCH /credential-vault`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VaultMutation {
    pub expected_revision: Option<u64>,
    #[serde(default)]
    pub credentials: MutationSet<CredentialSpec>,
    #[serde(default)]
    pub bindings: MutationSet<BindingSpec>,
}

/// Add, replace and delete (by name) sets of a mutation.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, bound = "T: Deserialize<'de>")]
pub struct MutationSet<T> {
    #[serde(default)]
    pub add: Vec<T>,
    #[serde(default)]
    pub replace: Vec<T>,
    #[serde(default)]
    pub delete: Vec<String>,
}

impl<T> Default for MutationSet<T> {
    fn default() -> Self {
        MutationSet {
            add: Vec::new(),
            replace: Vec::new(),
            delete: Vec::new(),
        }
    }
}

/// A credential's sanitized metadata (`CredentialMetadata`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CredentialMeta {
    pub name: String,
    pub source_type: String,
    pub revision: u64,
}

/// A binding's sanitized metadata (`CredentialBindingMetadata`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BindingMeta {
    pub name: String,
    pub revision: u64,
    #[serde(rename = "match")]
    pub match_: MatchSpec,
    pub auth: AuthMeta,
}

/// `CredentialAuthMetadata`: the auth type, and the header or parameter name.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct AuthMeta {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `CredentialVaultState`: what the API shows. No secret in it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct VaultState {
    pub revision: u64,
    pub credentials: Vec<CredentialMeta>,
    pub bindings: Vec<BindingMeta>,
}

#[derive(Clone)]
struct Credential {
    source_type: String,
    revision: u64,
    value: Secret,
}

#[derive(Clone)]
struct Binding {
    spec: BindingSpec,
    revision: u64,
}

/// One revision of a vault's contents.
#[derive(Clone, Default)]
struct Contents {
    revision: u64,
    credentials: BTreeMap<String, Credential>,
    bindings: Vec<Binding>,
}

/// A sandbox's vault, shared by its API and its proxy. Every change builds the next
/// revision aside and swaps it in whole: a request is injected from one revision.
#[derive(Clone, Default)]
pub struct Vault {
    inner: Arc<RwLock<Option<Arc<Contents>>>>,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Vault([redacted])")
    }
}

/// A header field name: an RFC 9110 token.
fn token_ok(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A value that can go into a header field: visible ASCII and spaces, no CR/LF.
fn value_ok(v: &str) -> bool {
    !v.is_empty()
        && v.bytes()
            .all(|b| b == b' ' || b == b'\t' || (0x21..0x7f).contains(&b))
}

fn validate_host(h: &str) -> Result<String, VaultError> {
    let h = h.trim().to_ascii_lowercase();
    let name = h.strip_prefix("*.").unwrap_or(&h);
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'))
        && !name.starts_with('.')
        && !name.ends_with('.');
    if !ok {
        return Err(VaultError::bad(format!(
            "match host {h:?} is not a host name, *.suffix or an address"
        )));
    }
    Ok(h)
}

impl BindingSpec {
    /// Checks and normalizes a binding (hosts lower-cased, methods upper-cased).
    pub fn validate(mut self) -> Result<Self, VaultError> {
        let n = &self.name;
        if n.is_empty() || n.len() > 128 {
            return Err(VaultError::bad("a binding needs a name of 1 to 128 bytes"));
        }
        let m = &mut self.match_;
        if m.hosts.is_empty() {
            return Err(VaultError::bad(format!(
                "binding {n:?}: match.hosts is empty"
            )));
        }
        m.hosts = m
            .hosts
            .iter()
            .map(|h| validate_host(h))
            .collect::<Result<_, _>>()?;
        for s in &m.schemes {
            if s != "https" && s != "http" {
                return Err(VaultError::bad(format!(
                    "binding {n:?}: scheme {s:?} is not https or http"
                )));
            }
        }
        if m.ports.is_empty() || m.ports.contains(&0) {
            return Err(VaultError::bad(format!(
                "binding {n:?}: match.ports must name ports 1-65535"
            )));
        }
        for meth in &mut m.methods {
            if !token_ok(meth) {
                return Err(VaultError::bad(format!(
                    "binding {n:?}: method {meth:?} is not a token"
                )));
            }
            *meth = meth.to_ascii_uppercase();
        }
        for p in &m.paths {
            if !p.starts_with('/') || p.bytes().any(|b| b <= b' ' || b == 0x7f) {
                return Err(VaultError::bad(format!(
                    "binding {n:?}: path {p:?} must start with / and have no spaces"
                )));
            }
            if p[..p.len().saturating_sub(1)].contains('*') {
                return Err(VaultError::bad(format!(
                    "binding {n:?}: path {p:?}: '*' only at the end"
                )));
            }
        }
        match &self.auth {
            AuthSpec::ApiKey { name, .. } | AuthSpec::Query { name, .. } if !token_ok(name) => {
                return Err(VaultError::bad(format!(
                    "binding {n:?}: {name:?} is not a valid field name"
                )))
            }
            AuthSpec::CustomHeaders { headers } => {
                if headers.is_empty() {
                    return Err(VaultError::bad(format!(
                        "binding {n:?}: customHeaders needs at least one header"
                    )));
                }
                if let Some(h) = headers.iter().find(|h| !token_ok(&h.name)) {
                    return Err(VaultError::bad(format!(
                        "binding {n:?}: {:?} is not a valid header name",
                        h.name
                    )));
                }
            }
            AuthSpec::Placeholder { placeholder, .. }
                if placeholder.len() < 8 || !value_ok(placeholder) =>
            {
                return Err(VaultError::bad(format!(
                    "binding {n:?}: a placeholder needs 8 or more visible characters"
                )))
            }
            _ => {}
        }
        Ok(self)
    }

    /// Whether this binding applies to a request (`scheme` is `https` inside intercepted
    /// TLS, `http` for a forwarded request).
    pub fn matches(&self, scheme: &str, host: &str, port: u16, method: &str, path: &str) -> bool {
        let m = &self.match_;
        self.matches_host(scheme, host, port)
            && m.methods.iter().any(|x| x.eq_ignore_ascii_case(method))
            && m.paths.iter().any(|p| path_matches(p, path))
    }

    fn matches_host(&self, scheme: &str, host: &str, port: u16) -> bool {
        let m = &self.match_;
        m.schemes.iter().any(|s| s == scheme)
            && m.ports.contains(&port)
            && m.hosts.iter().any(|h| host_matches(h, host))
    }
}

/// `*.example.com` matches subdomains (not the apex); anything else matches exactly.
pub fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => host
            .strip_suffix(suffix)
            .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
        None => pattern == host,
    }
}

/// `/v1/*` matches `/v1/` and everything under it; `/*` everything; anything else the path
/// exactly. The query is not part of the path.
pub fn path_matches(pattern: &str, path: &str) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    match pattern.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => path == pattern,
    }
}

impl Contents {
    fn state(&self) -> VaultState {
        VaultState {
            revision: self.revision,
            credentials: self
                .credentials
                .iter()
                .map(|(name, c)| CredentialMeta {
                    name: name.clone(),
                    source_type: c.source_type.clone(),
                    revision: c.revision,
                })
                .collect(),
            bindings: self
                .bindings
                .iter()
                .map(|b| BindingMeta {
                    name: b.spec.name.clone(),
                    revision: b.revision,
                    match_: b.spec.match_.clone(),
                    auth: AuthMeta {
                        type_: b.spec.auth.type_name().into(),
                        name: match &b.spec.auth {
                            AuthSpec::ApiKey { name, .. } | AuthSpec::Query { name, .. } => {
                                Some(name.clone())
                            }
                            _ => None,
                        },
                    },
                })
                .collect(),
        }
    }

    fn put_credential(&mut self, c: CredentialSpec, source_type: &str) -> Result<(), VaultError> {
        if c.name.is_empty() || c.name.len() > 128 {
            return Err(VaultError::bad(
                "a credential needs a name of 1 to 128 bytes",
            ));
        }
        if c.source.type_.as_deref().is_some_and(|t| t != "inline") {
            // The type is not quoted: a client may have put the value there.
            return Err(VaultError::bad(format!(
                "credential {:?}: the source type must be \"inline\"",
                c.name
            )));
        }
        let value = c.source.value;
        if !value_ok(value.expose()) {
            return Err(VaultError::bad(format!(
                "credential {:?}: the value must be non-empty visible ASCII (it goes into a header)",
                c.name
            )));
        }
        self.credentials.insert(
            c.name,
            Credential {
                source_type: source_type.into(),
                revision: self.revision,
                value,
            },
        );
        Ok(())
    }

    /// Every binding names credentials that exist, and binding names are unique.
    fn check(&self) -> Result<(), VaultError> {
        let mut names = std::collections::BTreeSet::new();
        for b in &self.bindings {
            if !names.insert(b.spec.name.as_str()) {
                return Err(VaultError::conflict(format!(
                    "binding {:?} appears twice",
                    b.spec.name
                )));
            }
            for c in b.spec.auth.credentials() {
                if !self.credentials.contains_key(c) {
                    return Err(VaultError::bad(format!(
                        "binding {:?} names credential {c:?}, which the vault does not hold",
                        b.spec.name
                    )));
                }
            }
        }
        Ok(())
    }
}

impl Vault {
    /// A vault that has not been created (the API's `GET` answers 404).
    pub fn new() -> Self {
        Vault::default()
    }

    fn current(&self) -> Option<Arc<Contents>> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `POST /credential-vault`: revision 1. 409 when one exists.
    pub fn create(&self, req: VaultCreate) -> Result<VaultState, VaultError> {
        self.create_with_source(req, "inline")
    }

    /// Like [`Vault::create`], the credentials' source type recorded as `source_type`
    /// (`env`, `file`: the CLI's).
    pub fn create_with_source(
        &self,
        req: VaultCreate,
        source_type: &str,
    ) -> Result<VaultState, VaultError> {
        self.create_approved(req, source_type, |_| Ok(()))
    }

    /// [`Vault::create_with_source`], the new state shown to `approve` first (a check, an
    /// audit record): its error refuses the create. One step under the vault's lock: no
    /// other change comes between the checks, the approval and the swap.
    pub fn create_approved<E: From<VaultError>>(
        &self,
        req: VaultCreate,
        source_type: &str,
        approve: impl FnOnce(&VaultState) -> Result<(), E>,
    ) -> Result<VaultState, E> {
        let mut c = Contents {
            revision: 1,
            ..Contents::default()
        };
        for cred in req.credentials {
            if c.credentials.contains_key(&cred.name) {
                return Err(VaultError::conflict(format!(
                    "credential {:?} appears twice",
                    cred.name
                ))
                .into());
            }
            c.put_credential(cred, source_type)?;
        }
        for b in req.bindings {
            c.bindings.push(Binding {
                spec: b.validate()?,
                revision: 1,
            });
        }
        c.check()?;
        let mut slot = self.inner.write().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return Err(VaultError::conflict(
                "the credential vault exists; PATCH changes it, DELETE removes it",
            )
            .into());
        }
        let state = c.state();
        approve(&state)?;
        *slot = Some(Arc::new(c));
        Ok(state)
    }

    /// `GET /credential-vault`: the sanitized state, 404 before create.
    pub fn state(&self) -> Result<VaultState, VaultError> {
        self.current()
            .map(|c| c.state())
            .ok_or_else(|| VaultError::not_found("no credential vault"))
    }

    /// `PATCH /credential-vault`: deletes, then replaces, then adds, all or nothing; the
    /// next revision. 409 when `expectedRevision` is not the current one or an added name
    /// exists; 404 when a replaced or deleted one does not.
    pub fn mutate(&self, m: VaultMutation) -> Result<VaultState, VaultError> {
        self.mutate_approved(m, |_| Ok(()))
    }

    /// [`Vault::mutate`], the new state shown to `approve` before it is swapped in (a check,
    /// an audit record): its error refuses the change. The revision check, the approval and
    /// the swap are one step under the vault's lock: two concurrent changes expecting the
    /// same revision cannot both be approved (one gets 409 before its approval).
    pub fn mutate_approved<E: From<VaultError>>(
        &self,
        m: VaultMutation,
        approve: impl FnOnce(&VaultState) -> Result<(), E>,
    ) -> Result<VaultState, E> {
        let mut slot = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let cur = slot
            .as_ref()
            .ok_or_else(|| VaultError::not_found("no credential vault"))?;
        let next = Self::next(cur, m)?;
        let state = next.state();
        approve(&state)?;
        *slot = Some(Arc::new(next));
        Ok(state)
    }

    /// What `m` makes of `cur` (deletes, then replaces, then adds), or why not.
    fn next(cur: &Contents, m: VaultMutation) -> Result<Contents, VaultError> {
        if let Some(want) = m.expected_revision {
            if want != cur.revision {
                return Err(VaultError::conflict(format!(
                    "expectedRevision {want} is not the current revision {}",
                    cur.revision
                )));
            }
        }
        let mut next = Contents::clone(cur);
        next.revision += 1;
        for name in &m.bindings.delete {
            let before = next.bindings.len();
            next.bindings.retain(|b| &b.spec.name != name);
            if next.bindings.len() == before {
                return Err(VaultError::not_found(format!("no binding {name:?}")));
            }
        }
        for name in &m.credentials.delete {
            if next.credentials.remove(name).is_none() {
                return Err(VaultError::not_found(format!("no credential {name:?}")));
            }
        }
        for c in m.credentials.replace {
            if !next.credentials.contains_key(&c.name) {
                return Err(VaultError::not_found(format!("no credential {:?}", c.name)));
            }
            next.put_credential(c, "inline")?;
        }
        for c in m.credentials.add {
            if next.credentials.contains_key(&c.name) {
                return Err(VaultError::conflict(format!(
                    "credential {:?} exists (replace it instead)",
                    c.name
                )));
            }
            next.put_credential(c, "inline")?;
        }
        for b in m.bindings.replace {
            let b = b.validate()?;
            let revision = next.revision;
            let slot_b = next
                .bindings
                .iter_mut()
                .find(|x| x.spec.name == b.name)
                .ok_or_else(|| VaultError::not_found(format!("no binding {:?}", b.name)))?;
            *slot_b = Binding { spec: b, revision };
        }
        for b in m.bindings.add {
            let b = b.validate()?;
            if next.bindings.iter().any(|x| x.spec.name == b.name) {
                return Err(VaultError::conflict(format!(
                    "binding {:?} exists (replace it instead)",
                    b.name
                )));
            }
            next.bindings.push(Binding {
                spec: b,
                revision: next.revision,
            });
        }
        next.check()?;
        Ok(next)
    }

    /// `DELETE /credential-vault`: 404 when there is none.
    pub fn delete(&self) -> Result<(), VaultError> {
        self.delete_approved(|| Ok(()))
    }

    /// [`Vault::delete`], `approve` asked first under the vault's lock (its error refuses).
    pub fn delete_approved<E: From<VaultError>>(
        &self,
        approve: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        let mut slot = self.inner.write().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            return Err(VaultError::not_found("no credential vault").into());
        }
        approve()?;
        *slot = None;
        Ok(())
    }

    /// Whether some binding applies to `scheme://host:port` (then the proxy intercepts the
    /// tunnel to it).
    pub fn binds(&self, scheme: &str, host: &str, port: u16) -> bool {
        self.current().is_some_and(|c| {
            c.bindings
                .iter()
                .any(|b| b.spec.matches_host(scheme, host, port))
        })
    }

    /// Adds the credential of the first binding that applies to `head` (sent to
    /// `scheme://host:port`), replacing any field of the same name the sandbox sent. Returns
    /// the binding's name, or `None` when none applies (the request goes on unchanged).
    pub fn inject(
        &self,
        scheme: &str,
        host: &str,
        port: u16,
        head: &mut OriginHead,
    ) -> Option<String> {
        let c = self.current()?;
        let b = c
            .bindings
            .iter()
            .find(|b| b.spec.matches(scheme, host, port, &head.method, &head.path))?;
        let value = |name: &str| c.credentials.get(name).map(|c| c.value.expose());
        match &b.spec.auth {
            AuthSpec::Bearer { credential } => {
                let v = Zeroizing::new(format!("Bearer {}", value(credential)?));
                head.set_field("Authorization", v.as_bytes().to_vec());
            }
            AuthSpec::Basic { credential } => {
                let v = Zeroizing::new(format!("Basic {}", value(credential)?));
                head.set_field("Authorization", v.as_bytes().to_vec());
            }
            AuthSpec::ApiKey { name, credential } => {
                head.set_field(name, value(credential)?.as_bytes().to_vec());
            }
            AuthSpec::CustomHeaders { headers } => {
                for h in headers {
                    head.set_field(&h.name, value(&h.credential)?.as_bytes().to_vec());
                }
            }
            AuthSpec::Query { name, credential } => {
                let v = value(credential)?;
                let enc: String = v
                    .bytes()
                    .map(|b| {
                        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                            (b as char).to_string()
                        } else {
                            format!("%{b:02X}")
                        }
                    })
                    .collect();
                let sep = if head.path.contains('?') { '&' } else { '?' };
                head.path = format!("{}{sep}{name}={enc}", head.path);
            }
            AuthSpec::Placeholder {
                placeholder,
                credential,
            } => {
                let v = value(credential)?;
                let ph = placeholder.as_bytes();
                for (_, field) in &mut head.fields {
                    if field.windows(ph.len()).any(|w| w == ph) {
                        let s = String::from_utf8_lossy(field).replace(placeholder, v);
                        *field = s.into_bytes();
                    }
                }
            }
        }
        Some(b.spec.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::parse_origin_head;

    const SECRET: &str = "sk-test-4f9a1c77e2";

    fn create_body() -> VaultCreate {
        serde_json::from_value(serde_json::json!({
            "credentials": [{"name": "openai", "source": {"type": "inline", "value": SECRET}}],
            "bindings": [{"name": "openai-api", "match": {"hosts": ["api.example.com"], "paths": ["/v1/*"]},
                          "auth": {"type": "bearer", "credential": "openai"}}]
        }))
        .unwrap()
    }

    fn head(req: &str) -> OriginHead {
        head_for("api.example.com", req)
    }

    /// `req` parsed as a request to `host` on port 443.
    fn head_for(host: &str, req: &str) -> OriginHead {
        parse_origin_head(req.as_bytes(), host, 443, 443)
            .unwrap()
            .unwrap()
            .0
    }

    #[test]
    fn secrets_never_show_in_debug_state_or_errors() {
        let body = create_body();
        assert!(!format!("{body:?}").contains(SECRET));
        let v = Vault::new();
        let state = v.create(body).unwrap();
        let json = serde_json::to_string(&state).unwrap();
        assert!(!json.contains(SECRET), "{json}");
        assert!(json.contains(r#""sourceType":"inline""#), "{json}");
        assert!(!format!("{v:?}").contains(SECRET));
        // An error about a bad value names the credential only.
        let bad: VaultMutation = serde_json::from_value(serde_json::json!({
            "credentials": {"replace": [{"name": "openai", "source": {"type": "inline", "value": "x\ny-sk-secret"}}]}
        }))
        .unwrap();
        let e = v.mutate(bad).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(!e.message.contains("sk-secret"), "{e}");
        // Nor one about a value put where the type goes.
        let bad: VaultMutation = serde_json::from_value(serde_json::json!({
            "credentials": {"add": [{"name": "n", "source": {"type": "sk-secret-in-type", "value": "v"}}]}
        }))
        .unwrap();
        let e = v.mutate(bad).unwrap_err();
        assert!(!e.message.contains("sk-secret-in-type"), "{e}");
    }

    #[test]
    fn injects_for_bound_requests_only() {
        let v = Vault::new();
        v.create(create_body()).unwrap();
        let mut h = head("GET /v1/models HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer fake\r\n\r\n");
        assert_eq!(
            v.inject("https", "api.example.com", 443, &mut h).as_deref(),
            Some("openai-api")
        );
        assert_eq!(
            h.field("authorization"),
            Some(format!("Bearer {SECRET}").as_bytes())
        );
        assert_eq!(
            h.fields
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case("authorization"))
                .count(),
            1
        );
        let mut h = head("GET /v2/models HTTP/1.1\r\nHost: api.example.com\r\n\r\n");
        assert_eq!(v.inject("https", "api.example.com", 443, &mut h), None);
        assert_eq!(h.field("authorization"), None);
        assert!(!v.binds("https", "other.example.com", 443));
        assert!(!v.binds("https", "api.example.com", 8443));
        assert!(v.binds("https", "api.example.com", 443));
    }

    #[test]
    fn mutations_are_atomic_and_revisioned() {
        let v = Vault::new();
        v.create(create_body()).unwrap();
        assert_eq!(v.create(create_body()).unwrap_err().status, 409);
        // Fails half-way (binding to a missing credential): nothing changes.
        let m: VaultMutation = serde_json::from_value(serde_json::json!({
            "credentials": {"replace": [{"name": "openai", "source": {"type": "inline", "value": "rotated-1"}}]},
            "bindings": {"add": [{"name": "b2", "match": {"hosts": ["x.example.com"]}, "auth": {"type": "apiKey", "name": "X-Key", "credential": "missing"}}]}
        }))
        .unwrap();
        assert_eq!(v.mutate(m).unwrap_err().status, 400);
        assert_eq!(v.state().unwrap().revision, 1);
        let m: VaultMutation = serde_json::from_value(serde_json::json!({
            "expectedRevision": 1,
            "credentials": {"replace": [{"name": "openai", "source": {"type": "inline", "value": "rotated-1"}}]}
        }))
        .unwrap();
        assert_eq!(v.mutate(m.clone()).unwrap().revision, 2);
        assert_eq!(v.mutate(m).unwrap_err().status, 409);
        let mut h =
            head("POST /v1/chat HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 0\r\n\r\n");
        v.inject("https", "api.example.com", 443, &mut h).unwrap();
        assert_eq!(h.field("Authorization"), Some(&b"Bearer rotated-1"[..]));
        v.delete().unwrap();
        assert_eq!(v.state().unwrap_err().status, 404);
        assert_eq!(v.delete().unwrap_err().status, 404);
    }

    #[test]
    fn query_placeholder_and_custom_headers() {
        let v = Vault::new();
        v.create(
            serde_json::from_value(serde_json::json!({
                "credentials": [{"name": "k", "source": {"type": "inline", "value": "a b&c"}},
                                {"name": "t", "source": {"type": "inline", "value": "tok"}}],
                "bindings": [
                    {"name": "q", "match": {"hosts": ["*.q.example"]}, "auth": {"type": "query", "name": "key", "credential": "k"}},
                    {"name": "p", "match": {"hosts": ["p.example"]}, "auth": {"type": "placeholder", "placeholder": "AGENTRUN_PLACEHOLDER", "credential": "t"}},
                    {"name": "c", "match": {"hosts": ["c.example"], "methods": ["get"]}, "auth": {"type": "customHeaders", "headers": [{"name": "X-A", "credential": "k"}, {"name": "X-B", "credential": "t"}]}}
                ]
            }))
            .unwrap(),
        )
        .unwrap();
        let mut h = head_for(
            "a.q.example",
            "GET /x?y=1 HTTP/1.1\r\nHost: a.q.example\r\n\r\n",
        );
        v.inject("https", "a.q.example", 443, &mut h).unwrap();
        assert_eq!(h.path, "/x?y=1&key=a%20b%26c");
        assert!(!v.binds("https", "q.example", 443));
        let mut h = head_for(
            "p.example",
            "GET / HTTP/1.1\r\nHost: p.example\r\nX-Token: t=AGENTRUN_PLACEHOLDER;\r\n\r\n",
        );
        v.inject("https", "p.example", 443, &mut h).unwrap();
        assert_eq!(h.field("x-token"), Some(&b"t=tok;"[..]));
        let mut h = head_for("c.example", "GET / HTTP/1.1\r\nHost: c.example\r\n\r\n");
        v.inject("https", "c.example", 443, &mut h).unwrap();
        assert_eq!(h.field("X-B"), Some(&b"tok"[..]));
        let mut h = head_for("c.example", "DELETE / HTTP/1.1\r\nHost: c.example\r\n\r\n");
        assert_eq!(v.inject("https", "c.example", 443, &mut h), None);
    }
}
