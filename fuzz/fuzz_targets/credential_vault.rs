//! The credential vault's API bodies (`POST`/`PATCH /credential-vault`, parsed as the
//! egress routes parse them) and the injection they drive, on arbitrary bytes: no panic; no
//! sanitized state or error ever contains a credential value; a refused change leaves the
//! vault as it was; an injected head is still one well-formed head.
#![no_main]

use agentrun_egress::vault::{VaultCreate, VaultMutation};
use agentrun_egress::{parse_origin_head, Vault};
use libfuzzer_sys::fuzz_target;

/// A value long and odd enough that it cannot appear in a state or an error by chance.
const MARK: &str = "zq9-vault-secret-7Xw";

/// The strings of `body` under a `value` key (`out`) and everywhere else (`names`).
fn values(body: &serde_json::Value, out: &mut Vec<String>, names: &mut Vec<String>) {
    match body {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                names.push(k.clone());
                match v.as_str() {
                    Some(s) if k == "value" => out.push(s.to_owned()),
                    Some(s) => names.push(s.to_owned()),
                    None => values(v, out, names),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| values(v, out, names)),
        serde_json::Value::String(s) => names.push(s.clone()),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    // The first byte splits the input: a create body, then a mutation body.
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let cut = (cut as usize).min(rest.len());
    let (a, b) = rest.split_at(cut);
    let vault = Vault::new();
    let seed = format!(
        r#"{{"credentials":[{{"name":"c","source":{{"type":"inline","value":"{MARK}"}}}}],
            "bindings":[{{"name":"b","match":{{"hosts":["h.example"]}},"auth":{{"type":"bearer","credential":"c"}}}}]}}"#
    );
    let create: VaultCreate = serde_json::from_str(&seed).unwrap();
    vault.create(create).unwrap();
    let mut secrets = vec![MARK.to_owned()];
    let mut names = Vec::new();
    for body in [a, b] {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
            values(&v, &mut secrets, &mut names);
        }
    }
    // A value that is also written as a name (or inside one) may be quoted as that name.
    secrets.retain(|s| s.len() >= 12 && !names.iter().any(|n| n.contains(s.as_str())));
    let check = |text: &str| {
        for s in &secrets {
            assert!(!text.contains(s.as_str()), "a value in {text:?}");
        }
    };
    if let Ok(c) = serde_json::from_slice::<VaultCreate>(a) {
        check(&format!("{c:?}"));
        let fresh = Vault::new();
        match fresh.create(c) {
            Ok(s) => check(&serde_json::to_string(&s).unwrap()),
            Err(e) => check(&e.message),
        }
    }
    if let Ok(m) = serde_json::from_slice::<VaultMutation>(b) {
        let before = serde_json::to_string(&vault.state().unwrap()).unwrap();
        match vault.mutate(m) {
            Ok(s) => check(&serde_json::to_string(&s).unwrap()),
            Err(e) => {
                check(&e.message);
                assert_eq!(
                    serde_json::to_string(&vault.state().unwrap()).unwrap(),
                    before
                );
            }
        }
    }
    let req = b"GET /x?y=1 HTTP/1.1\r\nHost: h.example\r\nX-A: 1\r\n\r\n";
    if let Ok(Some((mut head, _))) = parse_origin_head(req, "h.example", 443, 443) {
        vault.inject("https", "h.example", 443, &mut head);
        let fwd = head.forward("h.example", 443, 443);
        for (i, c) in fwd.iter().enumerate() {
            match c {
                b'\n' => assert_eq!(fwd[i - 1], b'\r'),
                b'\r' => assert_eq!(fwd[i + 1], b'\n'),
                _ => {}
            }
        }
        assert!(fwd.ends_with(b"\r\nConnection: close\r\n\r\n"));
    }
});
