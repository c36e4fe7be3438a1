//! `docker cp` into a container (`PUT /containers/{id}/archive`, `crates/docker/src/archive.rs`):
//! the client's tar unpacked into a container root through the in-root file layer
//! (`openat2(RESOLVE_IN_ROOT)`, with the sandbox root's fsuid), as the daemon does. The root is
//! a scratch directory (`agentrun_fuzz`) holding links that point out of it (`../..`, `/`);
//! anything that lands outside the root is a finding.
#![no_main]

use std::os::unix::fs::{chown, symlink};
use std::path::Path;

use agentrun_fuzz::Scratch;
use agentrun_runtime::fsroot::{as_sandbox_root, SandboxFs};
use agentrun_runtime::idmap::UID_BASE;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let scratch = Scratch::new();
    let root = scratch.work.join("root");
    std::fs::create_dir_all(root.join("dst/sub")).expect("scratch dir");
    symlink("../../..", root.join("dst/up")).expect("symlink");
    symlink("/", root.join("dst/abs")).expect("symlink");
    symlink("/dst", root.join("link-to-dst")).expect("symlink");
    for p in ["", "dst", "dst/sub"] {
        let _ = chown(root.join(p), Some(UID_BASE), Some(UID_BASE));
    }
    let fd = std::fs::File::open(&root).expect("open root");
    let fs = SandboxFs::new(fd.into());
    // The extraction point: a directory, or a link to one (followed inside the root).
    let dest = if data.first().is_some_and(|b| b & 1 == 1) {
        "link-to-dst"
    } else {
        "dst"
    };
    let _ = as_sandbox_root(|| agentrun_docker::archive::extract(&fs, Path::new(dest), data));
    scratch.check_contained();
});
