//! Randomness for ids and tokens: getrandom(2), failing closed.
//!
//! Every sandbox id, API token and container id agentrun makes comes from here: the kernel's
//! CSPRNG through getrandom(2) (the `getrandom` crate; the call blocks only until the pool is
//! first initialized at boot and needs no file descriptor). There is no fallback that could
//! yield predictable bytes: when the kernel gives no randomness the caller gets a
//! [`RandomError`] and makes no id.

/// The kernel gave no randomness.
#[derive(Debug, thiserror::Error)]
#[error("no randomness from the kernel (getrandom): {0}")]
pub struct RandomError(String);

/// Fills `buf` with random bytes.
pub fn fill(buf: &mut [u8]) -> Result<(), RandomError> {
    fill_from(buf, getrandom::fill)
}

/// `bytes` random bytes as lower-case hex (`2 * bytes` digits).
pub fn hex(bytes: usize) -> Result<String, RandomError> {
    hex_from(bytes, getrandom::fill)
}

fn fill_from(
    buf: &mut [u8],
    source: impl FnOnce(&mut [u8]) -> Result<(), getrandom::Error>,
) -> Result<(), RandomError> {
    source(buf).map_err(|e| RandomError(e.to_string()))
}

fn hex_from(
    bytes: usize,
    source: impl FnOnce(&mut [u8]) -> Result<(), getrandom::Error>,
) -> Result<String, RandomError> {
    let mut b = vec![0u8; bytes];
    fill_from(&mut b, source)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_source_is_an_error_never_zeros() {
        let e = hex_from(16, |_| Err(getrandom::Error::UNSUPPORTED)).unwrap_err();
        assert!(e.to_string().contains("getrandom"), "{e}");
        let mut buf = [0u8; 8];
        assert!(fill_from(&mut buf, |_| Err(getrandom::Error::UNEXPECTED)).is_err());
    }

    #[test]
    fn hex_has_the_asked_length_and_varies() {
        let a = hex(16).unwrap();
        let b = hex(16).unwrap();
        assert_eq!(a.len(), 32);
        assert!(a
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
        let fixed = hex_from(3, |b| {
            b.copy_from_slice(&[0x00, 0xab, 0x7f]);
            Ok(())
        })
        .unwrap();
        assert_eq!(fixed, "00ab7f");
    }
}
