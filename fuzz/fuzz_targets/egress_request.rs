//! The egress proxy's request parsing (`agentrun_egress::parse_request_head`, then the
//! chunked-body re-framer) on arbitrary bytes: no panic, and whatever head it accepts is
//! forwarded as one well-formed origin-form head with exactly one framing.
#![no_main]

use agentrun_egress::request::relay_body;
use agentrun_egress::{parse_request_head, Body, MAX_HEAD};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((head, len))) = parse_request_head(data) {
        assert!(len <= data.len() && len <= MAX_HEAD);
        assert!(!head.host.is_empty() && head.port != 0);
        if head.connect {
            assert!(head.forward.is_empty());
            assert_eq!(head.body, Body::None);
        } else {
            let fwd = &head.forward;
            assert!(fwd.ends_with(b"\r\nConnection: close\r\n\r\n"));
            // Every line ends in CRLF; no CR or LF elsewhere.
            for (i, b) in fwd.iter().enumerate() {
                match b {
                    b'\n' => assert_eq!(fwd[i - 1], b'\r'),
                    b'\r' => assert_eq!(fwd[i + 1], b'\n'),
                    _ => {}
                }
            }
            let lines: Vec<String> = fwd
                .split(|b| *b == b'\n')
                .map(|l| String::from_utf8_lossy(l).to_ascii_lowercase())
                .collect();
            let count = |name: &str| lines.iter().filter(|l| l.starts_with(name)).count();
            let (cl, te) = (count("content-length:"), count("transfer-encoding:"));
            assert!(cl <= 1 && te <= 1 && cl + te <= 1, "{lines:?}");
            assert_eq!(te == 1, head.body == Body::Chunked);
            assert_eq!(count("host:"), 1);
            assert_eq!(count("connection:"), 1);
        }
        let mut out = Vec::new();
        let _ = relay_body(head.body, &mut &data[len..], &mut out);
    }
    // The chunked re-framer on its own: never panics, never emits more than it read plus
    // its own framing.
    let mut out = Vec::new();
    if relay_body(Body::Chunked, &mut &data[..], &mut out).is_ok() {
        assert!(out.ends_with(b"0\r\n\r\n"));
    }
});
