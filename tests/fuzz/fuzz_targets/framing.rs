#![no_main]
//! Confluent framing and the schema-less formats over arbitrary bytes.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tessel_kafka::fuzz::framing(data);
    tessel_kafka::fuzz::schemaless(data);
});
