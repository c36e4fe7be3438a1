//! Image references (`crates/image/src/reference.rs`), as they arrive in every API (docker
//! create/pull/tag, OpenSandbox image.uri, `agentrun exec --image`). Checks two properties
//! besides crashes: the fast plain normalizer agrees with the full parser whenever it answers,
//! and normalizing is idempotent.
#![no_main]

use agentrun_image::reference;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(name) = std::str::from_utf8(data) else {
        return;
    };
    let full = reference::normalize(name);
    if let Some(plain) = reference::normalize_plain(name) {
        assert_eq!(
            full.as_ref().ok(),
            Some(&plain),
            "normalize_plain({name:?}) = {plain:?}, normalize = {full:?}"
        );
    }
    if let Ok(full) = &full {
        assert_eq!(
            reference::normalize(full).as_ref().ok(),
            Some(full),
            "normalize is not idempotent on {name:?}"
        );
        let _ = reference::repo_and_tag(full);
        let _ = reference::familiar(full);
    }
    let _ = reference::id_prefix(name);
});
