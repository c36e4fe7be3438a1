//! OpenSSL's subject hash of a certificate (`openssl x509 -subject_hash`, `X509_NAME_hash`):
//! the name a hashed certificate directory (`-CApath`, `SSL_CERT_DIR`, `/etc/ssl/certs`)
//! files a CA under, `<hash>.<n>`.
//!
//! OpenSSL hashes the subject's *canonical* encoding (`x509_name_canon` in `x_name.c`): each
//! RDN as a DER `SET` of its attributes, concatenated without the outer `SEQUENCE`, every
//! string value converted to UTF-8, stripped of leading and trailing white space, inner runs
//! of white space made one space, ASCII lower-cased, and tagged `UTF8String`; any other value
//! is kept as it is. The hash is the first four bytes of the SHA-1 of that, little-endian.
//! The certificate is read with a small DER reader (only the fields before the subject are
//! walked) and SHA-1 is aws-lc-rs's, the library rustls already uses here.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// Why a subject hash could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum SubjectHashError {
    #[error("not a PEM certificate")]
    Pem,
    #[error("the certificate's DER does not parse: {0}")]
    Der(&'static str),
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const UTF8_STRING: u8 = 0x0c;

/// One DER element: its tag, its content, the whole element, and what follows it.
struct Tlv<'a> {
    tag: u8,
    content: &'a [u8],
    whole: &'a [u8],
    rest: &'a [u8],
}

fn tlv(buf: &[u8]) -> Result<Tlv<'_>, SubjectHashError> {
    let short = SubjectHashError::Der("truncated");
    let (&tag, after) = buf.split_first().ok_or(short)?;
    if tag & 0x1f == 0x1f {
        return Err(SubjectHashError::Der("high tag number"));
    }
    let (&first, mut after) = after
        .split_first()
        .ok_or(SubjectHashError::Der("truncated"))?;
    let len = if first < 0x80 {
        first as usize
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || after.len() < n {
            return Err(SubjectHashError::Der("bad length"));
        }
        let len = after[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | b as usize);
        after = &after[n..];
        len
    };
    if after.len() < len {
        return Err(SubjectHashError::Der("truncated"));
    }
    let header = buf.len() - after.len();
    Ok(Tlv {
        tag,
        content: &after[..len],
        whole: &buf[..header + len],
        rest: &after[len..],
    })
}

fn expect(buf: &[u8], tag: u8) -> Result<Tlv<'_>, SubjectHashError> {
    let t = tlv(buf)?;
    if t.tag != tag {
        return Err(SubjectHashError::Der("unexpected tag"));
    }
    Ok(t)
}

pub(crate) fn encode(tag: u8, content: &[u8], out: &mut Vec<u8>) {
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
}

/// The DER of the certificate's subject `Name` (the whole `SEQUENCE`).
fn subject(der: &[u8]) -> Result<&[u8], SubjectHashError> {
    let cert = expect(der, SEQUENCE)?;
    let tbs = expect(cert.content, SEQUENCE)?;
    let mut at = tbs.content;
    // [0] EXPLICIT version, when present.
    let first = tlv(at)?;
    if first.tag == 0xa0 {
        at = first.rest;
    }
    at = expect(at, 0x02)?.rest; // serialNumber
    at = expect(at, SEQUENCE)?.rest; // signature
    at = expect(at, SEQUENCE)?.rest; // issuer
    at = expect(at, SEQUENCE)?.rest; // validity
    Ok(expect(at, SEQUENCE)?.whole)
}

/// A string value as UTF-8, for the types OpenSSL canonicalizes (`ASN1_MASK_CANON`);
/// `None` for any other type (kept as it is).
fn as_utf8(tag: u8, content: &[u8]) -> Result<Option<Vec<u8>>, SubjectHashError> {
    let bad = SubjectHashError::Der("a string value that does not convert to UTF-8");
    let text: String = match tag {
        UTF8_STRING => std::str::from_utf8(content).map_err(|_| bad)?.to_owned(),
        // PrintableString, T61String, IA5String, VisibleString: one byte a character
        // (OpenSSL reads T61 as Latin-1).
        0x13 | 0x14 | 0x16 | 0x1a => content.iter().map(|&b| b as char).collect(),
        // BMPString: UCS-2, big-endian.
        0x1e => {
            if !content.len().is_multiple_of(2) {
                return Err(bad);
            }
            content
                .chunks(2)
                .map(|c| char::from_u32(u32::from(u16::from_be_bytes([c[0], c[1]]))))
                .collect::<Option<String>>()
                .ok_or(bad)?
        }
        // UniversalString: UCS-4, big-endian.
        0x1c => {
            if !content.len().is_multiple_of(4) {
                return Err(bad);
            }
            content
                .chunks(4)
                .map(|c| char::from_u32(u32::from_be_bytes([c[0], c[1], c[2], c[3]])))
                .collect::<Option<String>>()
                .ok_or(bad)?
        }
        _ => return Ok(None),
    };
    Ok(Some(text.into_bytes()))
}

/// OpenSSL's `asn1_string_canon` on UTF-8 bytes.
fn canon_text(s: &[u8]) -> Vec<u8> {
    // OpenSSL's ossl_isspace: space, \t, \n, \v, \f, \r (never a byte with the high bit).
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let start = s.iter().position(|&b| !space(b)).unwrap_or(s.len());
    let end = s.iter().rposition(|&b| !space(b)).map_or(start, |i| i + 1);
    let mut out = Vec::with_capacity(end - start);
    let mut i = start;
    while i < end {
        let b = s[i];
        if space(b) {
            out.push(b' ');
            while i < end && space(s[i]) {
                i += 1;
            }
            continue;
        }
        out.push(if b & 0x80 == 0 {
            b.to_ascii_lowercase()
        } else {
            b
        });
        i += 1;
    }
    out
}

/// The canonical encoding of a DER `Name` (OpenSSL's `x509_name_canon`).
fn canonical(name: &[u8]) -> Result<Vec<u8>, SubjectHashError> {
    let mut out = Vec::new();
    let mut rdns = expect(name, SEQUENCE)?.content;
    while !rdns.is_empty() {
        let rdn = expect(rdns, SET)?;
        rdns = rdn.rest;
        let mut avas: Vec<Vec<u8>> = Vec::new();
        let mut at = rdn.content;
        while !at.is_empty() {
            let ava = expect(at, SEQUENCE)?;
            at = ava.rest;
            let oid = expect(ava.content, 0x06)?;
            let value = tlv(oid.rest)?;
            if !value.rest.is_empty() {
                return Err(SubjectHashError::Der("trailing bytes in an attribute"));
            }
            let mut body = oid.whole.to_vec();
            match as_utf8(value.tag, value.content)? {
                Some(text) => encode(UTF8_STRING, &canon_text(&text), &mut body),
                None => body.extend_from_slice(value.whole),
            }
            let mut enc = Vec::new();
            encode(SEQUENCE, &body, &mut enc);
            avas.push(enc);
        }
        // DER orders a SET OF by the elements' encodings.
        avas.sort();
        encode(SET, &avas.concat(), &mut out);
    }
    Ok(out)
}

/// `openssl x509 -subject_hash` of the first certificate in `pem`, as OpenSSL names the file
/// in a hashed directory (8 lower-case hex digits, without the `.n` suffix).
pub fn subject_hash(pem: &str) -> Result<String, SubjectHashError> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|_| SubjectHashError::Pem)?;
    subject_hash_der(&der)
}

/// [`subject_hash`] of a DER certificate.
pub fn subject_hash_der(der: &[u8]) -> Result<String, SubjectHashError> {
    let canon = canonical(subject(der)?)?;
    let md = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &canon);
    let b = md.as_ref();
    Ok(format!(
        "{:08x}",
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// OpenSSL's own answer (the test's reference, never used on a run's path).
    fn openssl_hash(pem: &str) -> String {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("c.pem");
        std::fs::write(&f, pem).unwrap();
        let out = Command::new("openssl")
            .args(["x509", "-noout", "-subject_hash", "-in"])
            .arg(&f)
            .output()
            .expect("the openssl command (the test's reference)");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// A self-signed certificate made by `openssl req` with `subj` and `string_mask`
    /// (`utf8only`: UTF8String values; `default`: PrintableString, T61String, BMPString).
    fn openssl_cert(subj: &str, string_mask: &str) -> String {
        let d = tempfile::tempdir().unwrap();
        let conf = d.path().join("req.cnf");
        std::fs::write(
            &conf,
            format!("[req]\ndistinguished_name=dn\nstring_mask={string_mask}\n[dn]\n"),
        )
        .unwrap();
        let out = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
            .args(["ec_paramgen_curve:P-256", "-nodes", "-days", "1"])
            .args(["-multivalue-rdn", "-utf8", "-subj", subj, "-config"])
            .arg(&conf)
            .arg("-keyout")
            .arg(d.path().join("k.pem"))
            .arg("-out")
            .arg(d.path().join("c.pem"))
            .output()
            .expect("the openssl command (the test's reference)");
        assert!(out.status.success(), "{out:?}");
        std::fs::read_to_string(d.path().join("c.pem")).unwrap()
    }

    #[test]
    fn matches_openssl_for_the_interception_ca() {
        let i = crate::mitm::Interceptor::new("sbx-Hash Test", &[]).unwrap();
        let pem = i.ca_pem();
        assert_eq!(subject_hash(pem).unwrap(), openssl_hash(pem));
    }

    #[test]
    fn matches_openssl_on_case_white_space_and_multi_valued_rdns() {
        for subj in [
            "/CN=Simple",
            "/O=  Upper   CASE\tand Tabs  /CN=x",
            "/C=DE/O=Ünïcödé GmbH/OU=a+CN=b",
            "/CN=zz+O=aa/L=   ",
        ] {
            for mask in ["utf8only", "default"] {
                let pem = openssl_cert(subj, mask);
                assert_eq!(
                    subject_hash(&pem).unwrap(),
                    openssl_hash(&pem),
                    "{subj} {mask}"
                );
            }
        }
    }

    #[test]
    fn matches_openssl_for_a_printable_string_subject() {
        // rcgen encodes PrintableString when asked: another type converted to UTF-8.
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(
            rcgen::DnType::CountryName,
            rcgen::DnValue::PrintableString("US".try_into().unwrap()),
        );
        dn.push(
            rcgen::DnType::CommonName,
            rcgen::DnValue::PrintableString("Some   CA Name ".try_into().unwrap()),
        );
        params.distinguished_name = dn;
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        assert_eq!(subject_hash(&pem).unwrap(), openssl_hash(&pem));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(subject_hash("not pem").is_err());
        let pem = "-----BEGIN CERTIFICATE-----\nMAMCAQA=\n-----END CERTIFICATE-----\n";
        assert!(subject_hash(pem).is_err());
    }
}
