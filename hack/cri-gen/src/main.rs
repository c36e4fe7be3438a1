//! Generates the CRI (Kubernetes Container Runtime Interface) client code the e2e tests use.
//! Usage: agentrun-cri-gen <repo root>. Needs `protoc` (or `PROTOC`).

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::args().nth(1).expect("usage: agentrun-cri-gen <repo root>"));
    let proto_dir = root.join("tests/proto/cri");
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(true)
        .out_dir(root.join("tests/src/cri"))
        .compile_protos(&[proto_dir.join("api.proto")], &[proto_dir])
        .expect("protoc failed");
}
