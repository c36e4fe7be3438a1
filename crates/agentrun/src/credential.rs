//! `agentrun exec --credential`: a credential the run's egress proxy adds to requests to one
//! host, read here (the caller's environment or a file), never given to the sandbox.
//!
//! `--credential [AUTH:]NAME@HOST[:PORT][/PATH]=env:VAR|file:PATH` where AUTH is `bearer`
//! (the default), `basic` (the value is base64(user:password)), `header=FIELD`,
//! `query=PARAM` or `placeholder=TEXT` (TEXT in the sandbox's header values is replaced).
//! PORT defaults to 443 (https; 80: http), PATH to every path (`/v1` means `/v1/*`). The
//! host is allowed through the proxy (`cli.credential[i]`), and TLS to it is intercepted
//! with a CA made for the run, trusted inside the sandbox only.

use std::path::PathBuf;

use agentrun_egress::vault::{
    AuthSpec, BindingSpec, CredentialSpec, MatchSpec, SourceSpec, VaultCreate,
};
use agentrun_egress::{Secret, Vault};
use anyhow::{anyhow, bail, Context};

/// One parsed `--credential`.
pub(crate) struct CliCredential {
    pub(crate) host: String,
    pub(crate) port: u16,
    credential: CredentialSpec,
    binding: BindingSpec,
    source_type: &'static str,
}

/// The egress flags `exec` and `mcp` share: hosts allowed on top of the profile, credentials
/// the proxy adds, and the roots trusted for upstreams when TLS is intercepted.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EgressArgs {
    /// Allow connections to HOST[:PORT] (or *.DOMAIN[:PORT]) through the egress proxy, on top
    /// of the profile's rules (repeatable). Turns on the proxy for a profile without network.
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    pub(crate) allow_host: Vec<String>,
    /// A credential the egress proxy adds to requests to one host; the sandbox never holds
    /// it: [AUTH:]NAME@HOST[:PORT][/PATH]=env:VAR|file:PATH, AUTH bearer (default), basic,
    /// header=FIELD, query=PARAM or placeholder=TEXT (repeatable). Allows the host, and
    /// intercepts TLS to it with a CA made for the run (trusted in the sandbox only).
    #[arg(long = "credential", value_name = "SPEC")]
    pub(crate) credential: Vec<String>,
    /// A PEM bundle of roots also trusted for upstream servers when TLS is intercepted
    /// (repeatable; the system's roots always are).
    #[arg(long = "egress-upstream-ca", value_name = "FILE")]
    pub(crate) egress_upstream_ca: Vec<PathBuf>,
}

/// Parses every `--credential` of `specs` (in order: a spec's index names it in errors), adding
/// each one's `HOST:PORT` to `allow` when missing: a credential is of use only where the
/// sandbox may connect. `exec` and `mcp` take the same flags this way.
pub(crate) fn parse_all(
    specs: &[String],
    allow: &mut Vec<String>,
) -> anyhow::Result<Vec<CliCredential>> {
    let mut creds = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let c = parse(spec, i, "cli.credential")?;
        let host = if c.host.contains(':') {
            format!("[{}]:{}", c.host, c.port)
        } else {
            format!("{}:{}", c.host, c.port)
        };
        if !allow.contains(&host) {
            allow.push(host);
        }
        creds.push(c);
    }
    Ok(creds)
}

/// The credentials a profile names (`[network] credentials`, see
/// [`agentrun_policy::network::credential_target`]), their values read here, by the process
/// that loaded the profile; bindings `network.credentials[i]`. The profile allows their hosts.
pub(crate) fn from_profile(
    profile: &agentrun_policy::Profile,
) -> anyhow::Result<Vec<CliCredential>> {
    profile
        .network
        .credentials
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            parse(spec, i, "network.credentials")
                .with_context(|| format!("profile {}: network.credentials[{i}]", profile.name))
        })
        .collect()
}

/// The vault of every MCP session's sandbox: the command line's credentials (`cli`), then
/// the loaded profile's; `None` when there are none (no interception for credentials).
pub(crate) fn session_vault(
    mut cli: Vec<CliCredential>,
    profile: &agentrun_policy::Profile,
) -> anyhow::Result<Option<Vault>> {
    cli.extend(from_profile(profile)?);
    if cli.is_empty() {
        Ok(None)
    } else {
        vault(cli).map(Some)
    }
}

/// Parses `spec` (see the module docs) and reads its value; its binding is `{rule}[{index}]`.
pub(crate) fn parse(spec: &str, index: usize, rule: &str) -> anyhow::Result<CliCredential> {
    let usage = "expected [AUTH:]NAME@HOST[:PORT][/PATH]=env:VAR|file:PATH";
    let (left, right) = spec
        .split_once('@')
        .ok_or_else(|| anyhow!("{spec:?}: no '@' ({usage})"))?;
    let (target, source) = right
        .split_once('=')
        .ok_or_else(|| anyhow!("{spec:?}: no '=' ({usage})"))?;
    let (auth, name) = match left.rsplit_once(':') {
        Some((a, n)) => (a, n),
        None => ("bearer", left),
    };
    if name.is_empty() {
        bail!("{spec:?}: the credential needs a NAME ({usage})");
    }
    let (hostport, path) = match target.find('/') {
        Some(i) => (&target[..i], &target[i..]),
        None => (target, "/"),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| anyhow!("{spec:?}: bad port {p:?}"))?,
        ),
        None => (hostport, 443),
    };
    let host = host.to_ascii_lowercase();
    let (value, source_type) = if let Some(var) = source.strip_prefix("env:") {
        let v = std::env::var(var)
            .with_context(|| format!("--credential {name}: environment variable {var}"))?;
        (v, "env")
    } else if let Some(file) = source.strip_prefix("file:") {
        let v = std::fs::read_to_string(PathBuf::from(file))
            .with_context(|| format!("--credential {name}: {file}"))?;
        (v.trim_end_matches(['\n', '\r']).to_owned(), "file")
    } else {
        bail!("{spec:?}: the value comes from env:VAR or file:PATH ({usage})");
    };
    let credential = name.to_owned();
    let auth = match auth.split_once('=') {
        None if auth == "bearer" => AuthSpec::Bearer { credential },
        None if auth == "basic" => AuthSpec::Basic { credential },
        Some(("header", f)) => AuthSpec::ApiKey {
            name: f.to_owned(),
            credential,
        },
        Some(("query", p)) => AuthSpec::Query {
            name: p.to_owned(),
            credential,
        },
        Some(("placeholder", t)) => AuthSpec::Placeholder {
            placeholder: t.to_owned(),
            credential,
        },
        _ => bail!(
            "{spec:?}: AUTH {auth:?} is not bearer, basic, header=FIELD, query=PARAM or placeholder=TEXT"
        ),
    };
    let path = if path.ends_with('*') {
        path.to_owned()
    } else if path.ends_with('/') {
        format!("{path}*")
    } else {
        format!("{path}/*")
    };
    let binding = BindingSpec {
        name: format!("{rule}[{index}]"),
        match_: MatchSpec {
            schemes: vec![if port == 80 { "http" } else { "https" }.into()],
            ports: vec![port],
            hosts: vec![host.clone()],
            methods: ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
                .map(String::from)
                .to_vec(),
            paths: vec![path],
        },
        auth,
    };
    Ok(CliCredential {
        host,
        port,
        credential: CredentialSpec {
            name: name.to_owned(),
            source: SourceSpec {
                type_: None,
                value: Secret::new(value),
            },
        },
        binding,
        source_type,
    })
}

/// A vault holding `creds` (one source type per vault: the first's).
pub(crate) fn vault(creds: Vec<CliCredential>) -> anyhow::Result<Vault> {
    let vault = Vault::new();
    let source = creds.first().map_or("env", |c| c.source_type);
    let mut req = VaultCreate {
        credentials: Vec::new(),
        bindings: Vec::new(),
    };
    for c in creds {
        req.credentials.push(c.credential);
        req.bindings.push(c.binding);
    }
    vault
        .create_with_source(req, source)
        .map_err(|e| anyhow!("--credential: {e}"))?;
    Ok(vault)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_shapes_and_refuses_bad_ones() {
        std::env::set_var("AGENTRUN_TEST_CRED", "v1");
        let c = parse(
            "header=X-Api-Key:k@API.example.com:8443/v1=env:AGENTRUN_TEST_CRED",
            0,
            "cli.credential",
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("api.example.com", 8443));
        assert_eq!(c.binding.match_.paths, ["/v1/*"]);
        assert!(matches!(c.binding.auth, AuthSpec::ApiKey { ref name, .. } if name == "X-Api-Key"));
        let c = parse("k@h.example=env:AGENTRUN_TEST_CRED", 1, "cli.credential").unwrap();
        assert!(matches!(c.binding.auth, AuthSpec::Bearer { .. }));
        assert_eq!(c.binding.match_.paths, ["/*"]);
        for bad in [
            "k=env:X",
            "k@h",
            "@h=env:AGENTRUN_TEST_CRED",
            "k@h=plain",
            "nope:k@h=env:AGENTRUN_TEST_CRED",
            "k@h:0=env:AGENTRUN_TEST_CRED",
            "k@h=env:AGENTRUN_NO_SUCH_VAR_EVER",
        ] {
            assert!(parse(bad, 0, "cli.credential").is_err(), "{bad}");
        }
        let e = parse("k@h=env:AGENTRUN_NO_SUCH_VAR_EVER", 0, "cli.credential")
            .err()
            .unwrap();
        assert!(format!("{e:#}").contains("AGENTRUN_NO_SUCH_VAR_EVER"));
    }
}
