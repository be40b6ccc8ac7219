#![no_main]
//! Commit metadata (`tk3:<topic id>:<offset>:<runs>`, or the older `tk2:<offset>:<runs>` and
//! `tk1:<offset>:<ranges>`) as another member, or anyone, may have written it.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (i64, &str)| {
    tessel_kafka::fuzz::commit_metadata(input.0, input.1);
});
