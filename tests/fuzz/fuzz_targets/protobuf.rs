#![no_main]
//! The Protobuf decoder with a random file (nested, recursive, maps, oneofs, well-known types)
//! over the remaining bytes, message indexes included, as the payload.
use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use tessel_kafka::codec::registry::SchemaType;

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |b| usize::from(*b)).min(data.len());
    let (schema_bytes, payload) = data.split_at(split);
    let mut u = Unstructured::new(schema_bytes);
    let Ok(file) = tessel_kafka_fuzz::proto_file(&mut u) else {
        return;
    };
    let _ = tessel_kafka::fuzz::decode_with_schema(SchemaType::Protobuf, &file, payload);
});
