//! The egress proxy against hostile names and hostile requests, through the real binary.
//!
//! Names are resolved by agentrun's real resolver (`getaddrinfo`), steered by the test with
//! an `/etc/hosts` and `/etc/resolv.conf` of its own, bind-mounted in a private mount
//! namespace (`unshare --mount`) around `agentrun exec`; a private address the proxy may
//! reach is made real with a network namespace whose loopback carries it. Requests are sent
//! by a sandboxed Python to the proxy's port as raw bytes. Every decision is checked in the
//! audit log (and, where the test can receive OTLP, as spans). Root required.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentrun_e2e::otlp::OtlpReceiver;
use agentrun_e2e::tls_server::in_namespaces;
use agentrun_e2e::{agentrun, exec_with, setup, tempdir, LoopbackServer};
use serde_json::Value;

/// A server on the host's loopback that keeps every byte each connection sent (until the
/// peer closes or is idle for 500 ms) and answers `200 ok`.
struct Recorder {
    port: u16,
    got: Arc<Mutex<Vec<String>>>,
    _server: LoopbackServer,
}

impl Recorder {
    fn start() -> Recorder {
        let got: Arc<Mutex<Vec<String>>> = Arc::default();
        let g = got.clone();
        let server = LoopbackServer::start(move |mut c| {
            c.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            let mut buf = [0u8; 8192];
            let mut req = Vec::new();
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&buf[..n]);
            }
            g.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&req).into_owned());
            let _ =
                c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        });
        Recorder {
            port: server.port,
            got,
            _server: server,
        }
    }

    fn requests(&self) -> Vec<String> {
        self.got.lock().unwrap().clone()
    }
}

/// Bind-mounts a hosts file and a resolv.conf (a nameserver nobody answers on: lookups of
/// other names fail at once) over the host's.
fn resolver_files(dir: &Path, hosts: &str) -> String {
    let h = dir.join("hosts");
    let r = dir.join("resolv.conf");
    std::fs::write(&h, format!("127.0.0.1 localhost\n{hosts}")).unwrap();
    std::fs::write(&r, "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n").unwrap();
    format!(
        "mount --bind '{}' /etc/hosts\nmount --bind '{}' /etc/resolv.conf",
        h.display(),
        r.display()
    )
}

fn audit_records(dir: &Path) -> Vec<Value> {
    let out = agentrun(["audit", "--json"])
        .env("AGENTRUN_AUDIT_DIR", dir)
        .run();
    out.success()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What a sandboxed Python prints for each URL: `CODE BODY` (one line).
const FETCH: &str = r#"
import sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        print(200, urllib.request.urlopen(url, timeout=20).read().decode().strip())
    except urllib.error.HTTPError as e:
        print(e.code, e.read().decode().strip())
"#;

#[test]
fn names_under_a_wildcard_never_reach_internal_addresses_and_dns_failures_are_errors() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let audit = tempdir();
    let rx = OtlpReceiver::grpc();
    let up = Recorder::start();
    let p = up.port;
    let mounts = resolver_files(
        dir.path(),
        "127.0.0.1 loop.wild.test\n169.254.169.254 metadata.wild.test\n10.0.0.7 private.wild.test\nfd00::7 ula.wild.test\n",
    );
    let urls = [
        format!("http://loop.wild.test:{p}/"),
        "http://metadata.wild.test/latest/meta-data/".into(),
        "http://private.wild.test/".into(),
        "http://ula.wild.test/".into(),
        "http://nosuch.wild.test/".into(),
        format!("http://127.0.0.1:{p}/named"),
    ];
    let mut args = vec!["python3".to_string(), "-c".into(), FETCH.into()];
    args.extend(urls.iter().cloned());
    let mut a = exec_with(
        [
            "--allow-host",
            "*.wild.test",
            "--allow-host",
            &format!("127.0.0.1:{p}"),
        ],
        args,
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .env("AGENTRUN_AUDIT_DIR", audit.path());
    for (k, v) in rx.otel_env() {
        a = a.env(k, v);
    }
    let out = in_namespaces(a, false, &mounts, "");
    let lines: Vec<String> = out.success().lines().map(String::from).collect();
    assert_eq!(lines.len(), 6, "{out}");
    for (line, ip) in lines[..4]
        .iter()
        .zip(["127.0.0.1", "169.254.169.254", "10.0.0.7", "fd00::7"])
    {
        assert!(
            line.starts_with("403 agentrun: ")
                && line.contains("denied by rule network.resolved_address")
                && line.contains(&format!("resolves to {ip}")),
            "{ip}: {out}"
        );
    }
    assert!(
        lines[4].starts_with("502 agentrun: nosuch.wild.test:80: cannot resolve nosuch.wild.test"),
        "{out}"
    );
    assert_eq!(lines[5], "200 ok", "{out}");
    let reqs = up.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert!(reqs[0].starts_with("GET /named HTTP/1.1\r\n"), "{reqs:?}");

    // Four denials, two allows (one of which failed: an error record, not a denial).
    let records = audit_records(audit.path());
    let summary: Vec<(String, String, String)> = records
        .iter()
        .filter(|r| r["kind"] != "run")
        .map(|r| {
            (
                r["kind"].as_str().unwrap().to_owned(),
                r["decision"].as_str().unwrap().to_owned(),
                r["rule"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let s = |k: &str, d: &str, r: &str| (k.to_owned(), d.to_owned(), r.to_owned());
    assert_eq!(
        summary,
        [
            s("decision", "deny", "network.resolved_address"),
            s("decision", "deny", "network.resolved_address"),
            s("decision", "deny", "network.resolved_address"),
            s("decision", "deny", "network.resolved_address"),
            s("decision", "allow", "cli.allow_host[0]"),
            s("error", "error", "cli.allow_host[0]"),
            s("decision", "allow", "cli.allow_host[1]"),
        ],
        "{records:#?}"
    );
    let error = &records[5];
    assert_eq!(error["resource"], "nosuch.wild.test:80");
    assert!(
        error["reason"]
            .as_str()
            .unwrap()
            .starts_with("cannot resolve nosuch.wild.test"),
        "{error}"
    );
    // Spans: the error is an `egress.connect` span with status Error; violations count 4.
    let spans = rx.wait_for_spans(8, Duration::from_secs(10));
    let exec = spans.iter().find(|s| s.name == "sandbox.exec").unwrap();
    assert_eq!(exec.typed_attr("sandbox.violation_count", "int"), "4");
    let errors: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "egress.connect")
        .collect();
    assert_eq!(errors.len(), 1, "{spans:#?}");
    let e = errors[0];
    assert_eq!(e.status_code, 2, "{e:?}");
    assert!(
        e.status_message
            .starts_with("cannot resolve nosuch.wild.test"),
        "{e:?}"
    );
    assert_eq!(e.attr("error.type"), "resolve");
    assert_eq!(e.attr("server.address"), "nosuch.wild.test");
    assert_eq!(e.parent_span_id, exec.span_id);
    assert_eq!(e.attr("sandbox.id"), exec.attr("sandbox.id"));
    let checks = spans.iter().filter(|s| s.name == "policy.check").count();
    assert_eq!(checks, 6, "{spans:#?}");
}

#[test]
fn a_private_address_is_reached_through_an_exact_name_only() {
    let Some(_l) = setup() else { return };
    let dir = tempdir();
    let audit = tempdir();
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("hello.txt"), "hello from 10.77.0.1\n").unwrap();
    let mut setup_sh = resolver_files(
        dir.path(),
        "10.77.0.1 svc.corp.test\n10.77.0.1 x.wild.test\n",
    );
    // The private address is real inside the test's network namespace, with a server on it
    // (bounded: it exits after a minute whatever happens).
    setup_sh.push_str(&format!(
        "\nip link set lo up\nip addr add 10.77.0.1/32 dev lo\n\
         timeout 60 python3 -m http.server --bind 10.77.0.1 8080 --directory '{}' >/dev/null 2>&1 &\n\
         srv=$!\n\
         for i in $(seq 100); do python3 -c \"import socket; socket.create_connection(('10.77.0.1', 8080), 1)\" 2>/dev/null && break; sleep 0.1; done",
        www.display()
    ));
    let mut args = vec!["python3".to_string(), "-c".into(), FETCH.into()];
    args.extend([
        "http://svc.corp.test:8080/hello.txt".to_string(),
        "http://x.wild.test:8080/hello.txt".into(),
        "http://10.77.0.1:8080/hello.txt".into(),
    ]);
    let a = exec_with(
        [
            "--allow-host",
            "svc.corp.test:8080",
            "--allow-host",
            "*.wild.test:8080",
        ],
        args.clone(),
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .env("AGENTRUN_AUDIT_DIR", audit.path());
    let out = in_namespaces(a, true, &setup_sh, "kill $srv; wait");
    let lines: Vec<String> = out.success().lines().map(String::from).collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[0], "200 hello from 10.77.0.1", "{out}");
    assert!(
        lines[1].starts_with("403 ")
            && lines[1].contains("network.resolved_address")
            && lines[1].contains("a private address"),
        "{out}"
    );
    assert!(
        lines[2].starts_with("403 ") && lines[2].contains("network.default"),
        "{out}"
    );
    // A rule naming the range lets the wildcard (and the address itself) through.
    let a = exec_with(
        [
            "--allow-host",
            "*.wild.test:8080",
            "--allow-host",
            "10.77.0.0/16:8080",
        ],
        args,
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .env("AGENTRUN_AUDIT_DIR", audit.path());
    let out = in_namespaces(a, true, &setup_sh, "kill $srv; wait");
    let lines: Vec<String> = out.success().lines().map(String::from).collect();
    assert!(
        lines[0].starts_with("403 ") && lines[0].contains("network.default"),
        "{out}"
    );
    assert_eq!(lines[1], "200 hello from 10.77.0.1", "{out}");
    assert_eq!(lines[2], "200 hello from 10.77.0.1", "{out}");
    let rules: Vec<String> = audit_records(audit.path())
        .iter()
        .filter(|r| r["kind"] == "decision")
        .map(|r| {
            format!(
                "{} {}",
                r["decision"].as_str().unwrap(),
                r["rule"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        rules,
        [
            "allow cli.allow_host[0]",
            "deny network.resolved_address",
            "deny network.default",
            "deny network.default",
            "allow cli.allow_host[0]",
            "allow cli.allow_host[1]",
        ]
    );
}

#[test]
fn hostile_requests_are_refused_and_nothing_after_a_body_reaches_the_upstream() {
    let Some(_l) = setup() else { return };
    let audit = tempdir();
    let up = Recorder::start();
    let a = format!("127.0.0.1:{}", up.port);
    let script = format!(
        r#"
import socket
A = "{a}"
def send(raw):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(raw.encode())
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
    print(out.split(b"\r\n", 1)[0].decode())
send(f"POST http://{{A}}/ HTTP/1.1\r\nHost: {{A}}\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX")
send(f"POST http://{{A}}/ HTTP/1.1\r\nHost: {{A}}\r\nContent-Length: 0\r\nContent-Length: 44\r\n\r\n")
send(f"GET http://{{A}}/ HTTP/1.1\r\nHost: {{A}}\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n")
send(f"GET http://{{A}}/ HTTP/1.1\nHost: {{A}}\n\n")
send(f"GET http://{{A}}/ HTTP/1.1\r\nHost: evil.example\r\n\r\n")
send(f"GET http://{{A}}/ HTTP/1.1\r\nHost: {{A}}\r\nX-Long: {{'a' * 20000}}\r\n\r\n")
send(f"POST http://{{A}}/ HTTP/1.1\r\nHost: {{A}}\r\nTransfer-Encoding: gzip\r\n\r\n")
send(f"GET http://evil.example@{{A}}/ HTTP/1.1\r\n\r\n")
send(f"POST http://{{A}}/up HTTP/1.1\r\nHost: {{A}}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET http://{{A}}/smuggled HTTP/1.1\r\nHost: {{A}}\r\n\r\n")
"#
    );
    let out = exec_with(
        ["--allow-host", a.as_str()],
        ["python3", "-c", script.as_str()],
    )
    .env("AGENTRUN_NO_DAEMON", "1")
    .env("AGENTRUN_AUDIT_DIR", audit.path())
    .run();
    let lines: Vec<String> = out.success().lines().map(String::from).collect();
    assert_eq!(
        lines,
        [
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 431 Request Header Fields Too Large",
            "HTTP/1.1 501 Not Implemented",
            "HTTP/1.1 400 Bad Request",
            "HTTP/1.1 200 OK",
        ],
        "{out}"
    );
    assert_eq!(
        up.requests(),
        [format!(
            "POST /up HTTP/1.1\r\nHost: {a}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        )]
    );
    // Refused heads decide nothing: one decision, for the one request.
    let decisions: Vec<Value> = audit_records(audit.path())
        .into_iter()
        .filter(|r| r["kind"] == "decision")
        .collect();
    assert_eq!(decisions.len(), 1, "{decisions:#?}");
}
