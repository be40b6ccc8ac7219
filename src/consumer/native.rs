//! The few librdkafka calls rust-rdkafka does not offer, each with what it is for:
//!
//! - [`commit_with_results`]: a synchronous commit that reports every partition's own result.
//!   `rd_kafka_commit` returns one error for the whole request (the last failing partition's,
//!   even when the others were stored), so one refused partition (a deleted topic, a missing
//!   topic ACL, metadata over the broker's limit) looked like a refusal of every partition.
//!   `rd_kafka_commit_queue` without a queue serves its callback in the call, with the list
//!   as the broker answered it.
//! - [`topic_ids`]: the topics' ids (KIP-516), which tell a topic deleted and created again
//!   under the same name from the one it replaced. librdkafka notices a new id only in a
//!   debug log line; its Admin API's `DescribeTopics` is the public way to read them.
//! - [`metadata_bytes`]: a committed offset's metadata as bytes. rust-rdkafka reads it as
//!   UTF-8 and panics on anything else, and the metadata is whatever any client of the group
//!   committed.
//!
//! Unsafe: librdkafka's C API through rdkafka-sys. Every pointer is used within the call that
//! received it, and every object created here is destroyed here.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{c_void, CStr, CString};
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::TopicPartitionList;

use crate::dispatch::event::TopicPartition;

/// One partition's answer to a commit request: None when stored, else the broker's or
/// librdkafka's error.
pub(crate) type PartitionResult = (TopicPartition, Option<RDKafkaErrorCode>);

/// What [`commit_with_results`] hands its callback: where to put the answer.
struct CommitAnswer {
    request: Option<RDKafkaErrorCode>,
    partitions: Vec<PartitionResult>,
}

unsafe extern "C" fn on_commit(
    _rk: *mut rdsys::rd_kafka_t,
    err: rdsys::rd_kafka_resp_err_t,
    offsets: *mut rdsys::rd_kafka_topic_partition_list_t,
    opaque: *mut c_void,
) {
    // SAFETY: `opaque` is the `CommitAnswer` that `commit_with_results` lent for the call that
    // serves this callback; `offsets` is librdkafka's list, valid during the callback.
    let answer = unsafe { &mut *opaque.cast::<CommitAnswer>() };
    answer.request = code(err);
    if offsets.is_null() {
        return;
    }
    let list = unsafe { &*offsets };
    if list.elems.is_null() {
        return;
    }
    let elems = unsafe { std::slice::from_raw_parts(list.elems, list.cnt.max(0) as usize) };
    for e in elems {
        if e.topic.is_null() {
            continue;
        }
        let topic = unsafe { CStr::from_ptr(e.topic) }
            .to_string_lossy()
            .into_owned();
        answer.partitions.push((
            TopicPartition {
                topic,
                partition: e.partition,
            },
            code(e.err),
        ));
    }
}

fn code(err: rdsys::rd_kafka_resp_err_t) -> Option<RDKafkaErrorCode> {
    (err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR).then(|| err.into())
}

/// Commits `tpl` synchronously (blocks until the broker answered) and returns the request's
/// error, if any, and each partition's own result. A partition the answer does not list
/// (the request failed as a whole before it was sent) carries the request's error.
pub(crate) fn commit_with_results<C: ClientContext>(
    client: &Client<C>,
    tpl: &TopicPartitionList,
) -> (Option<RDKafkaErrorCode>, Vec<PartitionResult>) {
    let mut answer = CommitAnswer {
        request: None,
        partitions: Vec::with_capacity(tpl.count()),
    };
    // SAFETY: the client and the list outlive the call; a null queue makes librdkafka serve
    // the callback within the call, so `answer` is not used after it returns.
    let err = unsafe {
        rdsys::rd_kafka_commit_queue(
            client.native_ptr(),
            tpl.ptr(),
            std::ptr::null_mut(),
            Some(on_commit),
            (&mut answer as *mut CommitAnswer).cast::<c_void>(),
        )
    };
    let request = code(err).or(answer.request);
    if answer.partitions.is_empty() {
        answer.partitions = tpl
            .elements()
            .iter()
            .map(|e| {
                let tp = TopicPartition {
                    topic: e.topic().to_owned(),
                    partition: e.partition(),
                };
                (tp, request)
            })
            .collect();
    }
    (request, answer.partitions)
}

/// A topic's id as Kafka prints it (URL-safe Base64 of its 16 bytes, no padding), or None
/// where the cluster has no topic ids (the zero id).
fn id_text(msb: i64, lsb: i64) -> Option<String> {
    use base64::Engine as _;
    if msb == 0 && lsb == 0 {
        return None;
    }
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&msb.to_be_bytes());
    bytes[8..].copy_from_slice(&lsb.to_be_bytes());
    Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The ids of `topics` (None for a topic the cluster gives no id; a topic that does not
/// exist is left out). One request, through the client's own connections.
pub(crate) fn topic_ids<C: ClientContext>(
    client: &Client<C>,
    topics: &[String],
    timeout: Duration,
) -> Result<BTreeMap<String, Option<String>>, KafkaError> {
    let names: Vec<CString> = topics
        .iter()
        .filter_map(|t| CString::new(t.as_str()).ok())
        .collect();
    let mut ptrs: Vec<*const std::ffi::c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let rk = client.native_ptr();
    let mut out = BTreeMap::new();
    // SAFETY: every object created below is destroyed before returning; the names outlive
    // the collection, which librdkafka copies.
    unsafe {
        let collection =
            rdsys::rd_kafka_TopicCollection_of_topic_names(ptrs.as_mut_ptr(), ptrs.len());
        let options = rdsys::rd_kafka_AdminOptions_new(
            rk,
            rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        );
        let mut errstr = [0 as std::ffi::c_char; 256];
        let _ = rdsys::rd_kafka_AdminOptions_set_request_timeout(
            options,
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        let queue = rdsys::rd_kafka_queue_new(rk);
        rdsys::rd_kafka_DescribeTopics(rk, collection, options, queue);
        // The request times out by itself; the margin covers its queueing.
        let event = rdsys::rd_kafka_queue_poll(queue, timeout_ms.saturating_add(1000));
        let result = if event.is_null() {
            Err(KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut))
        } else if let Some(e) = code(rdsys::rd_kafka_event_error(event)) {
            Err(KafkaError::AdminOp(e))
        } else {
            let res = rdsys::rd_kafka_event_DescribeTopics_result(event);
            let mut n = 0usize;
            let descs = if res.is_null() {
                std::ptr::null_mut()
            } else {
                rdsys::rd_kafka_DescribeTopics_result_topics(res, &mut n)
            };
            if !descs.is_null() {
                for &d in std::slice::from_raw_parts(descs, n) {
                    let err = rdsys::rd_kafka_TopicDescription_error(d);
                    if !err.is_null() && code(rdsys::rd_kafka_error_code(err)).is_some() {
                        continue;
                    }
                    let name = rdsys::rd_kafka_TopicDescription_name(d);
                    if name.is_null() {
                        continue;
                    }
                    let name = CStr::from_ptr(name).to_string_lossy().into_owned();
                    let id = rdsys::rd_kafka_TopicDescription_topic_id(d);
                    let id = if id.is_null() {
                        None
                    } else {
                        id_text(
                            rdsys::rd_kafka_Uuid_most_significant_bits(id),
                            rdsys::rd_kafka_Uuid_least_significant_bits(id),
                        )
                    };
                    let _ = out.insert(name, id);
                }
            }
            Ok(())
        };
        if !event.is_null() {
            rdsys::rd_kafka_event_destroy(event);
        }
        rdsys::rd_kafka_queue_destroy(queue);
        rdsys::rd_kafka_AdminOptions_destroy(options);
        rdsys::rd_kafka_TopicCollection_destroy(collection);
        result?;
    }
    Ok(out)
}

/// The metadata of `topic`/`partition` in `tpl`, as bytes (empty when absent).
pub(crate) fn metadata_bytes(tpl: &TopicPartitionList, topic: &str, partition: i32) -> Vec<u8> {
    let Some(elem) = tpl.find_partition(topic, partition) else {
        return Vec::new();
    };
    // rust-rdkafka's element wraps librdkafka's; its pointer is read, never kept.
    let ptr = tpl.ptr();
    // SAFETY: `ptr` is the list `tpl` owns; its elements live as long as `tpl`.
    unsafe {
        let list = &*ptr;
        if list.elems.is_null() {
            return Vec::new();
        }
        let elems = std::slice::from_raw_parts(list.elems, list.cnt.max(0) as usize);
        let Some(e) = elems.iter().find(|e| {
            e.partition == elem.partition()
                && !e.topic.is_null()
                && CStr::from_ptr(e.topic).to_bytes() == topic.as_bytes()
        }) else {
            return Vec::new();
        };
        if e.metadata.is_null() || e.metadata_size == 0 {
            return Vec::new();
        }
        std::slice::from_raw_parts(e.metadata.cast::<u8>(), e.metadata_size).to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_ids_print_as_kafka_does_and_the_zero_id_is_none() {
        assert_eq!(id_text(0, 0), None);
        // Kafka prints a Uuid as URL-safe Base64 without padding: 22 characters.
        let id = id_text(0x1234_5678_9abc_def0, -1).unwrap();
        assert_eq!(id.len(), 22);
        assert!(id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        assert_eq!(id, "EjRWeJq83vD__________w");
    }
}
