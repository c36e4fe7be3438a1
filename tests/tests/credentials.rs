//! The credential vault through the real binary: `agentrun exec --credential` against a TLS
//! server on a private address inside a network namespace the test makes (its certificate
//! from a CA the test makes with `openssl`, given to the proxy with `--egress-upstream-ca`).
//! curl and Python `requests`/`httpx` in the sandbox reach it with the credential added by
//! the proxy; the sandbox dumps its environment, its processes' environments and command
//! lines and the files it was given: no secret. A path or host the credential is not bound
//! to gets nothing; a `Host` naming another host is refused (421). The audit log records
//! each injection and never the value. Root required.

use std::time::Duration;

use agentrun_e2e::tls_server::{
    bearer_server, certs, dir_text, in_namespaces, BEARER_SERVER as SERVER,
};
use agentrun_e2e::{agentrun, exec_with, setup, tempdir, workspace_root, RunOutput};
use serde_json::Value;

/// What runs in the sandbox: every client, then the dumps.
const CLIENT: &str = r#"
set +e
echo "curl: $(curl -sS https://10.77.0.2:8443/v1/curl)"
echo "curl-unbound-path: $(curl -sS https://10.77.0.2:8443/other)"
echo "curl-fronted: $(curl -sS -H 'Host: evil.example' https://10.77.0.2:8443/v1/x | head -c 200)"
echo "curl-unbound-host: $(curl -sS -k https://10.77.0.3:8443/v1/curl)"
python3 -c 'import requests; print("requests:", requests.get("https://10.77.0.2:8443/v1/requests").text.strip())'
python3 -c 'import httpx; print("httpx:", httpx.get("https://10.77.0.2:8443/v1/httpx").text.strip())'
echo "--- dumps"
env
cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n'
cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' ' '
ls -la /run/agentrun-egress/
echo "keys: $(cat /run/agentrun-egress/*.pem | grep -c 'PRIVATE KEY')"
python3 /dump/memdump.py /dump/out
true
"#;

/// Copies the readable memory of every process in the sandbox into files under argv[1] (the
/// test looks for the secret in them).
const MEMDUMP: &str = r#"
import os, re, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except OSError:
        continue
    with open(f"{out}/{pid}.mem", "wb") as f:
        for line in maps:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
            if not m or "[vvar]" in line:
                continue
            a, b = int(m.group(1), 16), int(m.group(2), 16)
            try:
                mem.seek(a)
                f.write(mem.read(min(b - a, 64 << 20)))
            except (OSError, ValueError, OverflowError):
                pass
print("memdump", len(os.listdir(out)))
"#;

/// The line of `out`'s stdout that starts with `prefix` (panics, with the output, if none).
fn line_of(out: &RunOutput, prefix: &str) -> String {
    out.stdout()
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} line: {out}"))
        .to_string()
}

#[test]
fn a_credential_reaches_its_host_and_never_the_sandbox() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let audit = tempdir();
    let d = dir.path();
    certs(d, "IP:10.77.0.2,IP:10.77.0.3");
    std::fs::write(d.join("server.py"), SERVER).unwrap();
    let dump = d.join("dump");
    std::fs::create_dir_all(&dump).unwrap();
    std::fs::write(dump.join("memdump.py"), MEMDUMP).unwrap();
    let secret = format!(
        "e2e-secret-{}-{}",
        std::process::id(),
        d.display().to_string().len() * 7919
    );
    let site = workspace_root().join(".venv/test/lib/python3.11/site-packages");
    assert!(
        site.join("httpx").is_dir() && site.join("requests").is_dir(),
        "{} lacks requests/httpx: hack/test installs them",
        site.display()
    );
    // Two servers on private addresses that exist only in the test's namespace (bounded:
    // they exit after two minutes whatever happens).
    let setup_sh = format!(
        "ip link set lo up\nip addr add 10.77.0.2/32 dev lo\nip addr add 10.77.0.3/32 dev lo\n\
         cd '{d}'\n\
         E2E_SECRET='{secret}' timeout 120 python3 server.py 10.77.0.2 8443 server.pem server.key &\n\
         s1=$!\n\
         E2E_SECRET='{secret}' timeout 120 python3 server.py 10.77.0.3 8443 server.pem server.key &\n\
         s2=$!\n\
         for a in 10.77.0.2 10.77.0.3; do for i in $(seq 100); do python3 -c \"import socket; socket.create_connection(('$a', 8443), 1)\" 2>/dev/null && break; sleep 0.1; done; done",
        d = d.display()
    );
    let a = exec_with(
        [
            "--credential".to_string(),
            "vault-key@10.77.0.2:8443/v1=env:AGENTRUN_E2E_SECRET".into(),
            "--egress-upstream-ca".into(),
            d.join("ca.pem").display().to_string(),
            "--allow-host".into(),
            "10.77.0.3:8443".into(),
            "--ro".into(),
            format!("{}:/opt/site", site.display()),
            "-e".into(),
            "PYTHONPATH=/opt/site".into(),
            "--rw".into(),
            format!("{}:/dump", dump.display()),
        ],
        ["sh", "-c", CLIENT],
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .env("AGENTRUN_AUDIT_DIR", audit.path())
    .env("AGENTRUN_E2E_SECRET", &secret);
    let out = in_namespaces(a, true, &setup_sh, "kill $s1 $s2; wait");
    let stdout = out.success();
    let line = |prefix: &str| line_of(&out, prefix);
    assert_eq!(line("curl:"), "curl: auth=ok path=/v1/curl", "{out}");
    assert_eq!(
        line("requests:"),
        "requests: auth=ok path=/v1/requests",
        "{out}"
    );
    assert_eq!(line("httpx:"), "httpx: auth=ok path=/v1/httpx", "{out}");
    assert_eq!(
        line("curl-unbound-path:"),
        "curl-unbound-path: auth=missing path=/other",
        "{out}"
    );
    assert_eq!(
        line("curl-unbound-host:"),
        "curl-unbound-host: auth=missing path=/v1/curl",
        "{out}"
    );
    assert!(
        line("curl-fronted:").contains("is not 10.77.0.2:8443"),
        "{out}"
    );
    // The sandbox's view: the trust environment and the CA certificate, no key, no secret.
    assert!(
        stdout.contains("SSL_CERT_FILE=/run/agentrun-egress/ca-bundle.pem"),
        "{out}"
    );
    assert!(stdout.contains("ca.pem"), "{out}");
    assert_eq!(
        line("keys:"),
        "keys: 0",
        "a private key in the sandbox's files: {out}"
    );
    assert!(
        !stdout.contains(&secret),
        "the secret reached the sandbox: {out}"
    );
    assert!(!out.stderr().contains(&secret), "{out}");
    // The audit log: each injection recorded (rule: the binding), the secret nowhere.
    let log = agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", audit.path())
        .run();
    let text = log.success();
    assert!(!text.contains(&secret), "{text}");
    let records: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let injected: Vec<&str> = records
        .iter()
        .filter(|r| r["rule"] == "cli.credential[0]")
        .map(|r| r["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        injected,
        [
            "credential injected: GET /v1/curl",
            "credential injected: GET /v1/requests",
            "credential injected: GET /v1/httpx"
        ],
        "{text}"
    );
    assert!(!dir_text(audit.path()).contains(&secret));
}

/// What runs in the sandbox for the system-bundle test: clients that ignore the trust
/// environment (`env -i`: only the proxy's address is passed on, no `SSL_CERT_FILE` and the
/// like), which read the image's own bundle: Python's `urllib` with its default context
/// (OpenSSL's default paths) and curl (built with the system bundle, `--cacert` unset).
const NO_TRUST_ENV: &str = r#"
set +e
ne() { env -i HTTPS_PROXY="$HTTPS_PROXY" PATH=/usr/bin:/bin "$@"; }
echo "urllib: $(ne python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode().strip())' "$URL/urllib" 2>&1 | tail -1)"
echo "curl: $(ne curl -sS "$URL/curl" 2>&1)"
echo "env: $(ne env | grep -c -e SSL_CERT -e CA_BUNDLE -e CA_CERTS)"
echo "h2: $(curl -sS --http2 -o /dev/null -w '%{http_version}' "$URL/h2")"
echo "node: $NODE_USE_ENV_PROXY"
if command -v node >/dev/null; then node -e "$NODE_CONNECT"; else echo "node-connect: no node"; fi
echo "keys: $(grep -c 'PRIVATE KEY' /etc/ssl/certs/ca-certificates.crt)"
echo "capath-python: $(ne python3 -c "$CAPATH_PY" "$URL/capath" 2>&1 | tail -1)"
host=${URL#https://}; host=${host%%/*}
echo "capath-s_client: $(printf 'GET /v1/s_client HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$host" \
  | ne openssl s_client -quiet -verify_return_error -no-CAfile -no-CAstore -CApath /etc/ssl/certs \
    -verify_ip 127.0.0.1 -proxy "${HTTPS_PROXY#http://}" -connect "$host" 2>&1 | grep -e '^auth=' -e error | head -1)"
"#;

/// Python with a context that trusts only OpenSSL's hashed directory (`capath`: the CA is
/// looked up there by its subject hash; no bundle file is read).
const CAPATH_PY: &str = r#"
import ssl, sys, urllib.request
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.load_verify_locations(capath="/etc/ssl/certs")
print(urllib.request.urlopen(sys.argv[1], context=ctx).read().decode().strip())
"#;

/// Node 20's `fetch` ignores `HTTPS_PROXY` (docs/credentials.md#node); its `http` CONNECT
/// plus `tls.connect` through the proxy works, trusting the CA through
/// `NODE_EXTRA_CA_CERTS`: what an agent on an older Node can do without packages.
const NODE_CONNECT: &str = r#"
const http = require("http"), tls = require("tls");
const u = new URL(process.env.URL + "/node"), p = new URL(process.env.HTTPS_PROXY);
http.request({ host: p.hostname, port: p.port, method: "CONNECT", path: u.host })
  .on("connect", (res, socket) => {
    const t = tls.connect({ socket, host: u.hostname }, () =>
      t.write(`GET ${u.pathname} HTTP/1.1\r\nHost: ${u.host}\r\nConnection: close\r\n\r\n`));
    let d = "";
    t.on("data", (c) => (d += c));
    t.on("end", () => console.log("node-connect: " + d.split("\r\n\r\n")[1].trim()));
    t.on("error", (e) => console.log("node-connect: error " + (e.code || e.message)));
  })
  .on("error", (e) => console.log("node-connect: error " + e.message))
  .end();
"#;

/// The interception CA is in the image's system bundle as the run sees it (its cell's
/// writable layer), so clients that ignore `SSL_CERT_FILE` & co. reach the credential's host
/// with it added: on the cold path and through the daemon's pool. The image is not changed:
/// a run without a credential sees the bundle without the CA.
#[test]
fn clients_that_ignore_the_trust_environment_trust_the_system_bundle() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let d = dir.path();
    certs(d, "IP:127.0.0.1");
    let secret = format!("sysbundle-secret-{}", std::process::id());
    let (port, server) = bearer_server(d, &secret);
    let url = format!("https://127.0.0.1:{port}/v1");
    let opts = [
        "--credential".to_string(),
        format!("k@127.0.0.1:{port}/v1=env:AGENTRUN_E2E_SECRET"),
        "--egress-upstream-ca".into(),
        d.join("ca.pem").display().to_string(),
        "-e".into(),
        format!("URL={url}"),
        "-e".into(),
        format!("NODE_CONNECT={NODE_CONNECT}"),
        "-e".into(),
        format!("CAPATH_PY={CAPATH_PY}"),
    ];
    let check = |out: &RunOutput, how: &str| {
        out.success();
        let line = |prefix: &str| line_of(out, prefix);
        assert_eq!(
            line("urllib:"),
            "urllib: auth=ok path=/v1/urllib",
            "{how}: {out}"
        );
        assert_eq!(line("curl:"), "curl: auth=ok path=/v1/curl", "{how}: {out}");
        assert_eq!(line("env:"), "env: 0", "{how}: {out}");
        // curl --http2 offers h2 and http/1.1: the proxy picks HTTP/1 (the test server
        // answers HTTP/1.0, which curl shows as "1").
        assert!(line("h2:").starts_with("h2: 1"), "{how}: {out}");
        assert_eq!(line("node:"), "node: 1", "{how}: {out}");
        // hack/test installs nodejs: a missing node fails here, never skips.
        assert_eq!(
            line("node-connect:"),
            "node-connect: auth=ok path=/v1/node",
            "{how}: {out}"
        );
        assert_eq!(line("keys:"), "keys: 0", "{how}: {out}");
        // OpenSSL's hashed directory (-CApath / capath) holds the CA under its subject hash.
        assert_eq!(
            line("capath-python:"),
            "capath-python: auth=ok path=/v1/capath",
            "{how}: {out}"
        );
        assert_eq!(
            line("capath-s_client:"),
            "capath-s_client: auth=ok path=/v1/s_client",
            "{how}: {out}"
        );
        assert!(!out.stdout().contains(&secret), "{how}: {out}");
    };
    let cold = exec_with(opts.clone(), ["sh", "-c", NO_TRUST_ENV])
        .env("AGENTRUN_NO_DAEMON", "1")
        .env("AGENTRUN_E2E_SECRET", &secret)
        .run();
    check(&cold, "cold");
    let daemon = agentrun_e2e::Daemon::start(1);
    let warm = daemon
        .exec_with(opts.clone(), ["sh", "-c", NO_TRUST_ENV])
        .env("AGENTRUN_E2E_SECRET", &secret)
        .run();
    check(&warm, "through the daemon");
    // The same pooled image without a credential: its bundle has no agentrun CA, its
    // hashed directory no file of ours.
    let plain = daemon
        .exec_with(
            ["--allow-host".to_string(), format!("127.0.0.1:{port}")],
            [
                "sh",
                "-c",
                "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt; \
                 ls -A /etc/ssl/certs | wc -l",
            ],
        )
        .run();
    let host_count = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt")
        .unwrap()
        .matches("BEGIN CERTIFICATE")
        .count();
    let host_files = std::fs::read_dir("/etc/ssl/certs").unwrap().count();
    assert_eq!(
        plain.success().split_whitespace().collect::<Vec<_>>(),
        [host_count.to_string(), host_files.to_string()],
        "{plain}"
    );
    drop(server);
}

/// Node's own `fetch` in the sandbox: Node 20 ignores the proxy variables (fails closed);
/// with agentrun's preload (`NODE_OPTIONS=--require=/run/agentrun-egress/node-proxy.cjs`) it
/// goes through the proxy: the credential is added, and a host the sandbox may not reach is
/// still refused by the proxy (403).
const NODE_FETCH: &str = r#"
const show = (label, url) =>
  fetch(url).then((r) => r.text()).then(
    (t) => console.log(label + ": " + t.trim()),
    (e) => console.log(label + ": error " + (e.cause ? `${e.cause.code} ${e.cause.message}` : e.message)));
(async () => {
  await show("fetch", process.env.URL + "/fetch");
  await show("fetch-again", process.env.URL + "/again");
  await show("fetch-unlisted", process.env.UNLISTED);
})();
"#;

#[test]
fn node_fetch_goes_through_the_proxy_with_the_preload() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let d = dir.path();
    certs(d, "IP:127.0.0.1");
    let secret = format!("node-preload-secret-{}", std::process::id());
    let (port, server) = bearer_server(d, &secret);
    let (unlisted_port, unlisted) = bearer_server(d, &secret);
    let script = "echo \"node: $(node --version)\"; \
        echo \"plain: $(node -e \"$NODE_FETCH\" | grep '^fetch:')\"; \
        NODE_OPTIONS=--require=/run/agentrun-egress/node-proxy.cjs node -e \"$NODE_FETCH\"";
    let out = exec_with(
        [
            "--credential".to_string(),
            format!("k@127.0.0.1:{port}/v1=env:AGENTRUN_E2E_SECRET"),
            "--egress-upstream-ca".into(),
            d.join("ca.pem").display().to_string(),
            "-e".into(),
            format!("URL=https://127.0.0.1:{port}/v1"),
            "-e".into(),
            format!("UNLISTED=https://127.0.0.1:{unlisted_port}/v1/x"),
            "-e".into(),
            format!("NODE_FETCH={NODE_FETCH}"),
        ],
        ["sh", "-c", script],
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .env("AGENTRUN_E2E_SECRET", &secret)
    .run();
    out.success();
    // hack/test installs Debian's nodejs (20): the version whose fetch ignores the variables.
    assert!(line_of(&out, "node:").starts_with("node: v20."), "{out}");
    assert!(
        line_of(&out, "plain:").starts_with("plain: fetch: error"),
        "{out}"
    );
    assert_eq!(
        line_of(&out, "fetch:"),
        "fetch: auth=ok path=/v1/fetch",
        "{out}"
    );
    assert_eq!(
        line_of(&out, "fetch-again:"),
        "fetch-again: auth=ok path=/v1/again",
        "{out}"
    );
    let refused = line_of(&out, "fetch-unlisted:");
    assert!(
        refused.starts_with("fetch-unlisted: error") && refused.contains("403"),
        "{out}"
    );
    assert!(!out.stdout().contains(&secret), "{out}");
    drop((server, unlisted));
}

/// Java in the sandbox: `HttpClient` and `HttpURLConnection`, with the environment agentrun
/// gives an intercepting sandbox (`JAVA_TOOL_OPTIONS`: the proxy, and the PKCS#12 trust store
/// the proxy wrote), reach the credential's host with it added.
const JAVA_FETCH: &str = r#"
import java.net.URI;
import java.net.http.*;
public class Fetch {
  public static void main(String[] a) throws Exception {
    try {
      var r = HttpClient.newHttpClient().send(
          HttpRequest.newBuilder(URI.create(a[0] + "/httpclient")).build(),
          HttpResponse.BodyHandlers.ofString());
      System.out.println("java-httpclient: " + r.body().trim());
    } catch (Exception e) { System.out.println("java-httpclient: error " + e); }
    try {
      var u = (java.net.HttpURLConnection) new java.net.URL(a[0] + "/urlconnection").openConnection();
      System.out.println("java-urlconnection: " + new String(u.getInputStream().readAllBytes()).trim());
    } catch (Exception e) { System.out.println("java-urlconnection: error " + e); }
  }
}
"#;

#[test]
fn java_trusts_the_ca_and_uses_the_proxy() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let d = dir.path();
    certs(d, "IP:127.0.0.1");
    let secret = format!("java-secret-{}", std::process::id());
    let (port, server) = bearer_server(d, &secret);
    let out = exec_with(
        [
            "--credential".to_string(),
            format!("k@127.0.0.1:{port}/v1=env:AGENTRUN_E2E_SECRET"),
            "--egress-upstream-ca".into(),
            d.join("ca.pem").display().to_string(),
            "-e".into(),
            format!("URL=https://127.0.0.1:{port}/v1"),
            "-e".into(),
            format!("JAVA_FETCH={JAVA_FETCH}"),
        ],
        [
            "sh",
            "-c",
            "mkdir -p /tmp/j && printf '%s' \"$JAVA_FETCH\" > /tmp/j/Fetch.java && \
             java /tmp/j/Fetch.java \"$URL\"",
        ],
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .env("AGENTRUN_E2E_SECRET", &secret)
    .run();
    out.success();
    // hack/test's host has a JDK (17): a missing java fails here, never skips.
    assert_eq!(
        line_of(&out, "java-httpclient:"),
        "java-httpclient: auth=ok path=/v1/httpclient",
        "{out}"
    );
    assert_eq!(
        line_of(&out, "java-urlconnection:"),
        "java-urlconnection: auth=ok path=/v1/urlconnection",
        "{out}"
    );
    assert!(!out.stdout().contains(&secret), "{out}");
    drop(server);
}

/// Bad `--credential` input: one line, non-zero exit, nothing run.
#[test]
fn bad_credential_specs_are_refused() {
    let Some(_l) = setup() else { return };
    for (spec, says) in [
        ("k@h.example=plain", "env:VAR or file:PATH"),
        (
            "k@h.example=env:AGENTRUN_E2E_UNSET_VAR",
            "AGENTRUN_E2E_UNSET_VAR",
        ),
        ("wat=x:k@h.example=env:HOME", "is not bearer, basic"),
    ] {
        let out = exec_with(["--credential", spec], ["true"])
            .env("AGENTRUN_NO_DAEMON", "1")
            .run();
        out.assert_agentrun_error();
        assert!(out.stderr().contains(says), "{spec}: {out}");
    }
}

/// A profile's HTTP rules decide each request to their host inside intercepted TLS: an
/// allowed GET reaches the server, a DELETE the deny rule names and a POST an escalate rule
/// names (no terminal: denied "needs approval") are answered 403 by the proxy; each decision
/// is an audit record and a `policy.check` span (`net.http`, `METHOD host:port/path`).
#[test]
fn http_rules_decide_each_request_with_spans_and_audit() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let audit = tempdir();
    let d = dir.path();
    // On the host's loopback (no network namespace: the run's spans must reach the test's
    // OTLP receiver), a literal address the profile names.
    certs(d, "IP:127.0.0.1");
    let (port, server) = bearer_server(d, "unused");
    std::fs::write(
        d.join("l7.toml"),
        format!(
            "name = \"l7\"\n[network]\nmode = \"allowlist\"\nallow = [\"127.0.0.1:{port}\"]\n\
         http_deny = [\"DELETE 127.0.0.1/v1/\"]\nhttp_allow = [\"GET 127.0.0.1/v1/\"]\n\
         http_escalate = [\"POST 127.0.0.1/v1/\"]\n"
        ),
    )
    .unwrap();
    let rx = agentrun_e2e::otlp::OtlpReceiver::grpc();
    let client = format!(
        "set +e\n\
        echo \"get: $(curl -sS https://127.0.0.1:{port}/v1/items)\"\n\
        echo \"delete: $(curl -sS -X DELETE https://127.0.0.1:{port}/v1/items/3)\"\n\
        echo \"post: $(curl -sS -X POST -d x=1 https://127.0.0.1:{port}/v1/items)\"\n\
        echo \"other: $(curl -sS https://127.0.0.1:{port}/admin)\"\n"
    );
    let mut a = exec_with(
        [
            "--profile".to_string(),
            d.join("l7.toml").display().to_string(),
            "--egress-upstream-ca".into(),
            d.join("ca.pem").display().to_string(),
            "--no-prompt".into(),
        ],
        ["sh", "-c", client.as_str()],
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .env("AGENTRUN_AUDIT_DIR", audit.path());
    for (k, v) in rx.otel_env() {
        a = a.env(k, v);
    }
    let out = a.run();
    drop(server);
    out.success();
    let line = |prefix: &str| line_of(&out, prefix);
    assert_eq!(line("get:"), "get: auth=missing path=/v1/items", "{out}");
    assert!(
        line("delete:").contains("denied by rule network.http_deny[0]"),
        "{out}"
    );
    assert!(line("post:").contains("needs approval"), "{out}");
    assert!(
        line("other:").contains("denied by rule network.http_default"),
        "{out}"
    );
    let log = agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", audit.path())
        .run();
    let records: Vec<Value> = log
        .success()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let http: Vec<String> = records
        .iter()
        .filter(|r| r["action"] == "net.http")
        .map(|r| {
            format!(
                "{} {} {}",
                r["decision"].as_str().unwrap(),
                r["resource"].as_str().unwrap(),
                r["rule"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        http,
        [
            format!("allow GET 127.0.0.1:{port}/v1/items network.http_allow[0]"),
            format!("deny DELETE 127.0.0.1:{port}/v1/items/3 network.http_deny[0]"),
            format!("escalate POST 127.0.0.1:{port}/v1/items network.http_escalate[0]"),
            format!("deny GET 127.0.0.1:{port}/admin network.http_default"),
        ],
        "{records:#?}"
    );
    let spans = rx.wait_for_spans(1, Duration::from_secs(10));
    let checks: Vec<String> = spans
        .iter()
        .filter(|s| s.name == "policy.check" && s.attr("sandbox.action") == "net.http")
        .map(|s| {
            format!(
                "{} {}",
                s.attr("sandbox.decision"),
                s.attr("sandbox.rule_id")
            )
        })
        .collect();
    assert_eq!(
        checks,
        [
            "allow network.http_allow[0]",
            "deny network.http_deny[0]",
            "escalate network.http_escalate[0]",
            "deny network.http_default",
        ],
        "{spans:#?}"
    );
}

/// `agentrun mcp --credential`: a session's `run_python` reaches the TLS server with the
/// credential added (tests/mcp/sdk_client.py `credential`, which also dumps the sandbox's
/// environment: no secret); the injection is audited, the secret nowhere in the audit.
#[test]
fn mcp_sessions_get_credentials_too() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let d = dir.path();
    certs(d, "IP:127.0.0.1");
    let secret = format!("mcp-e2e-secret-{}", std::process::id());
    let (port, server) = bearer_server(d, &secret);
    let env = agentrun_e2e::mcp::McpEnv::new();
    let cred = format!("k@127.0.0.1:{port}/v1=env:MCP_E2E_SECRET");
    let ca = d.join("ca.pem").display().to_string();
    let out = env.run_with(
        agentrun_e2e::mcp::SDK,
        "credential",
        &[
            "--profile",
            "code-interpreter",
            "--credential",
            &cred,
            "--egress-upstream-ca",
            &ca,
        ],
        &[
            ("MCP_E2E_SECRET", secret.clone()),
            ("VAULT_URL", format!("https://127.0.0.1:{port}/v1/mcp")),
        ],
    );
    drop(server);
    assert!(!out.contains(&secret), "{out}");
    let records = env.audit_records();
    let text = format!("{records:?}");
    assert!(!text.contains(&secret), "the secret in the audit log");
    assert!(
        records.iter().any(|r| r["rule"] == "cli.credential[0]"
            && r["reason"] == "credential injected: GET /v1/mcp"),
        "no injection record: {records:#?}"
    );
}

/// `[network] credentials` in a profile file: the value read by the `agentrun exec` that
/// loads the profile (its environment), the host allowed by the profile's rule
/// `network.credentials[0]`, which names the injection in the audit log. A value written in
/// the profile is refused: one line, non-zero exit, the value not repeated.
#[test]
fn a_profile_names_credentials_never_their_values() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let audit = tempdir();
    let d = dir.path();
    certs(d, "IP:127.0.0.1");
    let secret = format!("profile-secret-{}", std::process::id());
    let (port, server) = bearer_server(d, &secret);
    let profile = d.join("vault.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"vault\"\n[network]\nmode = \"allowlist\"\n\
             credentials = [\"k@127.0.0.1:{port}/v1=env:AGENTRUN_E2E_SECRET\"]\n"
        ),
    )
    .unwrap();
    let url = format!("https://127.0.0.1:{port}");
    let client =
        format!("echo \"in: $(curl -sS {url}/v1/profile)\"; echo \"out: $(curl -sS {url}/other)\"");
    let out = exec_with(
        [
            "--profile".to_string(),
            profile.display().to_string(),
            "--egress-upstream-ca".into(),
            d.join("ca.pem").display().to_string(),
        ],
        ["sh", "-c", client.as_str()],
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .env("AGENTRUN_AUDIT_DIR", audit.path())
    .env("AGENTRUN_E2E_SECRET", &secret)
    .run();
    drop(server);
    out.success();
    assert_eq!(
        line_of(&out, "in:"),
        "in: auth=ok path=/v1/profile",
        "{out}"
    );
    assert_eq!(
        line_of(&out, "out:"),
        "out: auth=missing path=/other",
        "{out}"
    );
    let log = agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", audit.path())
        .run();
    let text = log.success();
    assert!(!text.contains(&secret), "{text}");
    assert!(
        text.lines().any(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            r["rule"] == "network.credentials[0]"
                && r["reason"] == "credential injected: GET /v1/profile"
        }),
        "{text}"
    );

    // The value itself in the profile: refused before anything runs.
    std::fs::write(
        &profile,
        "[network]\nmode = \"allowlist\"\ncredentials = [\"k@api.example.com=sk-inline-value-42\"]\n",
    )
    .unwrap();
    let out = exec_with(
        ["--profile".to_string(), profile.display().to_string()],
        ["true"],
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .run();
    out.assert_agentrun_error();
    assert!(out.stderr().contains("network.credentials"), "{out}");
    assert!(out.stderr().contains("env:VAR or file:PATH"), "{out}");
    assert!(!out.stderr().contains("sk-inline-value-42"), "{out}");
}

/// `agentrun serve --mcp --mcp-credential`: the daemon reads the value from its own
/// environment; a session's sandbox reaches the TLS server with it added, also from a client
/// that ignores the trust environment (tests/mcp/sdk_client.py `credential` over HTTP); the
/// injection is audited, the secret nowhere in the audit or the client's output.
#[test]
fn serve_mcp_sessions_get_the_daemons_credentials() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let d = dir.path();
    certs(d, "IP:127.0.0.1");
    let secret = format!("serve-mcp-secret-{}", std::process::id());
    let (port, server) = bearer_server(d, &secret);
    let env = agentrun_e2e::mcp::McpEnv::new();
    let key = "k-vault-e2e";
    let cred = format!("k@127.0.0.1:{port}/v1=env:MCP_E2E_SECRET");
    let ca = d.join("ca.pem").display().to_string();
    // The value reaches the daemon through its own environment.
    let (daemon, url) = agentrun_e2e::mcp::serve_http_with(
        &env,
        key,
        &[
            "--mcp-profile",
            "code-interpreter",
            "--mcp-credential",
            &cred,
            "--egress-upstream-ca",
            &ca,
        ],
        &[("MCP_E2E_SECRET", secret.as_str())],
    );
    let mut cmd = env.command(agentrun_e2e::mcp::SDK, "credential", &[]);
    cmd.env("MCP_URL", &url)
        .env("MCP_API_KEY", key)
        .env("AGENTRUN_STATE_DIR", daemon.state())
        .env("MCP_E2E_SECRET", &secret)
        .env("VAULT_URL", format!("https://127.0.0.1:{port}/v1/mcp"));
    let out = agentrun_e2e::run_with_timeout(cmd, None, agentrun_e2e::mcp::SCENARIO_TIMEOUT);
    drop(server);
    assert!(
        out.status.code() == Some(0) && out.stdout().contains("OK credential"),
        "credential scenario over serve --mcp failed\n{out}\n{}",
        daemon.log()
    );
    assert!(!out.stdout().contains(&secret), "{out}");
    let records = env.audit_records();
    assert!(
        !format!("{records:?}").contains(&secret),
        "the secret in the audit log"
    );
    assert!(
        records.iter().any(|r| r["rule"] == "cli.credential[0]"
            && r["reason"] == "credential injected: GET /v1/mcp"),
        "no injection record: {records:#?}"
    );
    assert!(
        !daemon.log().contains(&secret),
        "the secret in the daemon's log"
    );
    agentrun_e2e::osb::stop_clean(daemon);
}

/// `agentrun mcp --profile FILE` whose profile names a credential: the server reads the value
/// from its environment when it loads the profile; a session's sandbox reaches the TLS server
/// with it added (also without the trust environment), audited under the profile's rule.
#[test]
fn mcp_sessions_get_the_profiles_credentials() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let d = dir.path();
    certs(d, "IP:127.0.0.1");
    let secret = format!("mcp-profile-secret-{}", std::process::id());
    let (port, server) = bearer_server(d, &secret);
    let profile = d.join("mcp-vault.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"mcp-vault\"\n[network]\nmode = \"allowlist\"\n\
             credentials = [\"k@127.0.0.1:{port}/v1=env:MCP_E2E_SECRET\"]\n"
        ),
    )
    .unwrap();
    let env = agentrun_e2e::mcp::McpEnv::new();
    let ca = d.join("ca.pem").display().to_string();
    let profile_arg = profile.display().to_string();
    let out = env.run_with(
        agentrun_e2e::mcp::SDK,
        "credential",
        &["--profile", &profile_arg, "--egress-upstream-ca", &ca],
        &[
            ("MCP_E2E_SECRET", secret.clone()),
            ("VAULT_URL", format!("https://127.0.0.1:{port}/v1/mcp")),
        ],
    );
    drop(server);
    assert!(!out.contains(&secret), "{out}");
    let records = env.audit_records();
    assert!(
        !format!("{records:?}").contains(&secret),
        "the secret in the audit log"
    );
    assert!(
        records.iter().any(|r| r["rule"] == "network.credentials[0]"
            && r["reason"] == "credential injected: GET /v1/mcp"),
        "no injection record: {records:#?}"
    );
}
