//! The lifecycle API's request bodies, parsed and checked without a sandbox (the handlers'
//! first step; the `opensandbox_api` fuzz target drives them): a create request (image,
//! entrypoint, env, metadata, timeout, resource limits, `networkPolicy`, `volumes`, and the fields
//! agentrun refuses), a renew, a metadata patch; the one field of a fork's or a snapshot's
//! ([`only_field`]).

use std::collections::BTreeMap;

use agentrun_pool::live::LiveSpec;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};

/// Longest `timeout` accepted (seconds).
const MAX_TIMEOUT_S: i64 = 86_400;

fn parse_json<T: for<'de> Deserialize<'de>>(body: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageSpec {
    uri: String,
    auth: Option<Value>,
}

/// A `POST /v1/sandboxes` body as sent.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateRequest {
    image: Option<ImageSpec>,
    snapshot_id: Option<String>,
    template_id: Option<String>,
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) metadata: BTreeMap<String, String>,
    #[serde(default)]
    timeout: Option<i64>,
    #[serde(default)]
    resource_limits: BTreeMap<String, String>,
    /// Scheduling hints (Kubernetes requests): accepted, the limits are what is enforced.
    #[serde(default)]
    #[allow(dead_code)]
    resource_requests: Option<BTreeMap<String, String>>,
    pub(super) network_policy: Option<Value>,
    credential_proxy: Option<Value>,
    #[serde(default)]
    secure_access: bool,
    #[serde(default)]
    volumes: Vec<Value>,
    platform: Option<Value>,
    lifecycle: Option<Value>,
    pub(super) extensions: Option<Value>,
}

/// `"500m"`, `"2"`, `"0.5"` -> cores.
pub fn parse_cpu(s: &str) -> Option<f64> {
    let s = s.trim();
    let v = match s.strip_suffix('m') {
        Some(m) => m.parse::<f64>().ok()? / 1000.0,
        None => s.parse::<f64>().ok()?,
    };
    (v > 0.0 && v <= 1024.0 && v.is_finite()).then_some(v)
}

/// `"512Mi"`, `"2Gi"`, `"1G"`, `"512M"`, `"1048576"` -> bytes.
pub fn parse_memory(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: u64 = n.parse().ok()?;
    let unit = unit.trim_end_matches('b');
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1000,
        "m" => 1000u64.pow(2),
        "g" => 1000u64.pow(3),
        "t" => 1000u64.pow(4),
        "ki" => 1 << 10,
        "mi" => 1 << 20,
        "gi" => 1 << 30,
        "ti" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult).filter(|v| *v > 0)
}

fn label_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn check_metadata(m: &BTreeMap<String, String>) -> ApiResult<()> {
    for (k, v) in m {
        let name = k.rsplit('/').next().unwrap_or(k);
        if k.starts_with("opensandbox.io/") {
            return Err(ApiError::bad_request(format!(
                "metadata key {k:?}: the opensandbox.io/ prefix is reserved"
            )));
        }
        if !label_ok(name) || k.len() > 253 {
            return Err(ApiError::bad_request(format!(
                "metadata key {k:?} is not a valid label key"
            )));
        }
        if !v.is_empty() && !label_ok(v) {
            return Err(ApiError::bad_request(format!(
                "metadata value {v:?} (key {k:?}) is not a valid label value"
            )));
        }
    }
    Ok(())
}

pub(super) fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// What the create request asks for, validated.
pub struct Validated {
    pub(super) spec: LiveSpec,
    /// `snapshotId`: the sandbox is made from this snapshot (`spec.image` is filled in once
    /// it is found).
    pub(super) snapshot_id: Option<String>,
    pub(super) entrypoint: Vec<String>,
    pub(super) timeout: Option<i64>,
    /// `networkPolicy` (`None`: absent or null, no network at all).
    pub(super) network: Option<agentrun_policy::OpenSandboxPolicy>,
    /// `credentialProxy.enabled`: the egress proxy intercepts TLS to the hosts the
    /// credential vault binds (its CA trusted in the sandbox).
    pub(super) credential_proxy: bool,
    /// `volumes`, checked (opened on the host when the sandbox is made).
    pub(super) volumes: Vec<super::volumes::VolumeSpec>,
    /// `extensions["access.renew.extend.seconds"]`: traffic through the server proxy moves
    /// the expiry to at least now + this ([`crate::Record::renew_on_access`]).
    pub(super) access_renew_s: Option<i64>,
}

/// The extension key upstream renews a sandbox on access by.
pub const ACCESS_RENEW_KEY: &str = "access.renew.extend.seconds";
/// Its bounds (upstream's: 5 minutes to 24 hours).
const ACCESS_RENEW_RANGE: std::ops::RangeInclusive<i64> = 300..=86_400;

/// `extensions["access.renew.extend.seconds"]`, checked as upstream checks it (a base-10
/// integer, as a string or a number, in [`ACCESS_RENEW_RANGE`]).
fn access_renew(extensions: Option<&Value>) -> ApiResult<Option<i64>> {
    let Some(raw) = extensions.and_then(|x| x.get(ACCESS_RENEW_KEY)) else {
        return Ok(None);
    };
    let n = match raw {
        Value::String(s) => s.trim().parse::<i64>().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    };
    match n {
        Some(n) if ACCESS_RENEW_RANGE.contains(&n) => Ok(Some(n)),
        _ => Err(ApiError::bad_request(format!(
            "extensions[{ACCESS_RENEW_KEY:?}] must be an integer number of seconds between {} and {}, got {raw}",
            ACCESS_RENEW_RANGE.start(),
            ACCESS_RENEW_RANGE.end()
        ))),
    }
}

/// A `POST /v1/sandboxes` body parsed and checked: everything about a create request that
/// needs no sandbox (the handler's first step; the `opensandbox_api` fuzz target drives it).
pub fn parse_create(body: &[u8]) -> ApiResult<(CreateRequest, Validated)> {
    let req = parse_json(body)?;
    let v = validate(&req)?;
    Ok((req, v))
}

fn validate(req: &CreateRequest) -> ApiResult<Validated> {
    let bad = |m: &str| Err(ApiError::bad_request(m.to_string()));
    if req.template_id.is_some() {
        return bad("templateId: templates are not supported by agentrun");
    }
    let snapshot_id = req.snapshot_id.as_deref().map(str::trim).map(str::to_owned);
    let uri = match (&req.image, &snapshot_id) {
        (Some(_), Some(_)) => return bad("give either image or snapshotId, not both"),
        (None, None) => return bad("image (or snapshotId) is required"),
        (None, Some(id)) if id.is_empty() => return bad("snapshotId must not be empty"),
        // Resolved to the snapshot's image by the handler.
        (None, Some(_)) => String::new(),
        (Some(image), None) => {
            if image.uri.trim().is_empty() {
                return bad("image.uri is required");
            }
            if image.auth.as_ref().is_some_and(|a| !a.is_null()) {
                return bad("image.auth: registry credentials are not supported here; pull the image into agentrun's store first (agentrun image pull)");
            }
            image.uri.trim().to_owned()
        }
    };
    // From a snapshot, the entrypoint may be left out: the snapshot's (else `tail -f
    // /dev/null`) is filled in by the handler.
    let entrypoint = req.entrypoint.clone().unwrap_or_default();
    if (snapshot_id.is_none() || req.entrypoint.is_some())
        && (entrypoint.is_empty() || entrypoint[0].is_empty())
    {
        return bad("entrypoint must have at least one element");
    }
    if req.secure_access {
        return bad("secureAccess=true is not supported: execd access is always guarded by a per-sandbox token");
    }
    let volumes = super::volumes::parse(&req.volumes)?;
    if req.lifecycle.as_ref().is_some_and(|v| !v.is_null()) {
        return bad("lifecycle hooks are not supported");
    }
    let credential_proxy = match req.credential_proxy.as_ref().filter(|c| !c.is_null()) {
        None => false,
        Some(c) => {
            let obj = c.as_object().ok_or_else(|| {
                ApiError::bad_request("credentialProxy must be an object {\"enabled\": bool}")
            })?;
            if let Some(k) = obj.keys().find(|k| *k != "enabled") {
                return bad(&format!("credentialProxy: unknown field {k:?}"));
            }
            match obj.get("enabled") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return bad("credentialProxy.enabled must be a boolean"),
            }
        }
    };
    if credential_proxy && req.network_policy.as_ref().is_none_or(Value::is_null) {
        return bad("credentialProxy.enabled requires a networkPolicy");
    }
    if let Some(p) = req.platform.as_ref().filter(|p| !p.is_null()) {
        let os = p.get("os").and_then(Value::as_str).unwrap_or("linux");
        let arch = p.get("arch").and_then(Value::as_str).unwrap_or(host_arch());
        if os != "linux" || arch != host_arch() {
            return Err(ApiError::bad_request(format!(
                "platform {os}/{arch} is not available: this host runs linux/{}",
                host_arch()
            )));
        }
    }
    if let Some(t) = req.timeout {
        if !(1..=MAX_TIMEOUT_S).contains(&t) {
            return Err(ApiError::bad_request(format!(
                "timeout must be between 1 and {MAX_TIMEOUT_S} seconds (or null for no expiry)"
            )));
        }
    }
    check_metadata(&req.metadata)?;
    let mut cpus = None;
    let mut memory = None;
    for (k, v) in &req.resource_limits {
        match k.as_str() {
            "cpu" => {
                cpus = Some(parse_cpu(v).ok_or_else(|| {
                    ApiError::bad_request(format!("resourceLimits.cpu {v:?}: expected cores (\"2\", \"0.5\") or millicores (\"500m\")"))
                })?)
            }
            "memory" => {
                let m = parse_memory(v).ok_or_else(|| {
                    ApiError::bad_request(format!("resourceLimits.memory {v:?}: expected a size such as \"512Mi\" or \"2Gi\""))
                })?;
                if m < 4 << 20 {
                    return bad("resourceLimits.memory must be at least 4Mi");
                }
                memory = Some(m)
            }
            "gpu" if v.trim() == "0" => {}
            "gpu" => return bad("resourceLimits.gpu: GPUs are not supported"),
            other => {
                return Err(ApiError::bad_request(format!("resourceLimits.{other} is not supported (cpu, memory)")))
            }
        }
    }
    let mut spec = LiveSpec::new(uri).cpus(cpus).memory_bytes(memory);
    for (k, v) in &req.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(ApiError::bad_request(format!(
                "env {k:?}: invalid variable"
            )));
        }
        spec = spec.env(k, v);
    }
    // The env file `commands.set_env` appends to (see execd::envfile), unless env names one.
    if !req.env.contains_key(crate::execd::envfile::VARIABLE) {
        spec = spec.env(
            crate::execd::envfile::VARIABLE,
            crate::execd::envfile::DEFAULT_PATH,
        );
    }
    let network = match req.network_policy.as_ref().filter(|p| !p.is_null()) {
        Some(p) => Some(
            agentrun_policy::OpenSandboxPolicy::from_value(p.clone())
                .map_err(|e| ApiError::bad_request(e.to_string()))?,
        ),
        None => None,
    };
    if network.is_some() {
        // Every process reaches the network only through the egress bridge and proxy.
        // With the credential proxy, TLS libraries in the sandbox trust the proxy's CA.
        spec = spec.through_egress_proxy(credential_proxy);
    }
    Ok(Validated {
        spec,
        snapshot_id,
        entrypoint,
        timeout: req.timeout,
        network,
        credential_proxy,
        volumes,
        access_renew_s: access_renew(req.extensions.as_ref())?,
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RenewRequest {
    expires_at: String,
}

/// A renew body's `expiresAt`, checked against `now` (in the future, at most
/// `MAX_TIMEOUT_S` away).
pub fn parse_renew(body: &[u8], now: DateTime<Utc>) -> ApiResult<DateTime<Utc>> {
    let req: RenewRequest = parse_json(body)?;
    let t: DateTime<Utc> = DateTime::parse_from_rfc3339(&req.expires_at)
        .map_err(|e| ApiError::bad_request(format!("expiresAt {:?}: {e}", req.expires_at)))?
        .with_timezone(&Utc);
    if t <= now {
        return Err(ApiError::bad_request("expiresAt must be in the future"));
    }
    if t > now + chrono::Duration::seconds(MAX_TIMEOUT_S) {
        return Err(ApiError::bad_request(format!(
            "expiresAt may be at most {MAX_TIMEOUT_S} s from now"
        )));
    }
    Ok(t)
}

/// `metadata` after a `PATCH .../metadata` body (a value of `null` removes its key), checked.
pub fn patch_metadata_body(
    mut metadata: BTreeMap<String, String>,
    body: &[u8],
) -> ApiResult<BTreeMap<String, String>> {
    let patch: BTreeMap<String, Option<String>> = parse_json(body)?;
    for (k, v) in patch {
        match v {
            Some(v) => {
                metadata.insert(k, v);
            }
            None => {
                metadata.remove(&k);
            }
        }
    }
    check_metadata(&metadata)?;
    Ok(metadata)
}

/// A body that must be a JSON object with no field but `name` (400 otherwise): that field's
/// value, if it is there.
pub(crate) fn only_field(body: &[u8], name: &str) -> ApiResult<Option<Value>> {
    let Value::Object(mut obj) = parse_json(body)? else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    if let Some(k) = obj.keys().find(|k| *k != name) {
        return Err(ApiError::bad_request(format!("unknown field {k:?}")));
    }
    Ok(obj.remove(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_memory_units() {
        assert_eq!(parse_cpu("500m"), Some(0.5));
        assert_eq!(parse_cpu("2"), Some(2.0));
        assert_eq!(parse_cpu("0.25"), Some(0.25));
        assert_eq!(parse_cpu("0"), None);
        assert_eq!(parse_cpu("x"), None);
        assert_eq!(parse_memory("512Mi"), Some(512 << 20));
        assert_eq!(parse_memory("2Gi"), Some(2 << 30));
        assert_eq!(parse_memory("1G"), Some(1_000_000_000));
        assert_eq!(parse_memory("512M"), Some(512_000_000));
        assert_eq!(parse_memory("1048576"), Some(1 << 20));
        assert_eq!(parse_memory("1gib"), Some(1 << 30));
        assert_eq!(parse_memory("lots"), None);
    }

    #[test]
    fn access_renew_extension_as_upstream_checks_it() {
        let x = |v: Value| access_renew(Some(&serde_json::json!({ACCESS_RENEW_KEY: v})));
        assert_eq!(x(Value::from("300")).unwrap(), Some(300));
        assert_eq!(x(Value::from(86_400)).unwrap(), Some(86_400));
        for bad in [
            Value::from("299"),
            Value::from(86_401),
            Value::from("5m"),
            Value::Null,
        ] {
            assert!(x(bad.clone()).is_err(), "{bad}");
        }
        assert_eq!(access_renew(None).unwrap(), None);
        assert_eq!(
            access_renew(Some(&serde_json::json!({"other": 1}))).unwrap(),
            None
        );
    }

    #[test]
    fn metadata_rules() {
        let m = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(check_metadata(&m("project", "demo")).is_ok());
        assert!(check_metadata(&m("opensandbox.io/x", "y")).is_err());
        assert!(check_metadata(&m("bad key", "y")).is_err());
        assert!(check_metadata(&m("k", "-bad")).is_err());
    }
}
