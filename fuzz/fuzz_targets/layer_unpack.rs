//! The layer unpacker (`crates/image/src/layer.rs`): a (gzip/zstd/plain) tar stream, as a
//! registry or an archive hands it over, unpacked into a fresh scratch directory (see
//! `agentrun_fuzz` for how the scratch space is kept off the host). Besides crashes, it
//! checks that nothing lands outside the target directory.
#![no_main]

use agentrun_fuzz::Scratch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let scratch = Scratch::new();
    let dest = scratch.work.join("fs");
    std::fs::create_dir(&dest).expect("scratch dir");
    // The store's default limits, as every unpack has: a bomb stops at them.
    let budget = agentrun_image::Budget::new(Default::default());
    let _ = agentrun_image::unpack(data, &dest, "fuzz", &budget);
    scratch.check_contained();
});
