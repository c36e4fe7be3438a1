//! How a sandbox is routed through its egress proxy: [`egress_env`], the one environment of a
//! sandboxed process whose traffic leaves through the proxy (`agentrun exec`'s runs, cold and
//! warm, MCP sessions, OpenSandbox sandboxes), and the [`LiveSpec`] setter the live front ends
//! call when a network policy applies.

use crate::live::LiveSpec;

/// The environment of a process routed through the egress proxy: the proxy variables
/// pointing at [`agentrun_egress::SANDBOX_PROXY_PORT`] (and Node's opt-in to them); with
/// `trust_ca` (TLS intercepted), also what makes TLS libraries trust the proxy's CA (the CA
/// and bundle paths, Java's trust store and proxy options), written next to its socket in
/// [`agentrun_runtime::sandbox::EGRESS_DIR_IN_SANDBOX`].
pub fn egress_env(trust_ca: bool) -> Vec<(String, String)> {
    let mut env = agentrun_egress::proxy_env();
    if trust_ca {
        env.extend(agentrun_egress::mitm::trust_env(
            agentrun_runtime::sandbox::EGRESS_DIR_IN_SANDBOX,
        ));
    }
    env
}

impl LiveSpec {
    /// Route every process through the egress proxy: relay
    /// [`agentrun_egress::SANDBOX_PROXY_PORT`] to the caller's proxy, with [`egress_env`]
    /// (`trust_ca`: TLS is intercepted).
    pub fn through_egress_proxy(self, trust_ca: bool) -> Self {
        self.egress_port(Some(agentrun_egress::SANDBOX_PROXY_PORT))
            .envs(egress_env(trust_ca))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has(env: &[(String, String)], key: &str) -> bool {
        env.iter().any(|(k, _)| k == key)
    }

    fn value<'a>(env: &'a [(String, String)], key: &str) -> &'a str {
        let found = env.iter().find(|(k, _)| k == key);
        found.map(|(_, v)| v.as_str()).unwrap_or_default()
    }

    #[test]
    fn the_proxy_always_and_its_ca_only_when_intercepting() {
        let proxy = "http://127.0.0.1:3128";
        let plain = egress_env(false);
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            assert_eq!(value(&plain, k), proxy, "{k}: {plain:?}");
        }
        assert_eq!(value(&plain, "NODE_USE_ENV_PROXY"), "1");
        assert!(!has(&plain, "SSL_CERT_FILE") && !has(&plain, "JAVA_TOOL_OPTIONS"));

        let trusting = egress_env(true);
        assert_eq!(trusting[..plain.len()], plain[..]);
        let bundle = "/run/agentrun-egress/ca-bundle.pem";
        for k in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "PIP_CERT",
            "GIT_SSL_CAINFO",
        ] {
            assert_eq!(value(&trusting, k), bundle, "{k}: {trusting:?}");
        }
        assert_eq!(
            value(&trusting, "NODE_EXTRA_CA_CERTS"),
            "/run/agentrun-egress/ca.pem"
        );
        let java = value(&trusting, "JAVA_TOOL_OPTIONS");
        assert!(
            java.contains("-Dhttps.proxyPort=3128")
                && java.contains(
                    "-Djavax.net.ssl.trustStore=/run/agentrun-egress/java-truststore.p12"
                ),
            "{java}"
        );
    }

    #[test]
    fn a_live_sandbox_is_routed_with_that_environment() {
        for trust_ca in [false, true] {
            let spec = LiveSpec::new("img").through_egress_proxy(trust_ca);
            assert_eq!(spec.egress_port, Some(agentrun_egress::SANDBOX_PROXY_PORT));
            assert_eq!(spec.env, egress_env(trust_ca));
        }
    }
}
