//! Port publishing: `HostConfig.PortBindings` (`docker run -p 127.0.0.1:N:P`, docker-py
//! `ports={"P/tcp": ("127.0.0.1", N)}`) and `PublishAllPorts`.
//!
//! A container has a network namespace of its own with only loopback in it. Publishing port P
//! listens on a host loopback address and forwards every TCP connection to `127.0.0.1:P`
//! inside the container: the daemon makes the inner socket in the container's network
//! namespace ([`agentrun_runtime::netns`]: one thread per container enters it at start and
//! makes sockets there on request), then copies bytes both ways. Nothing runs in the sandbox
//! for it, and the container gets no route out.
//!
//! Only loopback host addresses are accepted (an empty `HostIp` means `127.0.0.1`): a
//! container is a sandbox for untrusted code, and `0.0.0.0` would hand its server to the
//! network. Listeners live while the main process runs: [`Published`] is dropped when the
//! container stops or is removed, which closes the listeners at once (so the same host port
//! can be bound again right away) and ends the forwarded connections.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

use agentrun_runtime::netns::NetnsSockets;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

/// Buffer per direction of a forwarded connection (tokio's default, 8 KiB, halves bulk
/// throughput: measured with a 200 MB download).
const COPY_BUF: usize = 64 * 1024;

/// One `PortBindings` entry: container TCP port to a host address (port 0: any free one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortBinding {
    pub container_port: u16,
    pub host: SocketAddr,
}

/// Why ports cannot be published: a bad `PortBindings` entry (a 400, in dockerd's words) or
/// a host port that cannot be bound (a 500).
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error("port {key}: only tcp ports can be published ({proto} is not supported)")]
    NotTcp { key: String, proto: String },
    #[error("invalid port specification: \"{0}\"")]
    Spec(String),
    #[error("invalid port binding for {key}: {value}")]
    Binding { key: String, value: Value },
    #[error("invalid IP address in port binding for {key}: {ip:?}")]
    Ip { key: String, ip: String },
    #[error(
        "cannot publish {key} on {ip}: agentrun publishes container ports on loopback \
         addresses only (use 127.0.0.1)"
    )]
    NotLoopback { key: String, ip: String },
    #[error("invalid host port {port:?} for {key}: a port number (port ranges are not supported)")]
    HostPort { key: String, port: String },
    #[error("publishing ports: no runtime: {0}")]
    NoRuntime(tokio::runtime::TryCurrentError),
    #[error("publishing ports: entering the container's network: {0}")]
    Netns(io::Error),
    /// The words dockerd gives when a host port cannot be bound.
    #[error(
        "driver failed programming external connectivity on endpoint {name}: {}",
        bind_words(*addr, source)
    )]
    Bind {
        name: String,
        addr: SocketAddr,
        source: io::Error,
    },
}

/// `"8000/tcp"` or `"8000"` -> 8000; other protocols and ranges are refused.
fn container_port(key: &str) -> Result<u16, PortError> {
    let (port, proto) = key.split_once('/').unwrap_or((key, "tcp"));
    if !proto.eq_ignore_ascii_case("tcp") {
        return Err(PortError::NotTcp {
            key: key.into(),
            proto: proto.into(),
        });
    }
    port.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| PortError::Spec(key.into()))
}

/// The host side of a binding: a loopback address (empty: 127.0.0.1) and a port ("" or "0":
/// any free one).
fn host_addr(ip: &str, port: &str, key: &str) -> Result<SocketAddr, PortError> {
    let addr: IpAddr = if ip.is_empty() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        ip.trim_matches(|c| c == '[' || c == ']')
            .parse()
            .map_err(|_| PortError::Ip {
                key: key.into(),
                ip: ip.into(),
            })?
    };
    if !addr.is_loopback() {
        return Err(PortError::NotLoopback {
            key: key.into(),
            ip: ip.into(),
        });
    }
    let port = if port.is_empty() {
        0
    } else {
        port.parse::<u16>().map_err(|_| PortError::HostPort {
            key: key.into(),
            port: port.into(),
        })?
    };
    Ok(SocketAddr::new(addr, port))
}

/// The bindings a create body asks for: `HostConfig.PortBindings`, plus every exposed port
/// (the request's and the image's) on a free loopback port with `PublishAllPorts`.
pub fn bindings(host_config: &Value, exposed: &[String]) -> Result<Vec<PortBinding>, PortError> {
    let mut out = Vec::new();
    if let Some(map) = host_config["PortBindings"].as_object() {
        for (key, list) in map {
            let container_port = container_port(key)?;
            let entries: Vec<&Value> = match list {
                Value::Array(a) if !a.is_empty() => a.iter().collect(),
                // `{"8000/tcp": null}` or `[]`: published on any port.
                Value::Null | Value::Array(_) => vec![&Value::Null],
                other => {
                    return Err(PortError::Binding {
                        key: key.clone(),
                        value: other.clone(),
                    })
                }
            };
            for e in entries {
                let ip = e["HostIp"].as_str().unwrap_or("");
                let port = e["HostPort"].as_str().unwrap_or("");
                out.push(PortBinding {
                    container_port,
                    host: host_addr(ip, port, key)?,
                });
            }
        }
    }
    if host_config["PublishAllPorts"].as_bool() == Some(true) {
        for key in exposed {
            // Only tcp is published; an image's udp ports are left alone.
            let Ok(container_port) = container_port(key) else {
                continue;
            };
            if !out.iter().any(|b| b.container_port == container_port) {
                out.push(PortBinding {
                    container_port,
                    host: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
                });
            }
        }
    }
    out.sort_by_key(|b| (b.container_port, b.host));
    Ok(out)
}

/// The listeners of a running container. Dropping it closes them and ends every forwarded
/// connection.
pub struct Published {
    /// (container port, host address actually bound).
    pub ports: Vec<(u16, SocketAddr)>,
    /// Duplicates of the listening sockets: shut down on drop, which takes them out of the
    /// listening state at once (the tasks holding them go asynchronously).
    listening: Vec<OwnedFd>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Forwarded connections end when it is dropped.
    _stop: watch::Sender<()>,
}

impl Drop for Published {
    fn drop(&mut self) {
        for fd in &self.listening {
            // Only a socket that is not listening any more fails: nothing is left to stop.
            let _ = nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What dockerd says after "... on endpoint NAME: " when a host port cannot be bound.
fn bind_words(addr: SocketAddr, e: &io::Error) -> String {
    if e.kind() == io::ErrorKind::AddrInUse {
        format!("Bind for {addr} failed: port is already allocated")
    } else {
        format!("listen {addr}: {e}")
    }
}

/// Maps a failure to bind or set up the listener of `addr`.
fn bind_error(name: &str, addr: SocketAddr) -> impl Fn(io::Error) -> PortError + '_ {
    move |source| PortError::Bind {
        name: name.into(),
        addr,
        source,
    }
}

/// Binds every host address and forwards its connections into the network namespace of
/// the process `init_pid` (the container's sandbox init). Must be called where a tokio
/// runtime is current (the API's handlers and their blocking tasks).
pub fn publish(
    name: &str,
    bindings: &[PortBinding],
    init_pid: i32,
) -> Result<Option<Published>, PortError> {
    if bindings.is_empty() {
        return Ok(None);
    }
    let rt = tokio::runtime::Handle::try_current().map_err(PortError::NoRuntime)?;
    let sockets = NetnsSockets::of_process(init_pid).map_err(PortError::Netns)?;
    let mut listeners = Vec::new();
    for b in bindings {
        let l = std::net::TcpListener::bind(b.host).map_err(bind_error(name, b.host))?;
        let bound = l.local_addr().map_err(bind_error(name, b.host))?;
        l.set_nonblocking(true).map_err(bind_error(name, b.host))?;
        listeners.push((b.container_port, bound, l));
    }
    let (stop, _) = watch::channel(());
    let mut published = Published {
        ports: Vec::new(),
        listening: Vec::new(),
        tasks: Vec::new(),
        _stop: stop,
    };
    for (port, bound, l) in listeners {
        let dup = OwnedFd::from(l.try_clone().map_err(bind_error(name, bound))?);
        let sockets = sockets.clone();
        let stop = published._stop.subscribe();
        let task = rt.spawn(async move {
            let listener = match TcpListener::from_std(l) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(target: crate::LOG, "docker API: listening on {bound}: {e}");
                    return;
                }
            };
            // Ends with an error once the listener is shut down (or the task aborted).
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, sockets.clone(), port, stop.clone()));
            }
        });
        published.ports.push((port, bound));
        published.listening.push(dup);
        published.tasks.push(task);
    }
    Ok(Some(published))
}

/// Carries one host connection to `127.0.0.1:port` in the container until either side
/// closes, or the container stops (`stop`).
async fn forward(
    mut client: TcpStream,
    sockets: NetnsSockets,
    port: u16,
    mut stop: watch::Receiver<()>,
) {
    let socket = match sockets.socket().await {
        Ok(fd) => TcpSocket::from_std_stream(std::net::TcpStream::from(fd)),
        Err(e) => {
            tracing::debug!(target: crate::TRACE, "port {port}: socket in the container: {e}");
            return;
        }
    };
    let target = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    let mut inner = match socket.connect(target).await {
        Ok(s) => s,
        // Nothing listens there (yet): the client sees its connection closed, as with
        // docker-proxy.
        Err(_) => return,
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut inner, COPY_BUF, COPY_BUF) => {}
        _ = stop.changed() => {}
    }
}

/// `NetworkSettings.Ports` of inspect: while it runs, every exposed or published port, with
/// its host addresses when published (`null` when exposed only); nothing when stopped.
pub fn inspect_ports(exposed: &[String], published: Option<&Published>, running: bool) -> Value {
    let mut map = serde_json::Map::new();
    if running {
        for key in exposed {
            if let Ok(port) = container_port(key) {
                map.insert(format!("{port}/tcp"), Value::Null);
            }
        }
    }
    if let Some(p) = published {
        for (port, addr) in &p.ports {
            let entry = map
                .entry(format!("{port}/tcp"))
                .or_insert_with(|| json!([]));
            if !entry.is_array() {
                *entry = json!([]);
            }
            if let Some(a) = entry.as_array_mut() {
                a.push(
                    json!({"HostIp": addr.ip().to_string(), "HostPort": addr.port().to_string()}),
                );
            }
        }
    }
    Value::Object(map)
}

/// `Ports` of a list row: while it runs, published ports with their host side, exposed ones
/// without; nothing when stopped.
pub fn summary_ports(exposed: &[String], published: Option<&Published>, running: bool) -> Value {
    let mut rows = Vec::new();
    if !running {
        return Value::Array(rows);
    }
    let mut seen = Vec::new();
    if let Some(p) = published {
        for (port, addr) in &p.ports {
            seen.push(*port);
            rows.push(json!({"IP": addr.ip().to_string(), "PrivatePort": port,
                             "PublicPort": addr.port(), "Type": "tcp"}));
        }
    }
    for key in exposed {
        if let Ok(port) = container_port(key) {
            if !seen.contains(&port) {
                seen.push(port);
                rows.push(json!({"PrivatePort": port, "Type": "tcp"}));
            }
        }
    }
    Value::Array(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bindings_are_parsed_and_loopback_only() {
        let hc = json!({"PortBindings": {
            "8888/tcp": [{"HostIp": "127.0.0.1", "HostPort": "0"}],
            "80": [{"HostIp": "", "HostPort": "8080"}],
            "9000/tcp": null,
            "7000/tcp": [{"HostIp": "::1", "HostPort": ""}]
        }});
        let b = bindings(&hc, &[]).unwrap();
        let got: Vec<(u16, String)> = b
            .iter()
            .map(|b| (b.container_port, b.host.to_string()))
            .collect();
        assert_eq!(
            got,
            vec![
                (80, "127.0.0.1:8080".to_string()),
                (7000, "[::1]:0".to_string()),
                (8888, "127.0.0.1:0".to_string()),
                (9000, "127.0.0.1:0".to_string()),
            ]
        );
        for (bad, why) in [
            (
                json!({"80/tcp": [{"HostIp": "0.0.0.0", "HostPort": "80"}]}),
                "loopback",
            ),
            (
                json!({"80/udp": [{"HostIp": "", "HostPort": "80"}]}),
                "only tcp",
            ),
            (
                json!({"x/tcp": [{"HostIp": "", "HostPort": "80"}]}),
                "invalid port",
            ),
            (
                json!({"80/tcp": [{"HostIp": "", "HostPort": "80-90"}]}),
                "ranges",
            ),
            (
                json!({"80/tcp": [{"HostIp": "nope", "HostPort": "1"}]}),
                "invalid IP",
            ),
        ] {
            let err = bindings(&json!({ "PortBindings": bad }), &[])
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{err}");
        }
        let all = bindings(
            &json!({"PublishAllPorts": true, "PortBindings": {"80/tcp": [{"HostPort": "81"}]}}),
            &["80/tcp".into(), "8888/tcp".into()],
        )
        .unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].host.to_string(), "127.0.0.1:0");
    }
}
