//! `agentrun fork SANDBOX --count N --url URL`: copies of a live OpenSandbox sandbox of the
//! daemon (`POST /v1/sandboxes/{id}/fork` on its API, with the daemon's API key from the
//! state dir, or `--api-key`). Prints the copies' ids, one a line (`--json`: the answer).
//! What a fork carries: docs/opensandbox-compat.md#fork.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use crate::Paths;

#[derive(Args, Debug)]
pub struct ForkArgs {
    /// The sandbox to copy (its OpenSandbox id).
    pub sandbox: String,
    /// How many copies.
    #[arg(long, short = 'n', default_value_t = 1)]
    pub count: u64,
    /// The daemon's OpenSandbox API (what `agentrun serve --listen` listens on), e.g.
    /// http://127.0.0.1:8080.
    #[arg(long)]
    pub url: String,
    /// The API key (default: the daemon's, from its state dir).
    #[arg(long, env = "OPEN_SANDBOX_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Print the API's JSON answer.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ForkArgs, paths: &Paths) -> anyhow::Result<()> {
    let hostport = args
        .url
        .strip_prefix("http://")
        .context("--url: an http:// URL (e.g. http://127.0.0.1:8080)")?
        .trim_end_matches('/')
        .to_owned();
    if hostport.contains('/') {
        bail!("--url: give the listener's address only (http://HOST:PORT)");
    }
    let key = match args.api_key {
        Some(k) => k,
        None => {
            let path = agentrun_webguard::keyfile::path_in(&paths.state_dir);
            agentrun_webguard::keyfile::read(&path)
                .map(|f| f.key)
                .with_context(|| format!("no API key (--api-key, or {})", path.display()))?
        }
    };
    let body = serde_json::json!({ "count": args.count }).to_string();
    let request = format!(
        "POST /v1/sandboxes/{}/fork HTTP/1.1\r\nHost: {hostport}\r\nOPEN-SANDBOX-API-KEY: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        args.sandbox,
        body.len()
    );
    let mut stream =
        TcpStream::connect(&hostport).with_context(|| format!("connecting to {hostport}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(600)))?;
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, payload) = text
        .split_once("\r\n\r\n")
        .context("the API's answer is not HTTP")?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("the API's answer has no status")?;
    let payload = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(payload)
    } else {
        payload.to_owned()
    };
    let v: serde_json::Value = serde_json::from_str(&payload).unwrap_or_default();
    if status != 201 {
        let msg = v["message"].as_str().unwrap_or(payload.trim());
        bail!("fork: {msg} (HTTP {status})");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for s in v["sandboxes"].as_array().into_iter().flatten() {
            println!("{}", s["id"].as_str().unwrap_or_default());
        }
    }
    Ok(())
}

fn dechunk(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}
