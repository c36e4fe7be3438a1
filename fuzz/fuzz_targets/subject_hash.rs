//! OpenSSL's subject hash (`agentrun_egress::subject_hash`) on arbitrary DER: no panic (its
//! DER reader walks lengths from the input), and an answer is 8 lower-case hex digits.
#![no_main]

use agentrun_egress::subject_hash::subject_hash_der;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = subject_hash_der(data) {
        assert_eq!(h.len(), 8);
        assert!(h
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    }
});
