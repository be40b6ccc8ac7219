#![no_main]
//! JSON Schema payloads: parsing, the decoding limits and validation against a random schema.
use arbitrary::Unstructured;
use libfuzzer_sys::fuzz_target;
use tessel_kafka::codec::registry::SchemaType;

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |b| usize::from(*b)).min(data.len());
    let (schema_bytes, payload) = data.split_at(split);
    let mut u = Unstructured::new(schema_bytes);
    let Ok(schema) = tessel_kafka_fuzz::json_schema(&mut u) else {
        return;
    };
    let _ = tessel_kafka::fuzz::decode_with_schema(SchemaType::Json, &schema, payload);
});
