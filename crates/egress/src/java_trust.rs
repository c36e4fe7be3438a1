//! A Java trust store for the sandbox: Java reads neither PEM bundles nor `SSL_CERT_FILE`,
//! only a keystore (`javax.net.ssl.trustStore`). [`truststore`] writes the certificates of a
//! PEM bundle (the system's roots and the interception CA) as a PKCS#12 file of trusted
//! certificate entries, as `keytool -importcert` would: each a `certBag` with a
//! `friendlyName` and Oracle's trusted-key-usage attribute (`anyExtendedKeyUsage`), without
//! which the JDK does not treat a certificate-only entry as trusted. Nothing in it is secret:
//! it is neither encrypted nor MACed (the JDK loads such a file when no store password is
//! given). [`Entries`] are a bundle's certificates made into the store's entries once (the
//! host's roots, the same for every sandbox), so that a sandbox's store costs only its CA's
//! entry. [`java_tool_options`] is what points the JVM at it and at the proxy.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::subject_hash::encode;

/// The trust store's file in the proxy's socket directory.
pub const TRUSTSTORE_FILE: &str = "java-truststore.p12";

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OCTET_STRING: u8 = 0x04;
const CONTEXT_0: u8 = 0xa0;
/// pkcs7-data.
const OID_DATA: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x01,
];
/// pkcs-12 certBag.
const OID_CERT_BAG: &[u8] = &[
    0x06, 0x0b, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x0c, 0x0a, 0x01, 0x03,
];
/// pkcs-9 x509Certificate (certificate type of a certBag).
const OID_X509_CERT: &[u8] = &[
    0x06, 0x0a, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x16, 0x01,
];
/// pkcs-9 friendlyName (the entry's alias).
const OID_FRIENDLY_NAME: &[u8] = &[
    0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x14,
];
/// Oracle's trusted key usage (2.16.840.1.113894.746875.1.1).
const OID_TRUSTED_KEY_USAGE: &[u8] = &[
    0x06, 0x0c, 0x60, 0x86, 0x48, 0x01, 0x86, 0xf9, 0x66, 0xad, 0xca, 0x7b, 0x01, 0x01,
];
/// anyExtendedKeyUsage (2.5.29.37.0).
const OID_ANY_EKU: &[u8] = &[0x06, 0x04, 0x55, 0x1d, 0x25, 0x00];

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 6);
    encode(tag, content, &mut out);
    out
}

fn attribute(oid: &[u8], value: &[u8]) -> Vec<u8> {
    tlv(SEQUENCE, &[oid, &tlv(SET, value)].concat())
}

fn cert_bag(alias: &str, der: &[u8]) -> Vec<u8> {
    let bag = tlv(
        SEQUENCE,
        &[OID_X509_CERT, &tlv(CONTEXT_0, &tlv(OCTET_STRING, der))].concat(),
    );
    let bmp: Vec<u8> = alias.encode_utf16().flat_map(u16::to_be_bytes).collect();
    let attrs = [
        attribute(OID_FRIENDLY_NAME, &tlv(0x1e, &bmp)),
        attribute(OID_TRUSTED_KEY_USAGE, OID_ANY_EKU),
    ]
    .concat();
    tlv(
        SEQUENCE,
        &[OID_CERT_BAG, &tlv(CONTEXT_0, &bag), &tlv(SET, &attrs)].concat(),
    )
}

/// The trust store's entries of a PEM bundle's certificates, in order (aliases `agentrun-0`,
/// `agentrun-1`, ...): what [`Entries::store_with`] puts first in a store.
#[derive(Debug, Clone, Default)]
pub struct Entries {
    bags: Vec<u8>,
    count: usize,
}

impl Entries {
    /// The entries of every certificate in `pem`.
    pub fn of(pem: &str) -> Entries {
        Entries::numbered_from(pem, 0)
    }

    fn numbered_from(pem: &str, first: usize) -> Entries {
        let mut count = 0;
        let bags = CertificateDer::pem_slice_iter(pem.as_bytes())
            .filter_map(Result::ok)
            .flat_map(|der| {
                count += 1;
                cert_bag(&format!("agentrun-{}", first + count - 1), &der)
            })
            .collect();
        Entries { bags, count }
    }

    /// A PKCS#12 trust store of these entries, then every certificate in `pem` (aliases going
    /// on): the same bytes as [`truststore`] of the two bundles one after the other. `None`
    /// when there is no certificate at all.
    pub fn store_with(&self, pem: &str) -> Option<Vec<u8>> {
        let more = Entries::numbered_from(pem, self.count);
        if self.count + more.count == 0 {
            return None;
        }
        Some(store(&[&self.bags[..], &more.bags[..]].concat()))
    }
}

/// A PKCS#12 trust store of every certificate in `pem` (aliases `agentrun-0`, `agentrun-1`,
/// ...); `None` when `pem` holds no certificate.
pub fn truststore(pem: &str) -> Option<Vec<u8>> {
    Entries::default().store_with(pem)
}

/// The PKCS#12 file around the certificate bags `bags`.
fn store(bags: &[u8]) -> Vec<u8> {
    let safe_contents = tlv(SEQUENCE, bags);
    let data = |content: &[u8]| {
        tlv(
            SEQUENCE,
            &[OID_DATA, &tlv(CONTEXT_0, &tlv(OCTET_STRING, content))].concat(),
        )
    };
    let authenticated_safe = tlv(SEQUENCE, &data(&safe_contents));
    let version = [0x02, 0x01, 0x03];
    tlv(
        SEQUENCE,
        &[&version[..], &data(&authenticated_safe)].concat(),
    )
}

/// `JAVA_TOOL_OPTIONS` for a sandbox whose proxy intercepts: Java's HTTP clients
/// (`HttpURLConnection`, `java.net.http.HttpClient`) through the proxy at `proxy` (`host`,
/// `port`), loopback included as for curl (`http.nonProxyHosts` emptied), and trusting the
/// store at `truststore`.
pub fn java_tool_options(proxy_host: &str, proxy_port: u16, truststore: &str) -> String {
    format!(
        "-Dhttps.proxyHost={proxy_host} -Dhttps.proxyPort={proxy_port} \
         -Dhttp.proxyHost={proxy_host} -Dhttp.proxyPort={proxy_port} -Dhttp.nonProxyHosts= \
         -Djavax.net.ssl.trustStore={truststore} -Djavax.net.ssl.trustStoreType=PKCS12"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// `keytool` (the JDK's own reader, the test's reference) lists every certificate as a
    /// trusted entry.
    #[test]
    fn keytool_reads_the_store_as_trusted_certificates() {
        let a = crate::mitm::Interceptor::new("java-a", &[]).unwrap();
        let b = crate::mitm::Interceptor::new("java-b", &[]).unwrap();
        let pem = format!("{}\n{}", a.ca_pem(), b.ca_pem());
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join(TRUSTSTORE_FILE);
        std::fs::write(&f, truststore(&pem).unwrap()).unwrap();
        let out = Command::new("keytool")
            .args(["-list", "-v", "-storetype", "PKCS12", "-keystore"])
            .arg(&f)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("keytool (the test's reference; the JDK is installed where this runs)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(text.contains("contains 2 entries"), "{text}");
        assert_eq!(
            text.matches("Entry type: trustedCertEntry").count(),
            2,
            "{text}"
        );
        assert!(text.contains("CN=agentrun egress CA java-a"), "{text}");
        assert!(text.contains("Alias name: agentrun-1"), "{text}");
    }

    #[test]
    fn no_certificate_no_store() {
        assert!(truststore("nothing here").is_none());
        assert!(Entries::of("nothing").store_with("here").is_none());
    }

    /// A store made from entries built earlier (the host's roots, once) and one more
    /// certificate (a sandbox's CA) is the store of the whole bundle, byte for byte.
    #[test]
    fn entries_built_once_and_a_ca_added_make_the_whole_bundles_store() {
        let [a, b, c] = ["roots-a", "roots-b", "ca"].map(|n| {
            crate::mitm::Interceptor::new(n, &[])
                .unwrap()
                .ca_pem()
                .to_owned()
        });
        let roots = format!("{a}{b}");
        let once = Entries::of(&roots);
        assert_eq!(once.count, 2);
        let store = once.store_with(&c).unwrap();
        assert_eq!(store, truststore(&format!("{roots}{c}")).unwrap());
        // Aliases go on from the roots' (the CA is agentrun-2), and nothing of the roots is
        // lost when the extra bundle is empty or holds no certificate.
        let alias = |i: usize| -> Vec<u8> {
            format!("agentrun-{i}")
                .encode_utf16()
                .flat_map(u16::to_be_bytes)
                .collect()
        };
        assert!(store.windows(alias(2).len()).any(|w| w == alias(2)));
        assert!(!store.windows(alias(3).len()).any(|w| w == alias(3)));
        assert_eq!(once.store_with(""), truststore(&roots));
        assert_eq!(Entries::default().store_with(&c), truststore(&c));
    }
}
