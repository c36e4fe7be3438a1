//! Randomness for ids and tokens: getrandom(2), failing closed.
//!
//! Every sandbox id, API token and container id agentrun makes comes from here: the kernel's
//! CSPRNG through the getrandom(2) system call itself (rustix; it blocks only until the pool
//! is first initialized at boot and needs no file descriptor). Not the `getrandom` crate: in
//! the static release build it finds no libc `getrandom` (its lookup is `dlsym`) and falls
//! back to an fd of `/dev/urandom` kept in a static, which a process that closes every fd it
//! does not know (a sandbox factory) then finds closed: "Bad file descriptor" on every create.
//! There is no fallback that could yield predictable bytes: when the kernel gives no
//! randomness the caller gets a [`RandomError`] and makes no id.

use rustix::io::Errno;
use rustix::rand::{getrandom, GetRandomFlags};

/// The kernel gave no randomness.
#[derive(Debug, thiserror::Error)]
#[error("no randomness from the kernel (getrandom): {0}")]
pub struct RandomError(Errno);

/// Fills `buf` with random bytes.
pub fn fill(buf: &mut [u8]) -> Result<(), RandomError> {
    fill_from(buf, kernel)
}

/// `bytes` random bytes as lower-case hex (`2 * bytes` digits).
pub fn hex(bytes: usize) -> Result<String, RandomError> {
    hex_from(bytes, kernel)
}

/// getrandom(2) until `buf` is full (a call may fill less; a signal may interrupt it).
fn kernel(buf: &mut [u8]) -> Result<(), Errno> {
    let mut done = 0;
    while done < buf.len() {
        match getrandom(&mut buf[done..], GetRandomFlags::empty()) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn fill_from(
    buf: &mut [u8],
    source: impl FnOnce(&mut [u8]) -> Result<(), Errno>,
) -> Result<(), RandomError> {
    source(buf).map_err(RandomError)
}

fn hex_from(
    bytes: usize,
    source: impl FnOnce(&mut [u8]) -> Result<(), Errno>,
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
        let e = hex_from(16, |_| Err(Errno::NOSYS)).unwrap_err();
        assert!(e.to_string().contains("getrandom"), "{e}");
        let mut buf = [0u8; 8];
        assert!(fill_from(&mut buf, |_| Err(Errno::PERM)).is_err());
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
