//! `/_ping`, `/version`, `/info`: what clients call to find and negotiate with the daemon.

use hyper::{Method, StatusCode};
use serde_json::json;

use crate::http::{empty, json, Reply, API_VERSION, MIN_API_VERSION};
use crate::ApiState;

/// The version agentrun reports as the engine's.
const ENGINE_VERSION: &str = concat!("agentrun-", env!("CARGO_PKG_VERSION"));

/// `HEAD /_ping`, `GET /_ping`: 200 with the headers the Go client negotiates from (no body on
/// HEAD).
pub fn ping(method: &Method) -> Reply {
    let mut r = if method == Method::HEAD {
        empty(StatusCode::OK)
    } else {
        let mut r = crate::http::text(StatusCode::OK, "OK");
        r.headers_mut().insert(
            "content-type",
            "text/plain; charset=utf-8".parse().expect("header"),
        );
        r
    };
    let h = r.headers_mut();
    for (k, v) in [
        ("api-version", API_VERSION),
        ("ostype", "linux"),
        ("docker-experimental", "false"),
        ("cache-control", "no-cache, no-store, must-revalidate"),
        ("pragma", "no-cache"),
    ] {
        h.insert(k, v.parse().expect("header"));
    }
    if method == Method::HEAD {
        h.insert(
            "content-type",
            "text/plain; charset=utf-8".parse().expect("header"),
        );
        h.insert("content-length", "0".parse().expect("header"));
    }
    r
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// `GET /version`
pub fn version() -> Reply {
    let details = json!({
        "ApiVersion": API_VERSION,
        "MinAPIVersion": MIN_API_VERSION,
        "Os": "linux",
        "Arch": "amd64",
        "KernelVersion": kernel(),
        "GitCommit": "",
        "GoVersion": "",
        "BuildTime": "",
    });
    let mut top = details.clone();
    top["Platform"] = json!({"Name": "agentrun"});
    top["Version"] = json!(ENGINE_VERSION);
    top["Experimental"] = json!(false);
    let mut engine_details = details;
    engine_details["Experimental"] = json!("false");
    top["Components"] = json!([{
        "Name": "Engine",
        "Version": ENGINE_VERSION,
        "Details": engine_details,
    }]);
    json(StatusCode::OK, &top)
}

/// `GET /info`: the minimal object `docker info` accepts, with real counts.
pub fn info(api: &ApiState) -> Reply {
    let images = api
        .store
        .list()
        .map(|l| l.iter().filter(|i| !i.id.is_empty()).count())
        .unwrap_or(0);
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    json(
        StatusCode::OK,
        &json!({
            "ID": "agentrun",
            "Containers": 0,
            "ContainersRunning": 0,
            "ContainersPaused": 0,
            "ContainersStopped": 0,
            "Images": images,
            "Driver": "overlay2",
            "ServerVersion": ENGINE_VERSION,
            "OSType": "linux",
            "Architecture": "x86_64",
            "NCPU": ncpu,
            "MemTotal": 0,
            "OperatingSystem": "agentrun",
            "KernelVersion": kernel(),
            "Name": hostname,
            "DockerRootDir": api.root.display().to_string(),
            "SecurityOptions": ["name=seccomp,profile=builtin", "name=userns", "name=landlock"],
            "Runtimes": {"agentrun": {"path": "agentrun"}},
            "DefaultRuntime": "agentrun",
            "Swarm": {"LocalNodeState": "inactive"},
            "Warnings": [],
        }),
    )
}
