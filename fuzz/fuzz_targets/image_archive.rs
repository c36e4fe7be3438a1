//! `agentrun image import` of a tar (`crates/image/src/archive.rs`): a `docker save` archive or
//! an OCI image layout (optionally compressed), extracted, its JSON read (index.json with
//! nested indexes, manifests, manifest.json), blobs checked and copied into a fresh store,
//! and (when digests match, as in the seeds) its layers unpacked. The store lives in the
//! scratch space (`agentrun_fuzz`).
#![no_main]

use agentrun_fuzz::Scratch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let scratch = Scratch::new();
    let archive = scratch.work.join("archive.tar");
    std::fs::write(&archive, data).expect("scratch file");
    let store = agentrun_image::ImageStore::open(scratch.work.join("store")).expect("store");
    if let Ok(images) = store.import(&archive, None) {
        for (rec, _) in images {
            let _ = store.resolve(&rec.id);
        }
    }
    scratch.check_contained();
});
