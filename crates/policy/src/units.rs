//! Human units used on the command line and in profiles: sizes (`64M`, `1.5G`) and durations
//! (`500ms`, `2s`, `1m30s`).

use std::time::Duration;

/// A value that is not a size or a duration.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UnitError {
    #[error("invalid size {0:?} (expected e.g. 512K, 64M, 1.5G)")]
    Size(String),
    #[error("invalid duration {0:?} (expected e.g. 500ms, 2s, 1m30s)")]
    Duration(String),
}

/// Parses a byte size: a number with an optional binary suffix (K, M, G, T; `KiB`/`KB`/`k`
/// accepted too). `64M` is 64 MiB.
pub fn parse_bytes(s: &str) -> Result<u64, UnitError> {
    let err = || UnitError::Size(s.to_owned());
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| err())?;
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(err()),
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 1.0 || bytes > u64::MAX as f64 {
        return Err(err());
    }
    Ok(bytes as u64)
}

/// Formats bytes the way users wrote them: `64M`, `1G`, `1536K`.
pub fn format_bytes(b: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    format!("{b}")
}

/// Parses a duration made of `<number><unit>` parts (`ms`, `s`, `m`, `h`); a bare number is
/// seconds.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let err = || UnitError::Duration(s.to_owned());
    let t = s.trim();
    if t.is_empty() {
        return Err(err());
    }
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs).map_err(|_| err());
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if n == 0 {
            return Err(err());
        }
        let value: f64 = rest[..n].parse().map_err(|_| err())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let secs = match &rest[..u] {
            "ms" => value / 1000.0,
            "s" => value,
            "m" => value * 60.0,
            "h" => value * 3600.0,
            _ => return Err(err()),
        };
        total += Duration::try_from_secs_f64(secs).map_err(|_| err())?;
        rest = &rest[u..];
    }
    if total.is_zero() {
        return Err(err());
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("64M").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("64m").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        for bad in ["", "M", "12Q", "-1M", "0", "1.2.3M"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        assert_eq!(format_bytes(64 << 20), "64M");
        assert_eq!(format_bytes(1 << 30), "1G");
        assert_eq!(format_bytes(1536 << 10), "1536K");
        assert_eq!(format_bytes(1000), "1000");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        for bad in ["", "s", "2x", "0s", "-1s", "1s2"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
