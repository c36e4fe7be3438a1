//! TLS interception: the proxy terminating a sandbox's TLS for the hosts it must see into
//! (a credential is bound to them), and opening its own, verified TLS to the real host.
//!
//! An [`Interceptor`] owns one certificate authority, made when it is created, its key in
//! memory only (never written anywhere; the sandbox gets the certificate, [`Interceptor::ca_pem`]).
//! agentrun makes one per sandbox, not one per daemon: a sandbox trusts only its own CA, the
//! key dies with the sandbox's proxy, and nothing one sandbox is shown is valid in another.
//! The cost is one P-256 key and certificate per sandbox that opts in (about a millisecond).
//!
//! Leaf certificates are minted per host on demand (P-256, signed by the CA, the host as the
//! subject alternative name) and cached with their rustls server configuration. Upstream,
//! the proxy verifies the real host's certificate against the host's root store
//! (`rustls-native-certs`: the system bundle) plus any roots the operator adds
//! ([`Interceptor::new`]'s `extra_roots`, e.g. an internal CA), read once per process and list
//! of extra roots and shared by every interceptor; the server name it verifies is
//! the host the sandbox's CONNECT named and the policy allowed. ALPN offers `http/1.1` on
//! both sides: the proxy reads HTTP/1 requests inside.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Leaf configurations kept per interceptor; past this the cache starts over.
const MAX_LEAVES: usize = 1024;

/// Errors making the CA, a leaf, or the upstream trust store.
#[derive(Debug, thiserror::Error)]
pub enum MitmError {
    #[error("tls interception: cannot make a certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("tls interception: {0}")]
    Tls(#[from] rustls::Error),
    #[error("tls interception: cannot read upstream roots from {path}: {why}")]
    Roots { path: PathBuf, why: String },
    #[error("tls interception: no upstream root certificate could be loaded")]
    NoRoots,
}

/// A per-sandbox CA and what it signs; the upstream TLS configuration.
pub struct Interceptor {
    ca_pem: String,
    ca: rcgen::Certificate,
    ca_key: KeyPair,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
    upstream: Arc<ClientConfig>,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptor").finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The upstream TLS configuration verifying against the host's roots and the PEM bundles in
/// `extra_roots`: built (the roots read and parsed, ~150 certificates) once per process and
/// list of extra roots, then shared by every interceptor made with that list, since the roots
/// are the daemon's, not a sandbox's. A bad extra roots file is an error every time (never
/// cached); roots the host changes later are seen by the next daemon.
fn upstream_config(extra_roots: &[PathBuf]) -> Result<Arc<ClientConfig>, MitmError> {
    type Configs = HashMap<Vec<PathBuf>, Arc<ClientConfig>>;
    static UPSTREAM: std::sync::OnceLock<Mutex<Configs>> = std::sync::OnceLock::new();
    let configs = UPSTREAM.get_or_init(Mutex::default);
    if let Some(c) = configs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(extra_roots)
    {
        return Ok(c.clone());
    }
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    for path in extra_roots {
        let bad = |why: String| MitmError::Roots {
            path: path.clone(),
            why,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| bad(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| bad(e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("no certificate in it".into()));
        }
        for c in certs {
            roots.add(c).map_err(|e| bad(e.to_string()))?;
        }
    }
    if roots.is_empty() {
        return Err(MitmError::NoRoots);
    }
    let mut upstream = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
    let upstream = Arc::new(upstream);
    configs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(extra_roots.to_vec(), upstream.clone());
    Ok(upstream)
}

impl Interceptor {
    /// A new CA; upstream certificates verified against the system's roots and the PEM
    /// bundles in `extra_roots`.
    pub fn new(name: &str, extra_roots: &[PathBuf]) -> Result<Self, MitmError> {
        let ca_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "agentrun");
        dn.push(DnType::CommonName, format!("agentrun egress CA {name}"));
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(365);
        let ca = params.self_signed(&ca_key)?;

        let upstream = upstream_config(extra_roots)?;
        Ok(Interceptor {
            ca_pem: ca.pem(),
            ca,
            ca_key,
            leaves: Mutex::default(),
            upstream,
        })
    }

    /// The CA certificate (PEM), to install in the sandbox's trust stores. Never the key.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The TLS server configuration presenting a certificate for `host` (minted once).
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, MitmError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = leaves.get(host) {
            return Ok(c.clone());
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![host.to_owned()])?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(30);
        let leaf = params.signed_by(&key, &self.ca, &self.ca_key)?;
        let chain = vec![leaf.der().clone(), self.ca.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut cfg = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_owned(), cfg.clone());
        Ok(cfg)
    }

    /// The client configuration for the upstream side.
    pub fn upstream_config(&self) -> Arc<ClientConfig> {
        self.upstream.clone()
    }
}

/// The CA certificate's file in the proxy's socket directory (the sandbox sees that
/// directory read-only).
pub const CA_FILE: &str = "ca.pem";
/// The system's roots followed by the CA certificate, in the same directory.
pub const BUNDLE_FILE: &str = "ca-bundle.pem";

/// Where hosts keep their system bundle (the first that exists is used).
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// The environment that makes TLS libraries in the sandbox trust the CA, the files under
/// `dir` (the socket directory as the sandbox sees it): OpenSSL (`SSL_CERT_FILE`: curl,
/// Python's `ssl`, httpx), `requests` (`REQUESTS_CA_BUNDLE`), curl (`CURL_CA_BUNDLE`),
/// pip, git, Node (`NODE_EXTRA_CA_CERTS`, added to its own roots) and Java
/// (`JAVA_TOOL_OPTIONS`: the trust store [`crate::java_trust`] and the proxy, which Java
/// does not take from `HTTPS_PROXY`).
pub fn trust_env(dir: &str) -> Vec<(String, String)> {
    let bundle = format!("{dir}/{BUNDLE_FILE}");
    let mut env: Vec<(String, String)> = [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "PIP_CERT",
        "GIT_SSL_CAINFO",
    ]
    .iter()
    .map(|k| (k.to_string(), bundle.clone()))
    .collect();
    env.push(("NODE_EXTRA_CA_CERTS".into(), format!("{dir}/{CA_FILE}")));
    env.push((
        "JAVA_TOOL_OPTIONS".into(),
        crate::java_trust::java_tool_options(
            "127.0.0.1",
            crate::SANDBOX_PROXY_PORT,
            &format!("{dir}/{}", crate::java_trust::TRUSTSTORE_FILE),
        ),
    ));
    env
}

/// The host's system bundle (a newline at its end) and its certificates as Java trust store
/// entries: read and built once per process, when a sandbox's trust is first written (each
/// sandbox adds only its own CA to both). A bundle the host changes later is seen by the
/// next daemon.
struct SystemTrust {
    bundle: String,
    java: crate::java_trust::Entries,
}

fn system_trust() -> &'static SystemTrust {
    static SYSTEM: std::sync::OnceLock<SystemTrust> = std::sync::OnceLock::new();
    SYSTEM.get_or_init(|| {
        let mut bundle = SYSTEM_BUNDLES
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with('\n') {
            bundle.push('\n');
        }
        let java = crate::java_trust::Entries::of(&bundle);
        SystemTrust { bundle, java }
    })
}

impl Interceptor {
    /// Writes [`CA_FILE`], [`BUNDLE_FILE`] (the host's system bundle, then the CA) and the
    /// same certificates as a Java trust store ([`crate::java_trust::TRUSTSTORE_FILE`]) into
    /// `dir`, mode 0644. The key is never written.
    pub fn write_trust(&self, dir: &std::path::Path) -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let system = system_trust();
        let bundle = format!("{}{}", system.bundle, self.ca_pem);
        let java = system.java.store_with(&self.ca_pem).unwrap_or_default();
        for (name, bytes) in [
            (CA_FILE, self.ca_pem.as_bytes()),
            (BUNDLE_FILE, bundle.as_bytes()),
            (crate::java_trust::TRUSTSTORE_FILE, &java),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, bytes)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        }
        Ok(())
    }
}

/// The rustls name for `host` (a DNS name or an address).
pub fn server_name(host: &str) -> io::Result<ServerName<'static>> {
    ServerName::try_from(host.to_owned())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// A stream that first yields bytes already read from it, then reads on.
pub struct Prefixed<S> {
    pre: io::Cursor<Vec<u8>>,
    inner: S,
}

impl<S> Prefixed<S> {
    pub fn new(pre: Vec<u8>, inner: S) -> Self {
        Prefixed {
            pre: io::Cursor::new(pre),
            inner,
        }
    }
}

impl<S> Prefixed<S> {
    /// The stream under the prefix.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: Read> Read for Prefixed<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if (self.pre.position() as usize) < self.pre.get_ref().len() {
            return self.pre.read(buf);
        }
        self.inner.read(buf)
    }
}

impl<S: Write> Write for Prefixed<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_pem_holds_the_certificate_only_and_leaves_are_cached() {
        let i = Interceptor::new("t", &[]).unwrap();
        assert!(i.ca_pem().contains("BEGIN CERTIFICATE"));
        assert!(!i.ca_pem().contains("PRIVATE KEY"));
        let a = i.server_config("api.example.com").unwrap();
        let b = i.server_config("api.example.com").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        i.server_config("10.0.0.1").unwrap();
    }

    /// What a sandbox is given to trust: the host's bundle then its CA, as PEM and as the Java
    /// store of the same certificates, though the host's part is built once per process.
    #[test]
    fn trust_written_twice_is_the_host_bundle_and_each_ca() {
        let host = SYSTEM_BUNDLES
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        for name in ["one", "two"] {
            let i = Interceptor::new(name, &[]).unwrap();
            let d = tempfile::tempdir().unwrap();
            i.write_trust(d.path()).unwrap();
            let read = |f: &str| std::fs::read(d.path().join(f)).unwrap();
            let bundle = String::from_utf8(read(BUNDLE_FILE)).unwrap();
            assert!(bundle.starts_with(host.trim_end()), "{name}");
            assert!(bundle.ends_with(i.ca_pem()), "{name}");
            assert_eq!(read(CA_FILE), i.ca_pem().as_bytes());
            assert_eq!(
                read(crate::java_trust::TRUSTSTORE_FILE),
                crate::java_trust::truststore(&bundle).unwrap(),
                "{name}"
            );
        }
    }

    /// The roots are the daemon's: interceptors made with the same extra roots share one
    /// upstream configuration; another list gets its own; each keeps its own CA.
    #[test]
    fn interceptors_share_the_upstream_roots_and_not_their_ca() {
        let a = Interceptor::new("a", &[]).unwrap();
        let b = Interceptor::new("b", &[]).unwrap();
        assert!(Arc::ptr_eq(&a.upstream, &b.upstream));
        assert_ne!(a.ca_pem(), b.ca_pem());
        let d = tempfile::tempdir().unwrap();
        let extra = d.path().join("extra.pem");
        std::fs::write(&extra, a.ca_pem()).unwrap();
        let c = Interceptor::new("c", std::slice::from_ref(&extra)).unwrap();
        assert!(!Arc::ptr_eq(&a.upstream, &c.upstream));
    }

    #[test]
    fn a_missing_roots_file_is_an_error() {
        let e = Interceptor::new("t", &["/nonexistent/roots.pem".into()]).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/roots.pem"), "{e}");
    }
}
