//! The E2B API's request parsing (`crates/e2b`): what the official SDKs send. The first byte
//! picks the request; the rest is its body (or header/query value):
//! - Connect framing: 0 a server-streaming request body (one envelope of a `StartRequest`);
//!   property: an accepted envelope is exactly its prefix and its declared payload, and
//!   re-framing the payload gives the body back;
//! - control plane: 1 create (`POST /v2/sandboxes`), 2 set timeout, 3 list query;
//! - envd: 4 `Start` message, 5 `SendSignal` message, 6 `Authorization: Basic` user,
//!   7 a path (property: resolved inside the sandbox, never with `..` left in it);
//! - code interpreter: 8 `/execute` body;
//! - envd input: 9 a `SendInput` message (and its bytes as a `StreamInput` data message);
//!   property: a checked `Start`'s terminal is at least 1x1.
#![no_main]

use agentrun_e2b::{auth, code, connect, control, filesystem, process};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 10 {
        0 => {
            if let Ok(env) = connect::single_envelope(rest) {
                assert_eq!(rest.len(), connect::PREFIX + env.data.len());
                assert_eq!(&connect::envelope(env.flags, &env.data)[..], rest);
                if let Ok(req) = serde_json::from_slice::<process::StartRequest>(&env.data) {
                    let _ = process::check_start(req);
                }
            }
        }
        1 => {
            if let Ok((osb, _, _)) = control::parse_create(rest) {
                let v: serde_json::Value = serde_json::from_slice(&osb).expect("our own JSON");
                // From an image, or from a snapshot (a `snap-` template).
                assert!(v["image"]["uri"].is_string() != v["snapshotId"].is_string());
            }
        }
        2 => {
            if let Ok(t) = control::parse_timeout(rest) {
                assert!((0..=control::MAX_TIMEOUT_S).contains(&t));
            }
        }
        3 => {
            if let Ok(q) = control::parse_list_query(std::str::from_utf8(rest).ok()) {
                assert!(q.limit >= 1);
            }
        }
        4 => {
            if let Ok(req) = serde_json::from_slice::<process::StartRequest>(rest) {
                if let Ok((_, process::Stdio::Pty(rows, cols))) = process::check_start(req) {
                    assert!(rows >= 1 && cols >= 1);
                }
            }
        }
        5 => {
            if let Ok(req) = serde_json::from_slice::<process::SignalRequest>(rest) {
                if let Ok((_, sig)) = process::check_signal(req) {
                    assert!(sig == libc_sigkill() || sig == libc_sigterm());
                }
            }
        }
        6 => {
            if let Ok(v) = axum::http::HeaderValue::from_bytes(rest) {
                let mut h = axum::http::HeaderMap::new();
                h.insert("authorization", v);
                if let Ok(Some(user)) = auth::user_of(&h) {
                    assert!(!user.is_empty() && !user.contains(['\0', '\n', ':']));
                }
            }
        }
        7 => {
            if let Ok(path) = std::str::from_utf8(rest) {
                let abs = filesystem::absolute(path, Some("user"));
                if let Ok(r) = agentrun_opensandbox::files::rel(&abs) {
                    assert!(r
                        .components()
                        .all(|c| matches!(c, std::path::Component::Normal(_))));
                }
            }
        }
        8 => {
            let _ = code::parse_execute(rest);
        }
        _ => {
            if let Ok(req) = serde_json::from_slice::<process::InputRequest>(rest) {
                let _ = process::check_input(req);
            }
            if let Ok(req) = serde_json::from_slice::<process::StreamInputRequest>(rest) {
                if let Some(input) = req.data.and_then(|d| d.input) {
                    let _ = input.decode();
                }
            }
        }
    }
});

fn libc_sigkill() -> i32 {
    9
}

fn libc_sigterm() -> i32 {
    15
}
