//! The Kubernetes CRI (Container Runtime Interface) `runtime.v1` gRPC client and messages
//! that tests/tests/oci_cri.rs drives containerd's CRI plugin with.
//!
//! `runtime.v1.rs` is generated from `tests/proto/cri/api.proto` (k8s.io/cri-api, Apache-2.0)
//! by `hack/gen-cri` and checked in, so building the workspace needs no `protoc`.

/// `runtime.v1`: the CRI API version the kubelet speaks.
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod v1 {
    include!("runtime.v1.rs");
}
