//! The web dashboard of `agentrun serve --listen` at `/ui`, end to end.
//!
//! In a real headless Chromium (Debian's `chromium` + `chromium-driver`, driven by selenium
//! from `.venv/ui`, both installed by `hack/test`; `tests/dashboard/ui_e2e.py`): the login
//! with the API key, then the page showing the pool; live update (a `sleep 20` run started
//! after the page loaded shows in the running table and leaves it, a few runs move runs/s
//! and the sparklines); the audit search filtered by decision, sandbox, rule, text, time and
//! kind, a run's trace link; a wrong key shows no data; a screenshot kept as a test
//! artifact (`target/test-artifacts/dashboard.png`).
//!
//! Over plain HTTP: the JSON endpoints need the key or a session (401), answer bad query
//! values with the API's 400 JSON error, carry the security headers, and with
//! `--insecure-no-auth` are open like the API; without a key given, the generated one is
//! needed. Login and logout need their CSRF token and the server's own origin (403), wrong
//! keys are rate limited per address (429), the cookie is `Secure` behind a TLS proxy.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use agentrun_e2e::osb::{free_port, stop_clean};
use agentrun_e2e::*;

const KEY: &str = "dash-key-5e3f";
/// Deadline of one browser scenario (Chromium start, 20 s waits, a debug daemon).
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(180);

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One HTTP/1.1 request (`Connection: close`), `headers` as `Name: value` lines.
fn request(addr: &str, method: &str, path: &str, headers: &[&str], body: &str) -> Reply {
    let mut s = TcpStream::connect(addr).expect("connect to --listen");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    if !body.is_empty() {
        head.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status code");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    // Small bodies: axum sends them with a content-length, not chunked.
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

fn get(addr: &str, path: &str, headers: &[&str]) -> Reply {
    request(addr, "GET", path, headers, "")
}

/// A daemon serving `--listen` with `key` ("" for none given) and an audit dir of its own.
fn start(key: &str) -> (Daemon, String, tempfile::TempDir) {
    start_with(key, &[])
}

/// [`start`] with more `serve` arguments.
fn start_with(key: &str, extra: &[&str]) -> (Daemon, String, tempfile::TempDir) {
    let audit = tempdir();
    let mut d = Daemon::unstarted()
        .with_env("AGENTRUN_API_KEY", key)
        .with_env("AGENTRUN_AUDIT_DIR", audit.path());
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["--pool-size", "1", "--listen", addr.as_str()];
    args.extend_from_slice(extra);
    d.launch(args);
    (d, addr, audit)
}

/// The value of hidden input `csrf` in a page.
fn csrf_in(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no csrf field in {page}"));
    let rest = &page[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

/// A cookie's `Cookie:` header line from a response's `Set-Cookie`.
fn cookie_line(r: &Reply) -> String {
    let c = r
        .header("set-cookie")
        .unwrap_or_else(|| panic!("no Set-Cookie in {:?}", r.headers));
    format!("Cookie: {}", c.split(';').next().unwrap())
}

/// The login form as a browser gets it: its CSRF cookie (a `Cookie:` line) and token.
fn login_form(addr: &str) -> (String, String) {
    let page = get(addr, "/ui", &[]);
    assert_eq!(page.status, 200, "{}", page.body);
    (cookie_line(&page), csrf_in(&page.body))
}

fn ui_python() -> PathBuf {
    let p = workspace_root().join(".venv/ui/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run hack/test (it creates .venv/ui with selenium)",
        p.display()
    );
    for bin in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(
            std::path::Path::new(bin).exists(),
            "{bin} is missing: run hack/test (it installs chromium and chromium-driver)"
        );
    }
    p
}

/// Runs browser scenario `name` against the daemon; panics with its output and the
/// daemon's log. Returns its stdout.
fn scenario(d: &Daemon, addr: &str, audit: &std::path::Path, name: &str) -> String {
    let mut cmd = Command::new(ui_python());
    cmd.arg(workspace_root().join("tests/dashboard/ui_e2e.py"))
        .arg(name)
        .env("UI_URL", format!("http://{addr}"))
        .env("UI_KEY", KEY)
        .env("UI_SCREENSHOT", screenshot_path())
        .env("AGENTRUN", agentrun_bin())
        .env("AGENTRUN_STATE_DIR", d.state())
        .env("AGENTRUN_AUDIT_DIR", audit)
        .env("CHROMIUM", "/usr/bin/chromium")
        .env("CHROMEDRIVER", "/usr/bin/chromedriver")
        // selenium-manager must never be asked (it would go to the network).
        .env("SE_OFFLINE", "true")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .env_remove("AGENTRUN_NO_DAEMON");
    let out = run_with_timeout(cmd, None, SCENARIO_TIMEOUT);
    assert!(
        out.status.code() == Some(0) && out.stdout().contains(&format!("OK {name}")),
        "browser scenario {name} failed\n{out}\n{}",
        d.log()
    );
    out.stdout()
}

fn screenshot_path() -> PathBuf {
    let dir = agentrun_bin()
        .parent()
        .and_then(|p| p.parent())
        .map(|t| t.join("test-artifacts"))
        .unwrap_or_else(|| workspace_root().join("target/test-artifacts"));
    std::fs::create_dir_all(&dir).expect("create target/test-artifacts");
    dir.join("dashboard.png")
}

#[test]
fn chromium_login_live_update_filter_and_screenshot() {
    let Some(_lock) = setup() else { return };
    let (d, addr, audit) = start(KEY);
    scenario(&d, &addr, audit.path(), "wrong_key");
    scenario(&d, &addr, audit.path(), "login");
    scenario(&d, &addr, audit.path(), "live");
    d.provoke_egress_denial("evil.example");
    d.exec(["true"]).run().assert_code(0);
    // A run in another shell (no pool keeps `strict`): records of another sandbox.
    d.exec_with(["--profile", "strict"], ["true"])
        .run()
        .assert_code(0);
    scenario(&d, &addr, audit.path(), "filter");

    let png = screenshot_path();
    let _ = std::fs::remove_file(&png);
    let out = scenario(&d, &addr, audit.path(), "screenshot");
    assert!(
        out.contains(&format!("SCREENSHOT {}", png.display())),
        "{out}"
    );
    let bytes = std::fs::read(&png).expect("the screenshot");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(bytes.len() > 20_000, "a {} byte screenshot", bytes.len());
    println!("dashboard screenshot: {}", png.display());
    stop_clean(d);
}

#[test]
fn json_endpoints_need_the_key_and_check_their_queries() {
    let Some(_lock) = setup() else { return };
    let (d, addr, _audit) = start(KEY);
    d.provoke_egress_denial("evil.example");
    let key = format!("OPEN-SANDBOX-API-KEY: {KEY}");
    let wrong = format!("OPEN-SANDBOX-API-KEY: {KEY}x");

    for path in [
        "/ui/api/snapshot",
        "/ui/api/audit",
        "/ui/api/denials",
        "/ui/app.js",
    ] {
        let none = get(&addr, path, &[]);
        assert_eq!(none.status, 401, "{path}: {}", none.body);
        assert_eq!(none.json()["code"], "MISSING_API_KEY", "{path}");
        let bad = get(&addr, path, &[&wrong]);
        assert_eq!(bad.status, 401, "{path}: {}", bad.body);
        assert_eq!(bad.json()["code"], "INVALID_API_KEY", "{path}");
        let forged = get(
            &addr,
            path,
            &["Cookie: agentrun_ui=00112233445566778899aabbccddeeff"],
        );
        assert_eq!(forged.status, 401, "{path}: {}", forged.body);
    }
    // Without a session the page is the login form, and shows nothing of the daemon.
    let page = get(&addr, "/ui", &[]);
    assert_eq!(page.status, 200);
    assert!(page.body.contains("name=\"key\"") && !page.body.contains("id=\"pools\""));
    let page = get(&addr, "/ui", &[&wrong]);
    assert_eq!(page.status, 401);
    assert!(page.body.contains("Wrong API key."));
    for h in [
        ("content-security-policy", "default-src 'self'"),
        ("content-security-policy", "frame-ancestors 'none'"),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("cache-control", "no-store"),
    ] {
        assert!(
            page.header(h.0).is_some_and(|v| v.contains(h.1)),
            "{h:?} in {:?}",
            page.headers
        );
    }
    // The page has no inline script: the CSP would block it.
    let full = get(&addr, "/ui", &[&key]);
    assert_eq!(full.status, 200);
    assert!(full.body.contains("<script src=\"/ui/app.js\""));
    assert_eq!(full.body.matches("<script").count(), 1, "{}", full.body);

    // The snapshot, by header.
    let s = get(&addr, "/ui/api/snapshot", &[&key]);
    assert_eq!(s.status, 200, "{}", s.body);
    assert!(s
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    let s = s.json();
    for field in [
        "unix_ms",
        "status",
        "shells",
        "commands",
        "window",
        "daemon_memory_bytes",
    ] {
        assert!(s.get(field).is_some(), "no {field} in {s}");
    }
    assert_eq!(s["status"]["pools"][0]["image"], "host", "{s}");
    assert_eq!(s["status"]["pools"][0]["target"], 1, "{s}");
    assert_eq!(s["window"]["seconds"], 60);
    assert_eq!(s["window"]["runs_per_second"].as_array().unwrap().len(), 60);
    assert!(s["window"]["runs"].as_u64().unwrap() >= 1, "{s}");

    // A login: a 303 with a session cookie (not the key), which the endpoints accept.
    let (form_cookie, csrf) = login_form(&addr);
    let bad_login = request(
        &addr,
        "POST",
        "/ui/login",
        &[&form_cookie],
        &format!("key={KEY}x&csrf={csrf}"),
    );
    assert_eq!(bad_login.status, 401);
    assert!(!bad_login
        .header("set-cookie")
        .is_some_and(|c| c.starts_with("agentrun_ui=")));
    let login = request(
        &addr,
        "POST",
        "/ui/login",
        &[&form_cookie],
        &format!("key={KEY}&csrf={csrf}"),
    );
    assert_eq!(login.status, 303, "{}", login.body);
    assert_eq!(login.header("location"), Some("/ui"));
    let cookie = login.header("set-cookie").expect("a session cookie");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(cookie.contains(attr), "{cookie}");
    }
    assert!(!cookie.contains(KEY), "{cookie}");
    let session = format!("Cookie: {}", cookie.split(';').next().unwrap());
    let s = get(&addr, "/ui/api/snapshot", &[&session]);
    assert_eq!(s.status, 200, "{}", s.body);
    let page = get(&addr, "/ui", &[&session]);
    assert!(page.body.contains("id=\"pools\""));

    // The audit search.
    let all = get(&addr, "/ui/api/audit", &[&session]).json();
    let all = all.as_array().expect("an array of records");
    assert!(all.len() >= 2, "{all:?}");
    let denied = get(&addr, "/ui/api/audit?decision=deny&limit=5", &[&key]).json();
    let denied = denied.as_array().unwrap();
    assert!(!denied.is_empty());
    for r in denied {
        assert_eq!(r["decision"], "deny", "{r}");
        for f in [
            "time",
            "kind",
            "sandbox_id",
            "trace_id",
            "action",
            "resource",
            "rule",
        ] {
            assert!(r.get(f).is_some(), "no {f} in {r}");
        }
    }
    assert_eq!(denied[0]["rule"], "network.default");
    let sandbox = denied[0]["sandbox_id"].as_str().unwrap();
    let trace = denied[0]["trace_id"].as_str().unwrap();
    let traced = get(&addr, &format!("/ui/api/audit?trace={trace}"), &[&key]).json();
    let traced = traced.as_array().unwrap();
    assert!(traced.iter().all(|r| r["trace_id"] == trace), "{traced:?}");
    assert!(traced.iter().any(|r| r["kind"] == "run"), "{traced:?}");
    let mine = get(
        &addr,
        &format!("/ui/api/audit?sandbox={sandbox}&kind=run"),
        &[&key],
    )
    .json();
    let mine = mine.as_array().unwrap();
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert_eq!(mine[0]["sandbox_id"], sandbox);
    let limited = get(&addr, "/ui/api/audit?limit=1", &[&key]).json();
    assert_eq!(limited.as_array().unwrap().len(), 1);
    assert_eq!(limited[0], all[all.len() - 1], "the newest record");
    let feed = get(&addr, "/ui/api/denials", &[&key]).json();
    assert!(feed
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["decision"] == "deny"));
    assert!(!feed.as_array().unwrap().is_empty());

    // Bad query values: the API's 400, one line naming the parameter.
    for (q, name) in [
        ("kind=nope", "kind"),
        ("decision=maybe", "decision"),
        ("since=yesterday", "since"),
        ("limit=0", "limit"),
        ("limit=x", "limit"),
        ("colour=red", "colour"),
        ("since=1m&until=2h", "until"),
    ] {
        let r = get(&addr, &format!("/ui/api/audit?{q}"), &[&key]);
        assert_eq!(r.status, 400, "{q}: {}", r.body);
        let e = r.json();
        assert_eq!(e["code"], "INVALID_PARAMETER", "{q}");
        let msg = e["message"].as_str().unwrap();
        assert!(msg.contains(name) && !msg.contains('\n'), "{q}: {msg}");
    }
    let r = get(&addr, "/ui/api/denials?limit=100000", &[&key]);
    assert_eq!(r.status, 400, "{}", r.body);

    // Logging out (with the page's CSRF token) ends the session server-side.
    let page_csrf = csrf_in(&get(&addr, "/ui", &[&session]).body);
    let out = request(
        &addr,
        "POST",
        "/ui/logout",
        &[&session],
        &format!("csrf={page_csrf}"),
    );
    assert_eq!(out.status, 303, "{}", out.body);
    assert_eq!(get(&addr, "/ui/api/snapshot", &[&session]).status, 401);
    stop_clean(d);
}

#[test]
fn with_insecure_no_auth_the_dashboard_is_open() {
    let Some(_lock) = setup() else { return };
    let (d, addr, _audit) = start_with("", &["--insecure-no-auth"]);
    let page = get(&addr, "/ui", &[]);
    assert_eq!(page.status, 200);
    assert!(page.body.contains("id=\"pools\""), "{}", page.body);
    let s = get(&addr, "/ui/api/snapshot", &[]);
    assert_eq!(s.status, 200, "{}", s.body);
    assert_eq!(s.json()["status"]["pools"][0]["image"], "host");
    assert_eq!(get(&addr, "/ui/api/audit", &[]).status, 200);
    assert_eq!(get(&addr, "/ui/app.js", &[]).status, 200);
    assert!(!d.api_key_file().exists());
    stop_clean(d);
}

/// No key given: the dashboard needs the generated one (the state dir's key file), which
/// another local user can neither read nor do without.
#[test]
fn without_a_key_given_the_generated_key_is_needed() {
    let Some(_lock) = setup() else { return };
    let (d, addr, _audit) = start("");
    let key = d.api_key();
    let page = get(&addr, "/ui", &[]);
    assert!(!page.body.contains("id=\"pools\""), "{}", page.body);
    assert_eq!(get(&addr, "/ui/api/snapshot", &[]).status, 401);
    let s = get(
        &addr,
        "/ui/api/snapshot",
        &[&format!("OPEN-SANDBOX-API-KEY: {key}")],
    );
    assert_eq!(s.status, 200, "{}", s.body);
    stop_clean(d);
}

/// Login and logout are state changes a page elsewhere must not make: each needs its CSRF
/// token (the login form's cookie and field; the session's token for logout) and refuses a
/// foreign `Origin`; wrong keys are limited per client address; behind a TLS proxy the
/// session cookie is `Secure`.
#[test]
fn login_needs_csrf_and_its_origin_is_rate_limited_and_secure_behind_tls() {
    let Some(_lock) = setup() else { return };
    let (d, addr, _audit) = start(KEY);
    let no_session = |r: &Reply| {
        !r.header("set-cookie")
            .is_some_and(|c| c.starts_with("agentrun_ui="))
    };
    // No CSRF token at all, a wrong one, one without its cookie: 403, no session.
    let (form_cookie, csrf) = login_form(&addr);
    for (headers, body) in [
        (vec![], format!("key={KEY}")),
        (
            vec![form_cookie.as_str()],
            format!("key={KEY}&csrf=00{csrf}"),
        ),
        (vec![], format!("key={KEY}&csrf={csrf}")),
    ] {
        let r = request(&addr, "POST", "/ui/login", &headers, &body);
        assert_eq!(r.status, 403, "{headers:?} {body}: {}", r.body);
        assert!(no_session(&r), "{:?}", r.headers);
    }
    // Right key and token, but posted from another origin: 403 before anything.
    let origin = "Origin: http://evil.test";
    let r = request(
        &addr,
        "POST",
        "/ui/login",
        &[&form_cookie, origin],
        &format!("key={KEY}&csrf={csrf}"),
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.json()["code"], "ORIGIN_NOT_ALLOWED");
    assert!(no_session(&r));
    // From its own origin, through a TLS proxy: a Secure session cookie.
    let own = format!("Origin: http://{addr}");
    let r = request(
        &addr,
        "POST",
        "/ui/login",
        &[&form_cookie, &own, "X-Forwarded-Proto: https"],
        &format!("key={KEY}&csrf={csrf}"),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    let set = r.header("set-cookie").unwrap().to_string();
    assert!(
        set.contains("; Secure") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let session = cookie_line(&r);
    // Over plain HTTP, no Secure.
    let plain = request(
        &addr,
        "POST",
        "/ui/login",
        &[&form_cookie],
        &format!("key={KEY}&csrf={csrf}"),
    );
    assert!(!plain.header("set-cookie").unwrap().contains("Secure"));
    // Logout without the session's token (what a page elsewhere could send): refused, the
    // session lives on.
    for body in ["", "csrf=wrong"] {
        let r = request(&addr, "POST", "/ui/logout", &[&session], body);
        assert_eq!(r.status, 403, "{body}: {}", r.body);
        assert_eq!(get(&addr, "/ui/api/snapshot", &[&session]).status, 200);
    }
    // Wrong keys: 5 a minute per address, then even the right key is refused (429).
    for i in 0..5 {
        let r = request(
            &addr,
            "POST",
            "/ui/login",
            &[&form_cookie],
            &format!("key=wrong{i}&csrf={csrf}"),
        );
        assert_eq!(r.status, 401, "attempt {i}: {}", r.body);
    }
    let r = request(
        &addr,
        "POST",
        "/ui/login",
        &[&form_cookie],
        &format!("key={KEY}&csrf={csrf}"),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(no_session(&r));
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    stop_clean(d);
}
