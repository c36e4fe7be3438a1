//! How a live sandbox is routed through its egress proxy: the one [`LiveSpec`] setter the
//! front ends (MCP sessions, OpenSandbox sandboxes) call when a network policy applies.

use crate::live::LiveSpec;

impl LiveSpec {
    /// Route every process through the egress proxy: relay
    /// [`agentrun_egress::SANDBOX_PROXY_PORT`] to the caller's proxy and point the proxy
    /// variables at it; with `trust_ca` (TLS intercepted), also make TLS libraries trust the
    /// proxy's CA, written next to its socket in
    /// [`agentrun_runtime::sandbox::EGRESS_DIR_IN_SANDBOX`].
    pub fn through_egress_proxy(self, trust_ca: bool) -> Self {
        let spec = self
            .egress_port(Some(agentrun_egress::SANDBOX_PROXY_PORT))
            .envs(agentrun_egress::proxy_env());
        if trust_ca {
            let dir = agentrun_runtime::sandbox::EGRESS_DIR_IN_SANDBOX;
            spec.envs(agentrun_egress::mitm::trust_env(dir))
        } else {
            spec
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has(spec: &LiveSpec, key: &str) -> bool {
        spec.env.iter().any(|(k, _)| k == key)
    }

    #[test]
    fn routes_through_the_proxy_and_trusts_its_ca_only_when_asked() {
        let plain = LiveSpec::new("img").through_egress_proxy(false);
        assert_eq!(plain.egress_port, Some(agentrun_egress::SANDBOX_PROXY_PORT));
        assert_eq!(plain.env, agentrun_egress::proxy_env());

        let trusting = LiveSpec::new("img").through_egress_proxy(true);
        let mut want = agentrun_egress::proxy_env();
        want.extend(agentrun_egress::mitm::trust_env(
            agentrun_runtime::sandbox::EGRESS_DIR_IN_SANDBOX,
        ));
        assert_eq!(trusting.env, want);
        assert!(has(&trusting, "SSL_CERT_FILE") && !has(&plain, "SSL_CERT_FILE"));
    }
}
