#![no_main]
//! Confluent framing and the schema-less formats over arbitrary bytes.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tessel_kafka::codec::fuzz::framing(data);
    tessel_kafka::codec::fuzz::schemaless(data);
});
