//! Profile TOML (`crates/policy`): `agentrun exec --profile FILE`, `agentrun policy check`.
//! A profile that parses is then asked the questions a run asks of it (fs reads/writes/mounts,
//! connects, env), its Landlock path lists derived and resource overrides applied; the sizes
//! and durations parsers get the raw text too. Property: a profile that validates never
//! panics later, and every decision names its rule.
#![no_main]

use std::path::PathBuf;

use agentrun_policy::{Action, Profile, ResourceOverrides};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = agentrun_policy::parse_bytes(text);
    let _ = agentrun_policy::parse_duration(text);
    let Ok(profile) = Profile::parse(text, "fuzz.toml") else {
        return;
    };
    // Strings of the profile itself make good probes.
    let mut paths: Vec<PathBuf> = [
        "/",
        "/workspace",
        "/workspace/../etc/passwd",
        "/tmp/x",
        "rel",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    paths.extend(profile.filesystem.readable.iter().cloned());
    paths.extend(profile.filesystem.writable.iter().cloned());
    paths.extend(profile.filesystem.hidden.iter().cloned());
    let mut actions = Vec::new();
    for p in &paths {
        actions.push(Action::Read(p.clone()));
        actions.push(Action::Write(p.join("f")));
        actions.push(Action::Mount {
            target: p.clone(),
            writable: true,
        });
    }
    for r in &profile.network.rules {
        let host = r.host.trim_start_matches("*.").to_owned();
        actions.push(Action::Connect {
            host: format!("a.{host}"),
            port: r.port.unwrap_or(443),
        });
        actions.push(Action::Connect {
            host,
            port: r.port.unwrap_or(80),
        });
    }
    for k in profile.env_defaults.keys() {
        actions.push(Action::SetEnv(k.clone()));
    }
    actions.push(Action::SetEnv("PATH".into()));
    for a in &actions {
        let d = profile.check(a);
        assert!(!d.rule_id.is_empty(), "{a:?}: a decision without a rule");
        let _ = a.resource();
    }
    let _ = profile.landlock_readable();
    let _ = profile.landlock_writable(paths.iter().cloned());
    let _ = profile.environment(&[("A".into(), "b".into())]);
    let _ = profile.clone().with_overrides(&ResourceOverrides {
        memory_bytes: Some(u64::MAX),
        pids: Some(u32::MAX),
        cpus: Some(f64::NAN),
        tmpfs_bytes: Some(0),
        timeout_ms: Some(u64::MAX),
    });
});
