//! Entry points of the fuzz targets (`tests/fuzz`): the pure parts that see untrusted bytes
//! (framing, the three decoders with any registered schema, the dispatcher's answers, record
//! headers, commit metadata, trigger filters). Each must return, whatever its input: never panic, overflow the
//! stack or allocate without bound. A crash found by fuzzing becomes a unit test.

use std::collections::HashMap;
use std::rc::Rc;

use serde_json::Value as Json;

use crate::codec::registry::{self, ResolvedSchema, SchemaType};
use crate::codec::{wire, DecodeError, Decoder, Field};

/// Decodes `payload` (a framed body without the 5-byte header: Protobuf bodies start with
/// their message indexes) written with the schema `schema_text` of `schema_type`, as the
/// consumer does. None when the schema itself does not compile (the registry would have
/// refused it, and the connector reports it as `schema_invalid`).
pub fn decode_with_schema(
    schema_type: SchemaType,
    schema_text: &str,
    payload: &[u8],
) -> Option<Result<Json, DecodeError>> {
    // Compiled schemas are kept (as the registry client keeps them per id), so the fuzzer
    // spends its time on payloads rather than on compiling the same schema again. A few only:
    // compiled validators and descriptor pools are large, and 512 of them exhausted the fuzz
    // run's 2 GiB.
    type Compiled = HashMap<(SchemaType, String), Option<Rc<ResolvedSchema>>>;
    thread_local! {
        static COMPILED: std::cell::RefCell<Compiled> = std::cell::RefCell::new(HashMap::new());
    }
    let schema = COMPILED.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.len() >= 16 {
            cache.clear();
        }
        cache
            .entry((schema_type, schema_text.to_owned()))
            .or_insert_with(|| {
                let kind = registry::compile(1, schema_type, schema_text, &[]).ok()?;
                Some(Rc::new(ResolvedSchema {
                    id: 1,
                    kind,
                    subjects: Vec::new(),
                }))
            })
            .clone()
    })?;
    Some(
        Decoder::new(None)
            .decode_resolved(&schema, payload, "fuzz", Field::Value)
            .map(|d| d.value),
    )
}

/// The Confluent framing of a whole record: magic byte, schema id, message indexes.
pub fn framing(bytes: &[u8]) {
    let _ = wire::looks_framed(bytes);
    if let Ok(frame) = wire::parse_frame(bytes) {
        let _ = wire::read_message_indexes(frame.body);
    }
    let _ = wire::read_message_indexes(bytes);
}

/// Schema-less formats (`json`, `string`, `bytes`, `auto` without a registry).
pub fn schemaless(bytes: &[u8]) {
    let d = Decoder::new(None);
    for format in [
        crate::config::PayloadFormat::Json,
        crate::config::PayloadFormat::String,
        crate::config::PayloadFormat::Bytes,
    ] {
        let _ = futures::executor::block_on(d.decode(format, Some(bytes), "fuzz", Field::Value));
    }
}

/// What the connector does with a dispatcher's `Retry-After`, a record's `traceparent` and an
/// error text that may carry URLs.
pub fn dispatcher_answer(text: &str) {
    let backoff = crate::dispatch::retry::Backoff::new(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(30),
    );
    if let Some(d) = crate::dispatch::retry::parse_retry_after(text, std::time::SystemTime::now()) {
        let wait = backoff.delay(3, Some(d), 0.5);
        let _ = tokio::time::Instant::now().checked_add(wait);
        assert!(wait <= std::time::Duration::from_secs(300));
    }
    let headers = [crate::dispatch::event::EventHeader {
        name: "traceparent".into(),
        name_encoding: "utf8",
        value: Some(text.to_owned()),
        encoding: "utf8",
    }];
    if let Some(tp) = crate::dispatch::event::traceparent(&headers) {
        assert!(reqwest::header::HeaderValue::from_str(tp).is_ok(), "{tp:?}");
    }
    let redacted = crate::config::redact_text(text);
    assert!(!redacted.is_empty() || text.is_empty());
}

/// Commit metadata written by another member (or anyone with WRITE on the group): read as a
/// well-formed map of at most `MAX_METADATA_OFFSETS` offsets above `offset`, with the topic id
/// it names (`tk3`), or refused; the map read is written again exactly with the same id
/// (within the longest metadata), and a tracker loaded with it runs and tells its id from
/// another.
pub fn commit_metadata(offset: i64, metadata: &str) {
    use crate::core::offset_codec::{self, MAX_METADATA_CHARS, MAX_METADATA_OFFSETS};
    let Ok(committed) = offset_codec::decode_committed(offset, metadata) else {
        let mut t = crate::core::offsets::OffsetTracker::from_committed(Some(offset), metadata);
        assert!(offset < 0 || t.metadata_refused().is_some() || metadata.is_empty());
        let _ = t.take_new_commit();
        return;
    };
    let (topic_id, map) = (committed.topic_id, committed.handled);
    assert!(topic_id.is_none_or(offset_codec::valid_topic_id));
    assert_eq!(
        topic_id.is_some(),
        metadata.starts_with(offset_codec::ID_PREFIX)
    );
    let mut last = offset;
    for &(s, e) in map.ranges() {
        assert!(s > last && s < e, "{map:?}");
        last = e;
    }
    assert!(map.len() as i64 <= MAX_METADATA_OFFSETS);
    let runs = offset_codec::runs_of(offset, map.ranges().iter().copied());
    let (again, cut) = offset_codec::encode_with_id(topic_id, offset, &runs, MAX_METADATA_CHARS);
    if !cut {
        let back = offset_codec::decode_committed(offset, &again);
        let back = back.as_ref().map(|c| (&c.handled, c.topic_id));
        // The id is left out only when the map does not fit whole with it.
        if back.is_ok_and(|(_, id)| id.is_none()) && topic_id.is_some() {
            assert!(again.len() + offset_codec::topic_id_len(topic_id) > MAX_METADATA_CHARS);
            assert_eq!(back.map(|(m, _)| m), Ok(&map));
        } else {
            assert_eq!(back, Ok((&map, topic_id)));
        }
    }
    if offset < 0 {
        return;
    }
    let mut t = crate::core::offsets::OffsetTracker::from_committed(Some(offset), metadata);
    assert_eq!(t.committed_topic_id().map(|i| &**i), topic_id);
    assert!(!t.committed_under_other_topic(topic_id));
    assert_eq!(
        t.committed_under_other_topic(Some("another-id")),
        topic_id.is_some_and(|i| i != "another-id")
    );
    let _ = t.received(offset);
    for o in map.iter().take(64) {
        assert_eq!(
            t.received(o),
            crate::core::offsets::Received::AlreadyAccepted
        );
    }
    let _ = t.map_fits(1, 1);
    t.handled(offset);
    let _ = t.take_new_commit();
}

/// A trigger's filter as a configuration may hold it (compiled at load; a hostile or mistaken
/// expression must be a configuration error, never a crash), evaluated on a record whose
/// value is `value` (JSON text, or the text itself as a string).
pub fn filter(expression: &str, value: &str) {
    use crate::config::filter::{Filter, FilterError, FilterInput, MAX_LEN};
    use crate::dispatch::event::EventHeader;
    let filter = match Filter::compile(expression) {
        Ok(filter) => filter,
        Err(FilterError::TooLong { len, .. }) => {
            assert!(len > MAX_LEN);
            return;
        }
        Err(_) => return,
    };
    assert_eq!(filter.source(), expression);
    let value = serde_json::from_str(value).unwrap_or_else(|_| Json::String(value.to_owned()));
    let key = Json::String("k".to_owned());
    let headers = [
        EventHeader {
            name: "source".to_owned(),
            name_encoding: "utf8",
            value: Some(value.to_string()),
            encoding: "utf8",
        },
        EventHeader {
            name: "bin".to_owned(),
            name_encoding: "utf8",
            value: Some("/w==".to_owned()),
            encoding: "base64",
        },
    ];
    let _ = filter.evaluate(&FilterInput {
        key: &key,
        value: &value,
        headers: &headers,
        topic: "payments",
        partition: 3,
        offset: 42,
        timestamp_ms: Some(1_700_000_000_123),
    });
}
