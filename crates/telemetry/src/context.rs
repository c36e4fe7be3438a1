//! W3C Trace Context (`traceparent`) parsing and formatting.
//!
//! Format (version 00): `00-<32 lowercase hex trace id>-<16 lowercase hex span id>-<2 hex flags>`.
//! See <https://www.w3.org/TR/trace-context/#traceparent-header>.

use std::fmt::Write as _;

/// The part of a span's context that crosses process boundaries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// 16-byte trace id; never all zero in a valid context.
    pub trace_id: [u8; 16],
    /// 8-byte span id; never all zero in a valid context.
    pub span_id: [u8; 8],
    /// The `sampled` trace flag (bit 0 of the flags byte).
    pub sampled: bool,
}

impl TraceContext {
    /// Parses a W3C `traceparent` value (`00-<32hex>-<16hex>-<2hex>`).
    ///
    /// Returns `None` when the value is invalid: wrong field count or lengths, non-hex or
    /// uppercase hex, version `ff`, all-zero trace or span id. Leading and trailing
    /// whitespace is ignored. Per the spec, versions above `00` are accepted as long as the
    /// first four fields parse (extra fields after a `-` are ignored); version `00` must have
    /// exactly four fields.
    pub fn from_traceparent(s: &str) -> Option<Self> {
        let s = s.trim();
        let mut parts = s.splitn(5, '-');
        let version = parts.next()?;
        let trace_id = parts.next()?;
        let span_id = parts.next()?;
        let flags = parts.next()?;
        let rest = parts.next();

        let version = parse_hex::<1>(version)?[0];
        if version == 0xff {
            return None;
        }
        if version == 0x00 && rest.is_some() {
            return None;
        }
        let trace_id = parse_hex::<16>(trace_id)?;
        let span_id = parse_hex::<8>(span_id)?;
        let flags = parse_hex::<1>(flags)?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            sampled: flags & 0x01 == 0x01,
        })
    }

    /// Formats this context as a version-00 `traceparent` value.
    pub fn to_traceparent(&self) -> String {
        format!(
            "00-{}-{}-{}",
            to_hex(&self.trace_id),
            to_hex(&self.span_id),
            if self.sampled { "01" } else { "00" }
        )
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        to_hex(&self.trace_id)
    }

    /// The span id as 16 lowercase hex digits.
    pub fn span_id_hex(&self) -> String {
        to_hex(&self.span_id)
    }
}

/// Lowercase hex of `bytes`.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Parses exactly `N` bytes of lowercase hex (`2 * N` characters).
fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let s = s.as_bytes();
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

/// Value of one lowercase hex digit; uppercase is invalid in `traceparent`.
fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_valid_traceparent() {
        let ctx = TraceContext::from_traceparent(VALID).expect("valid");
        assert_eq!(ctx.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.span_id_hex(), "00f067aa0ba902b7");
        assert_eq!(ctx.trace_id[0], 0x4b);
        assert_eq!(ctx.span_id[7], 0xb7);
        assert!(ctx.sampled);
    }

    #[test]
    fn round_trips() {
        let ctx = TraceContext::from_traceparent(VALID).unwrap();
        assert_eq!(ctx.to_traceparent(), VALID);
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        let ctx = TraceContext::from_traceparent(unsampled).unwrap();
        assert!(!ctx.sampled);
        assert_eq!(ctx.to_traceparent(), unsampled);
    }

    #[test]
    fn sampled_is_bit_zero_of_flags() {
        let ctx = TraceContext::from_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03",
        )
        .unwrap();
        assert!(ctx.sampled);
        // Formatting normalises the flags to just the sampled bit.
        assert!(ctx.to_traceparent().ends_with("-01"));
        let ctx = TraceContext::from_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02",
        )
        .unwrap();
        assert!(!ctx.sampled);
    }

    #[test]
    fn trims_surrounding_whitespace() {
        assert!(TraceContext::from_traceparent(&format!("  {VALID}\n")).is_some());
    }

    #[test]
    fn version_00_must_have_exactly_four_fields() {
        assert!(TraceContext::from_traceparent(&format!("{VALID}-extra")).is_none());
    }

    #[test]
    fn future_versions_may_carry_extra_fields() {
        let ctx = TraceContext::from_traceparent(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever",
        )
        .expect("future version with extra fields");
        assert_eq!(ctx.span_id_hex(), "00f067aa0ba902b7");
    }

    #[test]
    fn rejects_malformed_values() {
        for bad in [
            // an invalid version
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // an all-zero trace or span id
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // a field of the wrong length
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47361-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b77-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-001",
            // uppercase, non-hex, or other separators
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba9 2b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ] {
            assert!(TraceContext::from_traceparent(bad).is_none(), "{bad:?}");
        }
    }
}
