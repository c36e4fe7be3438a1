//! The Docker Engine API's request parsing (`crates/docker`): what docker-py and the docker
//! CLI send on the socket. The first byte picks the request; the rest is its body or query:
//! - 0: `POST /containers/create` body -> `ContainerConfig` (ports, binds, limits), then the
//!   container record made of it (argv, user, ports, inspect and list JSON);
//! - 1: `POST /containers/{id}/exec` body -> `ExecConfig`;
//! - 2: `POST /build` query -> build options (dockerfile path, tags, buildargs);
//! - 3: a request target (`/v1.44/containers/x/kill?signal=...`): version prefix, query,
//!   the archive `path` parameter, signal names (the path's percent-decoding is axum's).
#![no_main]

use agentrun_docker::containers::{Container, ContainerConfig};
use agentrun_docker::exec::ExecConfig;
use agentrun_docker::http::{strip_version, Query};
use agentrun_image::ImageConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = agentrun_fuzz::split_selector(data) else {
        return;
    };
    match sel % 4 {
        0 => {
            let Ok(body) = serde_json::from_slice::<serde_json::Value>(rest) else {
                return;
            };
            let Ok(config) = ContainerConfig::from_body(&body) else {
                return;
            };
            let _ = config.mounts();
            let image = ImageConfig {
                entrypoint: Some(vec!["/bin/sh".into()]),
                exposed_ports: vec!["8080/tcp".into(), "53/udp".into()],
                working_dir: "/app".into(),
                ..ImageConfig::default()
            };
            let c = Container::new(
                "0".repeat(64),
                "fuzz".into(),
                config,
                "sha256:0".into(),
                image,
            );
            let _ = c.argv();
            let _ = c.user();
            let _ = c.exposed_ports();
            let _ = c.working_dir();
            let _ = c.inspect();
            let _ = c.summary();
        }
        1 => {
            if let Ok(body) = serde_json::from_slice::<serde_json::Value>(rest) {
                let _ = ExecConfig::from_body(&body);
            }
        }
        2 => {
            let Ok(q) = std::str::from_utf8(rest) else {
                return;
            };
            let _ = agentrun_docker::images::build_options(&Query::parse(Some(q)));
        }
        _ => {
            let Ok(target) = std::str::from_utf8(rest) else {
                return;
            };
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            let _ = strip_version(path);
            let q = Query::parse(Some(query));
            let _ = agentrun_docker::archive::path_param(&q);
            if let Some(s) = q.get("signal") {
                let _ = agentrun_docker::signals::parse(s);
            }
            let _ = q.bool("all");
            let _ = q.all("t");
        }
    }
});
