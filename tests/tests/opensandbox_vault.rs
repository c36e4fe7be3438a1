//! The credential vault through `agentrun serve` with the official SDK 1.1.1
//! (`tests/opensandbox/sdk_vault.py`, after upstream's test_credential_vault_e2e.py): every
//! auth type injected by the sandbox's egress proxy into requests to a TLS server of the
//! test's (its CA given to the daemon with `--egress-upstream-ca`) and a plain-HTTP one,
//! runtime replacement, sanitized state, 404/409 answers. Then the secrets are looked for in
//! the daemon's log, the audit log and every span: none there.

use std::process::{Command, Stdio};

use agentrun_e2e::osb::*;
use agentrun_e2e::otlp::OtlpReceiver;
use agentrun_e2e::tls_server::{certs, dir_text, Server};
use agentrun_e2e::*;

/// Answers every GET with JSON: the case (first path segment) and the SHA-256 of each auth
/// header it got. argv: TLS port, plain port, cert, key.
const SERVER: &str = r#"
import hashlib, http.server, json, ssl, sys, threading
AUTH = ("authorization", "x-api-key", "x-client-id", "x-client-secret")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        got = {k.lower(): hashlib.sha256(v.encode()).hexdigest()
               for k, v in self.headers.items() if k.lower() in AUTH}
        body = json.dumps({"case": self.path.strip("/").split("/")[0], "headers": got}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
tls = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[3], sys.argv[4])
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
plain = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), H)
threading.Thread(target=plain.serve_forever, daemon=True).start()
tls.serve_forever()
"#;

#[test]
fn sdk_credential_vault_injects_every_auth_type_and_leaks_nothing() {
    let Some(_lock) = setup() else { return };
    let dir = tempdir();
    let d = dir.path();
    certs(d, "IP:127.0.0.1");
    let (tls, plain) = (free_port(), free_port());
    let mut cmd = Command::new("python3");
    cmd.args(["-c", SERVER, &tls.to_string(), &plain.to_string()])
        .arg(d.join("server.pem"))
        .arg(d.join("server.key"))
        .stdout(Stdio::null());
    let _servers = Server::start(cmd, &[tls, plain]);

    let audit = tempdir();
    let rx = OtlpReceiver::grpc();
    let mut env: Vec<(&str, String)> = rx.otel_env();
    env.push(("AGENTRUN_AUDIT_DIR", audit.path().display().to_string()));
    let ca = d.join("ca.pem").display().to_string();
    let (daemon, domain) = start(&env, &["--egress-upstream-ca", &ca]);
    let nonce = format!("{}x{}", std::process::id(), tls);
    let vault_env = [
        ("VAULT_TLS_PORT", tls.to_string()),
        ("VAULT_HTTP_PORT", plain.to_string()),
        ("VAULT_NONCE", nonce.clone()),
    ];
    let out = scenario(&daemon, &domain, "vault:vault", &vault_env);
    let sid = printed(&out, "SANDBOX").to_string();
    scenario(&daemon, &domain, "vault:without_proxy", &vault_env);
    let log = daemon.log();
    stop_clean(daemon);

    // The scenario's secrets all carry the nonce (basic-token is upstream's fixed
    // dXNlcjpwYXNz: looked for too).
    let secrets = [nonce.as_str(), "dXNlcjpwYXNz", "raw-secret-in-a-bad-body"];
    let audit_text = dir_text(audit.path());
    // The daemon exported its spans before it exited.
    let spans = rx.spans();
    assert!(!spans.is_empty(), "no spans");
    let span_text = format!("{spans:?}");
    for s in secrets {
        assert!(!log.contains(s), "{s} in the daemon's log");
        assert!(!audit_text.contains(s), "{s} in the audit log");
        assert!(!span_text.contains(s), "{s} in a span");
    }
    // Each injection recorded, with the binding as the rule.
    for binding in [
        "bearer",
        "basic",
        "api-key",
        "custom-headers",
        "plain-bearer",
    ] {
        assert!(
            audit_text.contains(&format!("credentialVault.bindings[{binding}]")),
            "no injection record for {binding}: {audit_text}"
        );
    }
    assert!(audit_text.contains(&sid));
    assert!(
        audit_text.contains("credential_vault.create"),
        "{audit_text}"
    );
    assert!(
        span_text.contains("credential injected: GET /bearer"),
        "no policy.check span for an injection"
    );
}
