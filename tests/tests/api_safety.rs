//! Nobody reaches `agentrun serve`'s HTTP listeners without being let in (issue 29), tried
//! as an attacker would, through the real binary:
//!
//! - another local user (`setpriv --reuid 65534`, curl): no key flag given, the API still
//!   needs the key `serve` made in its state dir (401), and that user cannot read the key
//!   file (mode 0600); a second start reuses the key; a key file that is a symlink, readable
//!   by others, another user's, empty or garbage stops `serve` with one line;
//! - a web page (curl with a foreign `Origin`, a `text/plain` body): 403 / 415, nothing
//!   created;
//! - a rebinding DNS name (a foreign `Host`): 403 on `--listen`, `--mcp` and `--metrics`;
//!   a name given with `--allowed-host` is answered.
//!
//! The sandbox's own answers through the proxies (no `Set-Cookie`, `CSP: sandbox`) are
//! checked by the `port_proxy` scenario (opensandbox.rs) and `proxy:sync`
//! (opensandbox_proxy.rs); the dashboard's CSRF token and login rate limit by dashboard.rs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::osb::{free_port, start, stop_clean};
use agentrun_e2e::*;

/// One HTTP/1.1 request to `addr`, `Connection: close`; status and body.
fn http(addr: &str, head: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = head.replace('\n', "\r\n");
    if !body.is_empty() {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {raw:?}"));
    (status, body.to_string())
}

const CREATE: &str = r#"{"image":{"uri":"host"},"entrypoint":["sleep","infinity"],"timeout":300,"resourceLimits":{}}"#;

/// `curl ARGS` as uid/gid 65534 with no groups: the output and whether it succeeded.
fn as_nobody(args: &[&str]) -> RunOutput {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .args(args);
    run_with_timeout(cmd, None, Duration::from_secs(30))
}

fn count_sandboxes(domain: &str, key: &str) -> u64 {
    let (status, body) = http(
        domain,
        &format!("GET /v1/sandboxes HTTP/1.1\nHost: {domain}\nOPEN-SANDBOX-API-KEY: {key}\n"),
        "",
    );
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["pagination"]["totalItems"].as_u64().unwrap()
}

/// Issue 29 point 3: as uid 65534, `GET /v1/sandboxes/{id}/endpoints/44772` returned the
/// execd token of a daemon started without `--api-key`. Now that daemon has a key, in a file
/// that user cannot read, and the lookup is a 401.
#[test]
fn another_local_user_gets_401_and_cannot_read_the_key() {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start(&[("AGENTRUN_API_KEY", String::new())], &[]);
    let key = d.api_key();
    let file = d.api_key_file();
    {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(&file).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o600, "{}", file.display());
        assert_eq!(m.uid(), 0);
    }
    // The owner makes a sandbox (with the key).
    let (status, body) = http(
        &domain,
        &format!(
            "POST /v1/sandboxes HTTP/1.1\nHost: {domain}\nOPEN-SANDBOX-API-KEY: {key}\n\
             Content-Type: application/json\n"
        ),
        CREATE,
    );
    assert_eq!(status, 202, "{body}\n{}", d.log());
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // Another user: no key file, no token, no dashboard.
    let cat = as_nobody(&["cat", file.to_str().unwrap()]);
    assert_ne!(cat.code(), 0, "uid 65534 read the key file: {cat}");
    assert!(!cat.stdout().contains(&key));
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(agentrun_bin())
        .arg("api-key")
        .env("AGENTRUN_STATE_DIR", d.state());
    let printed = run_with_timeout(cmd, None, Duration::from_secs(30));
    printed.assert_agentrun_error();
    assert!(
        printed.stderr().contains("not readable by this user") && !printed.stdout().contains(&key),
        "{printed}"
    );
    for path in [
        format!("/v1/sandboxes/{id}/endpoints/44772"),
        "/v1/sandboxes".to_string(),
        "/ui/api/snapshot".to_string(),
    ] {
        let out = as_nobody(&[
            "curl",
            "-sS",
            "-o",
            "/dev/stdout",
            "-w",
            "\nSTATUS %{http_code}",
            &format!("http://{domain}{path}"),
        ]);
        let text = out.stdout();
        assert!(text.ends_with("STATUS 401"), "{path}: {out}");
        assert!(!text.contains("X-EXECD-ACCESS-TOKEN"), "{path}: {out}");
    }
    let out = as_nobody(&[
        "curl",
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "--data",
        r#"{"command":"id"}"#,
        &format!("http://{domain}/v1/sandboxes/{id}/proxy/44772/command"),
    ]);
    assert_eq!(out.stdout(), "401", "{out}");
    stop_clean(d);
}

/// The key is made once and reused by later starts; a key file that cannot be trusted stops
/// `serve` with one line (exit 125) and is left as it is.
#[test]
fn the_key_file_is_reused_and_a_bad_one_refused() {
    let Some(_lock) = setup() else { return };
    let mut d = Daemon::unstarted().with_env("AGENTRUN_API_KEY", "");
    let addr = format!("127.0.0.1:{}", free_port());
    d.launch(["--pool-size", "1", "--listen", addr.as_str()]);
    let first = d.api_key();
    assert!(
        d.log().contains("api-key") && !d.log().contains(&first),
        "{}",
        d.log()
    );
    let out = d.terminate(Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{out}");
    d.launch(["--pool-size", "1", "--listen", addr.as_str()]);
    assert_eq!(d.api_key(), first, "a second start made a new key");
    // `agentrun api-key` prints it for the file's owner.
    let printed = d.agentrun(["api-key"]).run();
    assert_eq!(printed.success().trim(), first);
    let out = d.terminate(Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "{out}");

    let file = d.api_key_file();
    let serve = |d: &Daemon| {
        d.agentrun(["serve", "--pool-size", "1", "--listen", addr.as_str()])
            .timeout(Duration::from_secs(60))
            .run()
    };
    use std::os::unix::fs::PermissionsExt;
    let set_mode = |m: u32| {
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(m)).unwrap();
    };
    let make_bad = |what: &str| match what {
        "mode 0644" => set_mode(0o644),
        "mode 0640" => set_mode(0o640),
        "empty" => {
            std::os::unix::fs::chown(&file, Some(0), Some(0)).unwrap();
            std::fs::write(&file, "").unwrap();
            set_mode(0o600);
        }
        "owned by uid 65534" => {
            std::fs::write(&file, format!("{first}\n")).unwrap();
            set_mode(0o600);
            std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        }
        "URL-safe" => {
            std::fs::write(&file, "<script>not a key</script>\n").unwrap();
            set_mode(0o600);
        }
        _ => {
            let target = file.with_file_name("elsewhere");
            std::fs::write(&target, format!("{first}\n")).unwrap();
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
            let _ = std::fs::remove_file(&file);
            std::os::unix::fs::symlink(&target, &file).unwrap();
        }
    };
    for what in [
        "mode 0644",
        "mode 0640",
        "owned by uid 65534",
        "empty",
        "URL-safe",
        "symlink",
    ] {
        make_bad(what);
        let out = serve(&d);
        out.assert_agentrun_error();
        let err = out.stderr();
        assert!(
            err.contains(&file.display().to_string()) && err.contains(what),
            "{what}: {out}"
        );
        assert!(
            !d.socket().exists(),
            "{what}: a refused daemon left its socket"
        );
        // Left as it was (never replaced with a new key behind the user's back).
        assert!(std::fs::symlink_metadata(&file).is_ok(), "{what}");
        if what == "symlink" {
            std::fs::remove_file(&file).unwrap();
            std::fs::write(&file, format!("{first}\n")).unwrap();
            set_mode(0o600);
        }
    }
}

/// Issue 29 point 4: a web page's cross-site POST (`text/plain`, no preflight) created a
/// sandbox. Now a foreign `Origin` is a 403 and a body that is not `application/json` a
/// 415, even with the key, and nothing is created.
#[test]
fn cross_site_posts_are_refused_and_create_nothing() {
    let Some(_lock) = setup() else { return };
    let (d, domain) = start(&[("AGENTRUN_API_KEY", String::new())], &[]);
    let key = d.api_key();
    let post = |extra: &str| {
        http(
            &domain,
            &format!(
                "POST /v1/sandboxes HTTP/1.1\nHost: {domain}\nOPEN-SANDBOX-API-KEY: {key}\n{extra}"
            ),
            CREATE,
        )
    };
    for origin in [
        "http://evil.test",
        "null",
        "http://127.0.0.1:1",
        "https://localhost",
    ] {
        let (status, body) = post(&format!(
            "Origin: {origin}\nContent-Type: application/json\n"
        ));
        assert_eq!(status, 403, "{origin}: {body}");
        assert!(body.contains("ORIGIN_NOT_ALLOWED"), "{body}");
    }
    for ctype in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let (status, body) = post(&format!("Content-Type: {ctype}\n"));
        assert_eq!(status, 415, "{ctype}: {body}");
        assert!(body.contains("UNSUPPORTED_MEDIA_TYPE"), "{body}");
    }
    let (status, body) = post("");
    assert_eq!(status, 415, "no Content-Type: {body}");
    // A WebSocket from a page elsewhere (a GET with Upgrade) is checked as a state change.
    let (status, body) = http(
        &domain,
        &format!(
            "GET /v1/sandboxes HTTP/1.1\nHost: {domain}\nOPEN-SANDBOX-API-KEY: {key}\n\
             Origin: http://evil.test\nUpgrade: websocket\n"
        ),
        "",
    );
    assert_eq!(status, 403, "cross-site upgrade: {body}");
    assert_eq!(
        count_sandboxes(&domain, &key),
        0,
        "a refused request made a sandbox"
    );
    // The server's own origin (a browser on the dashboard) is served.
    let (status, body) = post(&format!(
        "Origin: http://{domain}\nContent-Type: application/json\n"
    ));
    assert_eq!(status, 202, "{body}");
    assert_eq!(count_sandboxes(&domain, &key), 1);
    stop_clean(d);
}

/// Issue 29 point 5: the OpenSandbox/dashboard listener answered any `Host` (DNS
/// rebinding). Now every listener refuses a name that is not its own (403), and answers one
/// given with `--allowed-host` (the E2B listener too).
#[test]
fn a_foreign_host_is_refused_on_every_listener() {
    let Some(_lock) = setup() else { return };
    let mcp = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{}", free_port());
    let e2b = format!("127.0.0.1:{}", free_port());
    let (d, domain) = start(
        &[("AGENTRUN_API_KEY", String::new())],
        &[
            "--mcp",
            mcp.as_str(),
            "--metrics",
            metrics.as_str(),
            "--e2b",
            e2b.as_str(),
            "--allowed-host",
            "agentrun.example.test",
        ],
    );
    let key = d.api_key();
    let port = |a: &str| a.rsplit(':').next().unwrap().to_string();
    for (addr, path, auth) in [
        (&domain, "/health", String::new()),
        (
            &domain,
            "/ui/api/snapshot",
            format!("OPEN-SANDBOX-API-KEY: {key}\n"),
        ),
        (
            &metrics,
            "/metrics",
            format!("Authorization: Bearer {key}\n"),
        ),
        (&e2b, "/v2/sandboxes", format!("X-API-Key: {key}\n")),
    ] {
        let p = port(addr);
        for host in [
            format!("rebind.evil.test:{p}"),
            "evil.test".into(),
            format!("10.9.8.7:{p}"),
        ] {
            let (status, body) = http(
                addr,
                &format!("GET {path} HTTP/1.1\nHost: {host}\n{auth}"),
                "",
            );
            assert_eq!(status, 403, "{addr}{path} Host {host}: {body}");
            assert!(body.contains("HOST_NOT_ALLOWED"), "{body}");
        }
        for host in [
            format!("localhost:{p}"),
            format!("127.0.0.1:{p}"),
            format!("[::1]:{p}"),
            format!("agentrun.example.test:{p}"),
        ] {
            let (status, body) = http(
                addr,
                &format!("GET {path} HTTP/1.1\nHost: {host}\n{auth}"),
                "",
            );
            assert_eq!(status, 200, "{addr}{path} Host {host}: {body}");
        }
    }
    // MCP: a foreign Host, and a foreign Origin on its POST, are refused before the key.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let mcp_head = |host: &str, extra: &str| {
        format!(
            "POST /mcp HTTP/1.1\nHost: {host}\nAuthorization: Bearer {key}\n\
             Content-Type: application/json\nAccept: application/json, text/event-stream\n{extra}"
        )
    };
    let (status, body) = http(
        &mcp,
        &mcp_head(&format!("rebind.evil.test:{}", port(&mcp)), ""),
        init,
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("HOST_NOT_ALLOWED"), "{body}");
    let (status, body) = http(&mcp, &mcp_head(&mcp, "Origin: http://evil.test\n"), init);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("ORIGIN_NOT_ALLOWED"), "{body}");
    let (status, body) = http(&mcp, &mcp_head(&mcp, ""), init);
    assert_eq!(status, 200, "{body}");
    stop_clean(d);
}
