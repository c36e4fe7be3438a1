//! TLS interception and credential injection through a real proxy, against a real TLS echo
//! server (its own test CA, given to the interceptor as an operator's extra root).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentrun_policy::NetworkPolicy;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::test_support::{allowing, ask, closing, mutate, read_head, tunnel, upstream, vault_of};
use crate::*;

const SECRET: &str = "sk-live-7d1f0e9a42c8";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A TLS listener on 127.0.0.1 with a certificate for `127.0.0.1` from a test CA of its own:
/// the listener, its port, the server config, and the CA's PEM (the operator's extra root).
fn tls_upstream() -> (TcpListener, u16, Arc<ServerConfig>, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "test upstream CA");
    let ca = p.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let cfg = Arc::new(
        ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap(),
    );
    let (l, port) = upstream();
    (l, port, cfg, ca.pem())
}

/// A TLS server on 127.0.0.1 answering each request with the request head it received.
struct Echo {
    port: u16,
    ca_pem: String,
    /// Every request head it got.
    got: Arc<Mutex<Vec<String>>>,
}

fn echo_server() -> Echo {
    let (l, port, cfg, ca_pem) = tls_upstream();
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let got2 = got.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let cfg = cfg.clone();
            let got = got2.clone();
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let conn = rustls::ServerConnection::new(cfg).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, s);
                let Some(body) = read_head(&mut tls) else {
                    return;
                };
                got.lock().unwrap().push(body.clone());
                let _ = tls.write_all(closing(&body).as_bytes());
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    Echo { port, ca_pem, got }
}

/// Accepts any server certificate: the client a hostile sandbox could write.
#[derive(Debug)]
struct AnyCert;

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

fn client_trusting(pem: &str) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

fn client_any() -> Arc<ClientConfig> {
    Arc::new(
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert))
            .with_no_client_auth(),
    )
}

/// CONNECTs through the proxy at `sock` to `127.0.0.1:port`, speaks TLS with `cfg` naming
/// `sni`, sends `req`; returns what came back (or the TLS error).
fn through(sock: &Path, port: u16, cfg: Arc<ClientConfig>, sni: &str, req: &str) -> String {
    let c = tunnel(sock, port);
    let name = ServerName::try_from(sni.to_owned()).unwrap();
    let conn = rustls::ClientConnection::new(cfg, name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, c);
    if let Err(e) = tls.write_all(req.as_bytes()) {
        return format!("tls error: {e}");
    }
    let mut out = Vec::new();
    match tls.read_to_end(&mut out) {
        Ok(_) => String::from_utf8_lossy(&out).into_owned(),
        Err(e) if out.is_empty() => format!("tls error: {e}"),
        Err(_) => String::from_utf8_lossy(&out).into_owned(),
    }
}

/// An interceptor named `name` trusting `upstream_ca` (a PEM; none if empty) as an operator's
/// extra root, and the temporary directory holding that file (the test's scratch directory).
fn interceptor_trusting(name: &str, upstream_ca: &str) -> (tempfile::TempDir, Arc<Interceptor>) {
    let dir = tempfile::tempdir().unwrap();
    let mut extra = Vec::new();
    if !upstream_ca.is_empty() {
        let roots = dir.path().join("upstream-ca.pem");
        std::fs::write(&roots, upstream_ca).unwrap();
        extra.push(roots);
    }
    let interceptor = Arc::new(Interceptor::new(name, &extra).unwrap());
    (dir, interceptor)
}

/// `through` with a client trusting `ca` (a PEM) and naming `127.0.0.1`.
fn through_trusting(sock: &Path, port: u16, ca: &str, req: &str) -> String {
    through(sock, port, client_trusting(ca), "127.0.0.1", req)
}

struct Setup {
    proxy: Proxy,
    sock: PathBuf,
    seen: Arc<Mutex<Vec<String>>>,
    interceptor: Arc<Interceptor>,
    vault: Vault,
    _dir: tempfile::TempDir,
}

fn setup(echo: &Echo, trust_upstream: bool, ports: &[u16]) -> Setup {
    let trusted = if trust_upstream { &echo.ca_pem[..] } else { "" };
    let (dir, interceptor) = interceptor_trusting("test", trusted);
    let vault = vault_of(serde_json::json!({
        "credentials": [{"name": "key", "source": {"type": "inline", "value": SECRET}}],
        "bindings": [{"name": "api", "match": {"hosts": ["127.0.0.1"], "ports": [echo.port]},
                      "auth": {"type": "bearer", "credential": "key"}}]
    }));
    let policy = allowing(ports);
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let (s1, s2, s3) = (seen.clone(), seen.clone(), seen.clone());
    let sink: DecisionSink = Arc::new(move |a, d| {
        s1.lock()
            .unwrap()
            .push(format!("{} {} {}", d.verdict(), a.resource(), d.reason));
        true
    });
    let sock = dir.path().join("proxy.sock");
    let proxy = Proxy::builder(policy, sink)
        .failures(Arc::new(move |a, _, f| {
            s2.lock()
                .unwrap()
                .push(format!("error {} {}", a.resource(), f.message));
        }))
        .injections(Arc::new(move |a, m, p, b| {
            s3.lock()
                .unwrap()
                .push(format!("inject {} {m} {p} {b}", a.resource()));
            true
        }))
        .intercept(interceptor.clone(), vault.clone())
        .start(bind(&sock).unwrap(), &sock);
    Setup {
        proxy,
        sock,
        seen,
        interceptor,
        vault,
        _dir: dir,
    }
}

/// `setup` for one echo server whose certificate the interceptor trusts; and its port.
fn setup_trusted() -> (Setup, u16) {
    let echo = echo_server();
    (setup(&echo, true, &[echo.port]), echo.port)
}

#[test]
fn bound_host_gets_the_credential_and_the_client_never_sees_it() {
    let (s, port) = setup_trusted();
    let ca = s.interceptor.ca_pem().to_owned();
    let r = through_trusting(&s.sock, port, &ca, &format!("GET /v1/models?x=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer placeholder\r\n\r\n"));
    // The echo shows what the upstream got: the real credential, once; the sandbox's own
    // Authorization replaced.
    assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    assert!(
        r.contains(&format!("Authorization: Bearer {SECRET}\r\n")),
        "{r}"
    );
    assert!(!r.contains("placeholder"), "{r}");
    assert!(r.contains("GET /v1/models?x=1 HTTP/1.1\r\n"), "{r}");
    // Rotation takes effect on the next request.
    mutate(
        &s.vault,
        serde_json::json!({
            "credentials": {"replace": [{"name": "key", "source": {"type": "inline", "value": "rotated-value-2"}}]}
        }),
    );
    let r = through_trusting(
        &s.sock,
        port,
        &ca,
        &format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
    );
    assert!(
        r.contains("Authorization: Bearer rotated-value-2\r\n"),
        "{r}"
    );
    s.proxy.stop();
    let seen = s.seen.lock().unwrap();
    assert!(
        seen.contains(&format!("inject 127.0.0.1:{port} GET /v1/models api")),
        "{seen:?}"
    );
    assert!(!seen.iter().any(|l| l.contains(SECRET)), "{seen:?}");
}

#[test]
fn sni_or_host_naming_another_host_is_refused() {
    let (s, port) = setup_trusted();
    let r = through(
        &s.sock,
        port,
        client_any(),
        "evil.example",
        &format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
    );
    assert!(r.starts_with("HTTP/1.1 421 Misdirected Request"), "{r}");
    assert!(r.contains("\"evil.example\" is not 127.0.0.1"), "{r}");
    assert!(!r.contains(SECRET));
    let r = through_trusting(
        &s.sock,
        port,
        s.interceptor.ca_pem(),
        "GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n",
    );
    assert!(r.starts_with("HTTP/1.1 421 Misdirected Request"), "{r}");
    assert!(!r.contains(SECRET));
    s.proxy.stop();
}

#[test]
fn unbound_hosts_are_tunnelled_untouched_and_bad_upstream_certs_refused() {
    let bound = echo_server();
    let other = echo_server();
    let s = setup(&bound, false, &[bound.port, other.port]);
    // Not bound: the client talks TLS to the real server (its own CA verifies), no credential.
    let r = through_trusting(
        &s.sock,
        other.port,
        &other.ca_pem,
        &format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", other.port),
    );
    assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    assert!(!r.contains("Authorization"), "{r}");
    // Bound, but the upstream's certificate is not trusted (no operator root this time): 502,
    // nothing sent.
    let r = through_trusting(
        &s.sock,
        bound.port,
        s.interceptor.ca_pem(),
        &format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", bound.port),
    );
    assert!(r.starts_with("HTTP/1.1 502 Bad Gateway"), "{r}");
    assert!(
        r.contains("TLS to 127.0.0.1 failed: invalid peer certificate"),
        "{r}"
    );
    s.proxy.stop();
    let seen = s.seen.lock().unwrap();
    assert!(seen.iter().any(|l| l.starts_with("error ")), "{seen:?}");
    assert!(!seen.iter().any(|l| l.starts_with("inject")), "{seen:?}");
}

/// A plain-HTTP request forwarded to a host an `http` binding names gets the credential on
/// the paths it names only (upstream's e2e shape: schemes http, port 80, exact paths).
#[test]
fn plain_http_requests_to_bound_paths_get_the_credential() {
    let (upstream, port) = upstream();
    std::thread::spawn(move || {
        for s in upstream.incoming() {
            let Ok(mut s) = s else { continue };
            if let Some(head) = read_head(&mut s) {
                let _ = s.write_all(closing(&head).as_bytes());
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let vault = vault_of(serde_json::json!({
        "credentials": [{"name": "b", "source": {"value": "dXNlcjpwYXNz"}}],
        "bindings": [{"name": "basic", "match": {"schemes": ["http"], "ports": [port], "hosts": ["127.0.0.1"],
                      "methods": ["GET"], "paths": ["/basic"]},
                      "auth": {"type": "basic", "credential": "b"}}]
    }));
    let policy = allowing(&[port]);
    let sock = dir.path().join("proxy.sock");
    let interceptor = Arc::new(Interceptor::new("t", &[]).unwrap());
    let proxy = Proxy::builder(policy, Arc::new(|_, _| true))
        .intercept(interceptor, vault)
        .start(bind(&sock).unwrap(), &sock);
    let get = |path: &str| {
        let req =
            format!("GET http://127.0.0.1:{port}{path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n");
        ask(&sock, &req)
    };
    let r = get("/basic");
    assert!(r.contains("Authorization: Basic dXNlcjpwYXNz\r\n"), "{r}");
    let r = get("/basic/more");
    assert!(
        r.starts_with("HTTP/1.1 200 OK") && !r.contains("Authorization"),
        "{r}"
    );
    proxy.stop();
}

/// L7 rules inside intercepted TLS: each request decided by method, path and header (first
/// match wins; a host with an allow rule denies the rest), each decision reported (verdict,
/// resource `METHOD host:port/path`, rule); an escalate rule with no one to ask is denied
/// "needs approval". A host with L7 rules and no interception is refused at CONNECT.
#[test]
fn http_rules_decide_each_request_inside_tls() {
    use agentrun_policy::{HttpRule, RuleAction};
    let echo = echo_server();
    let port = echo.port;
    let (dir, interceptor) = interceptor_trusting("l7", &echo.ca_pem);
    let mut policy = allowing(&[port]);
    for (id, action, spec) in [
        (
            "network.http_deny[0]",
            RuleAction::Deny,
            "DELETE 127.0.0.1/v1/",
        ),
        (
            "network.http_allow[0]",
            RuleAction::Allow,
            "GET 127.0.0.1/v1/",
        ),
        (
            "network.http_escalate[0]",
            RuleAction::Escalate,
            "POST 127.0.0.1/v1/ X-Mode=write",
        ),
    ] {
        policy.http.push(HttpRule::parse(id, action, spec).unwrap());
    }
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s1 = seen.clone();
    let sink: DecisionSink = Arc::new(move |a, d| {
        s1.lock().unwrap().push(format!(
            "{} {} {} {}",
            d.verdict(),
            a.name(),
            a.resource(),
            d.rule_id
        ));
        true
    });
    let sock = dir.path().join("proxy.sock");
    let proxy = Proxy::builder(policy.clone(), sink.clone())
        .intercept(interceptor.clone(), Vault::new())
        .start(bind(&sock).unwrap(), &sock);
    let ca = interceptor.ca_pem().to_owned();
    let ask = |req: String| through_trusting(&sock, port, &ca, &req);
    let h = format!("Host: 127.0.0.1:{port}");
    let r = ask(format!("GET /v1/items?q=1 HTTP/1.1\r\n{h}\r\n\r\n"));
    assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    let r = ask(format!("DELETE /v1/items/3 HTTP/1.1\r\n{h}\r\n\r\n"));
    assert!(r.starts_with("HTTP/1.1 403 Forbidden"), "{r}");
    assert!(r.contains("denied by rule network.http_deny[0]"), "{r}");
    let r = ask(format!(
        "POST /v1/items HTTP/1.1\r\n{h}\r\nX-Mode: write\r\nContent-Length: 0\r\n\r\n"
    ));
    assert!(
        r.starts_with("HTTP/1.1 403 Forbidden") && r.contains("needs approval"),
        "{r}"
    );
    let r = ask(format!("GET /admin HTTP/1.1\r\n{h}\r\n\r\n"));
    assert!(r.contains("denied by rule network.http_default"), "{r}");
    let r = ask(format!("GET /v1/../admin HTTP/1.1\r\n{h}\r\n\r\n"));
    assert!(r.contains("denied by rule network.http_path"), "{r}");
    proxy.stop();
    let got = seen.lock().unwrap().clone();
    let http: Vec<&String> = got.iter().filter(|l| l.contains(" net.http ")).collect();
    assert_eq!(
        http,
        [
            &format!("allow net.http GET 127.0.0.1:{port}/v1/items network.http_allow[0]"),
            &format!("deny net.http DELETE 127.0.0.1:{port}/v1/items/3 network.http_deny[0]"),
            &format!("escalate net.http POST 127.0.0.1:{port}/v1/items network.http_escalate[0]"),
            &format!("deny net.http GET 127.0.0.1:{port}/admin network.http_default"),
            &format!("deny net.http GET 127.0.0.1:{port}/v1/../admin network.http_path"),
        ],
        "{got:?}"
    );

    // The same rules on a proxy that does not intercept: the CONNECT is refused.
    let sock2 = dir.path().join("plain.sock");
    let proxy = Proxy::builder(policy, sink).start(bind(&sock2).unwrap(), &sock2);
    let out = crate::test_support::ask(
        &sock2,
        &format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"),
    );
    assert!(
        out.starts_with("HTTP/1.1 403") && out.contains("network.http_intercept"),
        "{out}"
    );
    proxy.stop();
}

/// Keep-alive through interception: three requests on one client connection, each decided
/// and injected (a rotation between them shows on the next), served over one upstream
/// connection; a chunked response and a HEAD are framed right.
#[test]
fn intercepted_connections_are_kept_alive() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (l, port, cfg, ca_pem) = tls_upstream();
    let conns = Arc::new(AtomicUsize::new(0));
    let c2 = conns.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            c2.fetch_add(1, Ordering::SeqCst);
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let conn = rustls::ServerConnection::new(cfg).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, s);
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match tls.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
                    buf.drain(..end + 4);
                    let auth = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Authorization: "))
                        .unwrap_or("none")
                        .to_owned();
                    let out = if head.starts_with("HEAD ") {
                        "HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n".to_owned()
                    } else if head.contains("/chunked") {
                        format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{auth}\r\n0\r\n\r\n", auth.len())
                    } else {
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{auth}",
                            auth.len()
                        )
                    };
                    if tls.write_all(out.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let (dir, interceptor) = interceptor_trusting("keep", &ca_pem);
    let vault = vault_of(serde_json::json!({
        "credentials": [{"name": "key", "source": {"value": "first-value"}}],
        "bindings": [{"name": "api", "match": {"hosts": ["127.0.0.1"], "ports": [port], "methods": ["GET", "HEAD"]},
                      "auth": {"type": "bearer", "credential": "key"}}]
    }));
    let policy = allowing(&[port]);
    let sock = dir.path().join("proxy.sock");
    let proxy = Proxy::builder(policy, Arc::new(|_, _| true))
        .intercept(interceptor.clone(), vault.clone())
        .start(bind(&sock).unwrap(), &sock);
    let c = tunnel(&sock, port);
    let conn = rustls::ClientConnection::new(
        client_trusting(interceptor.ca_pem()),
        ServerName::try_from("127.0.0.1".to_owned()).unwrap(),
    )
    .unwrap();
    let mut tls = rustls::StreamOwned::new(conn, c);
    // Reads one response: its head, then Content-Length bytes or a chunked body.
    let mut pending: Vec<u8> = Vec::new();
    let mut one = |tls: &mut rustls::StreamOwned<rustls::ClientConnection, UnixStream>,
                   req: &str| {
        tls.write_all(req.as_bytes()).unwrap();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&pending[..end + 4]).into_owned();
                let want_end = if req.starts_with("HEAD") {
                    end + 4
                } else if head.contains("chunked") {
                    match pending.windows(5).position(|w| w == b"0\r\n\r\n") {
                        Some(z) => z + 5,
                        None => usize::MAX,
                    }
                } else {
                    let n: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .unwrap()
                        .trim()
                        .parse()
                        .unwrap();
                    end + 4 + n
                };
                if pending.len() >= want_end {
                    let out = String::from_utf8_lossy(&pending[..want_end]).into_owned();
                    pending.drain(..want_end);
                    return out;
                }
            }
            let n = tls.read(&mut chunk).unwrap();
            assert!(
                n > 0,
                "closed early: {:?}",
                String::from_utf8_lossy(&pending)
            );
            pending.extend_from_slice(&chunk[..n]);
        }
    };
    let h = format!("Host: 127.0.0.1:{port}");
    let r = one(&mut tls, &format!("GET /a HTTP/1.1\r\n{h}\r\n\r\n"));
    assert!(
        r.ends_with("Bearer first-value") && !r.contains("Connection: close"),
        "{r}"
    );
    mutate(
        &vault,
        serde_json::json!({
            "credentials": {"replace": [{"name": "key", "source": {"value": "second-value"}}]}
        }),
    );
    let r = one(&mut tls, &format!("GET /chunked HTTP/1.1\r\n{h}\r\n\r\n"));
    assert!(r.contains("Bearer second-value\r\n0\r\n\r\n"), "{r}");
    let r = one(&mut tls, &format!("HEAD /h HTTP/1.1\r\n{h}\r\n\r\n"));
    assert!(
        r.starts_with("HTTP/1.1 200 OK") && r.contains("Content-Length: 99"),
        "{r}"
    );
    let r = one(
        &mut tls,
        &format!("GET /last HTTP/1.1\r\n{h}\r\nConnection: close\r\n\r\n"),
    );
    assert!(
        r.contains("Connection: close") && r.ends_with("Bearer second-value"),
        "{r}"
    );
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(conns.load(Ordering::SeqCst), 1, "one upstream connection");
    proxy.stop();
}

/// `Expect: 100-continue` is answered by the proxy (the upstream never sees it) and the body
/// still arrives.
#[test]
fn expect_continue_is_answered_by_the_proxy() {
    let (s, port) = setup_trusted();
    let r = through_trusting(&s.sock, port, s.interceptor.ca_pem(), &format!("POST /v1/up HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello"));
    assert!(
        r.starts_with("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK"),
        "{r}"
    );
    assert!(
        r.contains("POST /v1/up HTTP/1.1\r\n") && !r.to_ascii_lowercase().contains("expect:"),
        "{r}"
    );
    s.proxy.stop();
}

/// A use that cannot be recorded is not made: a request whose credential use the injection
/// sink could not record, and a request an HTTP rule allowed whose decision could not be
/// recorded, are answered 503 and never reach the upstream (the credential goes nowhere).
#[test]
fn unrecorded_uses_fail_closed() {
    use agentrun_policy::{HttpRule, RuleAction};
    let echo = echo_server();
    let port = echo.port;
    let (dir, interceptor) = interceptor_trusting("unrecorded", &echo.ca_pem);
    let vault = vault_of(serde_json::json!({
        "credentials": [{"name": "key", "source": {"type": "inline", "value": SECRET}}],
        "bindings": [{"name": "api", "match": {"hosts": ["127.0.0.1"], "ports": [port], "paths": ["/v1/*"]},
                      "auth": {"type": "bearer", "credential": "key"}}]
    }));
    let mut policy = allowing(&[port]);
    policy.http.push(
        HttpRule::parse("network.http_allow[0]", RuleAction::Allow, "GET 127.0.0.1/").unwrap(),
    );
    // The audit "fails" for net.http decisions on /rule paths and for every injection.
    let sink: DecisionSink = Arc::new(|a, _| !a.resource().contains("/rule"));
    let sock = dir.path().join("proxy.sock");
    let proxy = Proxy::builder(policy, sink)
        .intercept(interceptor.clone(), vault)
        .injections(Arc::new(|_, _, _, _| false))
        .start(bind(&sock).unwrap(), &sock);
    let ca = interceptor.ca_pem().to_owned();
    let ask = |req: String| through_trusting(&sock, port, &ca, &req);
    let h = format!("Host: 127.0.0.1:{port}");
    let r = ask(format!("GET /v1/models HTTP/1.1\r\n{h}\r\n\r\n"));
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert!(
        r.contains("the credential's use could not be recorded"),
        "{r}"
    );
    let r = ask(format!("GET /rule/x HTTP/1.1\r\n{h}\r\n\r\n"));
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert!(r.contains("the decision could not be recorded"), "{r}");
    // What is recorded and binds nothing still goes.
    let r = ask(format!("GET /open HTTP/1.1\r\n{h}\r\n\r\n"));
    assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    proxy.stop();
    let got = echo.got.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].starts_with("GET /open "), "{got:?}");
    assert!(!got.iter().any(|g| g.contains(SECRET)), "{got:?}");
}

/// HTTP/2 on an intercepted connection is refused cleanly: a client offering only `h2` in
/// ALPN gets a `no_application_protocol` alert in the handshake; one that sends HTTP/2's
/// preface without asking gets a 505 saying why; one offering both gets HTTP/1.1.
#[test]
fn http2_is_refused_cleanly() {
    let (s, port) = setup_trusted();
    let ca = s.interceptor.ca_pem().to_owned();
    let alpn = |protocols: &[&[u8]]| {
        let mut cfg = (*client_trusting(&ca)).clone();
        cfg.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
        Arc::new(cfg)
    };
    let r = through(&s.sock, port, alpn(&[b"h2"]), "127.0.0.1", "x");
    assert!(
        r.contains("tls error") && r.contains("NoApplicationProtocol"),
        "{r}"
    );
    let r = through_trusting(
        &s.sock,
        port,
        &ca,
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0",
    );
    assert!(
        r.starts_with("HTTP/1.1 505 HTTP Version Not Supported"),
        "{r}"
    );
    assert!(
        r.contains("HTTP/2 is not served on intercepted connections"),
        "{r}"
    );
    let r = through(
        &s.sock,
        port,
        alpn(&[b"h2", b"http/1.1"]),
        "127.0.0.1",
        &format!("GET /v1/x HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
    );
    assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
    s.proxy.stop();
}

/// A stopped proxy removes its CA's files from its socket's directory (a cell of a reused
/// shell installs whatever CA it finds there), and only its own: not those of a later proxy
/// that wrote its own since (the next run on the same shell).
#[test]
fn a_stopped_proxy_removes_its_own_ca_files_only() {
    let dir = tempfile::tempdir().unwrap();
    let sink: DecisionSink = Arc::new(|_, _| true);
    let start = |name: &str, sock: &str| {
        let i = Arc::new(Interceptor::new(name, &[]).unwrap());
        i.write_trust(dir.path()).unwrap();
        let sock = dir.path().join(sock);
        let p = Proxy::builder(NetworkPolicy::default(), sink.clone())
            .intercept(i.clone(), Vault::new())
            .start(bind(&sock).unwrap(), &sock);
        (p, i)
    };
    let ca = dir.path().join(crate::mitm::CA_FILE);
    let bundle = dir.path().join(crate::mitm::BUNDLE_FILE);
    let (first, _) = start("first", "a.sock");
    let (second, i2) = start("second", "b.sock");
    first.stop();
    assert_eq!(std::fs::read_to_string(&ca).unwrap(), i2.ca_pem());
    assert!(bundle.exists());
    second.stop();
    assert!(!ca.exists() && !bundle.exists());
}
