//! The region consumer's group generation and member id, which rust-rdkafka does not expose:
//! read from librdkafka's consumer group metadata.
#![allow(unsafe_code)]

use std::ffi::CStr;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};

/// The group generation and member id `consumer` knows now (generation -1 and an empty id
/// before it joined).
pub(super) fn membership<C: ConsumerContext>(consumer: &BaseConsumer<C>) -> (i32, String) {
    let rk = consumer.client().native_ptr();
    // SAFETY: `rk` is the live consumer's handle; the metadata returned is a copy owned here,
    // destroyed below, and the member id it lends is copied before that.
    unsafe {
        let md = rdsys::rd_kafka_consumer_group_metadata(rk);
        if md.is_null() {
            return (-1, String::new());
        }
        let generation = rdsys::rd_kafka_consumer_group_metadata_generation_id(md);
        let id = rdsys::rd_kafka_consumer_group_metadata_member_id(md);
        let member = if id.is_null() {
            String::new()
        } else {
            CStr::from_ptr(id).to_string_lossy().into_owned()
        };
        rdsys::rd_kafka_consumer_group_metadata_destroy(md);
        (generation, member)
    }
}
