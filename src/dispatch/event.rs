//! The event a message becomes: what the run dispatcher receives. The contract is written
//! down in `docs/event.md` and `docs/event.schema.json`.

use base64::Engine as _;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::Timestamp;
use serde::Serialize;
use serde_json::Value as Json;

use crate::codec::{Decoded, SchemaInfo};

pub use crate::core::types::TopicPartition;

/// One record header. Order and duplicates are kept.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct EventHeader {
    /// Header name: UTF-8 text, or base64 when not valid UTF-8 (Kafka does not check names).
    pub name: String,
    /// `base64` for a name that is not UTF-8; left out of the JSON for a UTF-8 name.
    #[serde(skip_serializing_if = "is_utf8")]
    pub name_encoding: &'static str,
    /// The value: UTF-8 text, or base64 when not valid UTF-8; null when the header has none.
    pub value: Option<String>,
    /// `utf8` or `base64`.
    pub encoding: &'static str,
}

fn is_utf8(encoding: &&'static str) -> bool {
    *encoding == UTF8
}

impl crate::config::filter::FilterHeader for EventHeader {
    fn name(&self) -> &str {
        &self.name
    }

    fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    fn base64(&self) -> bool {
        self.encoding == BASE64
    }
}

/// The members an event and a batch begin with, in this order (docs/event.md).
#[derive(Clone, Debug, Serialize)]
pub struct Lead<'a> {
    /// The idempotency key: stable for this record (or batch) in this consumer group; a
    /// batch's is also its `Idempotency-Key` header.
    pub id: &'a str,
    /// `connection`, `trigger` and `workflow`, members of the event (or batch) itself.
    #[serde(flatten)]
    pub source: EventSource<'a>,
    /// Topic.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
}

/// The JSON body POSTed to the run dispatcher.
#[derive(Clone, Debug, Serialize)]
pub struct Event<'a> {
    /// `id`, `connection`, `trigger`, `workflow`, `topic` and `partition`.
    #[serde(flatten)]
    pub lead: Lead<'a>,
    /// Offset.
    pub offset: i64,
    /// Record timestamp, RFC 3339 with milliseconds, UTC; null when the record has none.
    pub timestamp: Option<String>,
    /// Record timestamp in milliseconds since the epoch.
    pub timestamp_ms: Option<i64>,
    /// `create_time`, `log_append_time` or `not_available`.
    pub timestamp_type: &'static str,
    /// The decoded key.
    pub key: &'a Json,
    /// How the key was decoded.
    pub key_schema: &'a SchemaInfo,
    /// The record headers.
    pub headers: &'a [EventHeader],
    /// The decoded value.
    pub value: &'a Json,
    /// How the value was decoded.
    pub value_schema: &'a SchemaInfo,
}

/// Where an event came from and what it is called: the `connection`, `trigger` and
/// `workflow` members of an event and of a batch.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct EventSource<'a> {
    /// Connection name.
    pub connection: &'a str,
    /// Trigger name.
    pub trigger: &'a str,
    /// Workflow to start.
    pub workflow: &'a str,
}

/// The idempotency key of a record: the same on every redelivery to this group, and another
/// for a record of a topic deleted and created again under the same name (see [`key_topic`]).
pub fn idempotency_key(
    group: &str,
    topic: &str,
    topic_id: Option<&str>,
    partition: i32,
    offset: i64,
) -> String {
    // Built in one allocation of its exact length: this runs for every record, and
    // `format!` (twice, with `key_topic`) cost more than the rest of the record's
    // bookkeeping.
    let (mut p, mut o) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (partition, offset) = (p.format(partition), o.format(offset));
    let id_len = topic_id.map_or(0, |id| id.len() + 1);
    let mut key = String::with_capacity(
        "kafka:".len() + group.len() + topic.len() + id_len + partition.len() + offset.len() + 3,
    );
    key.push_str("kafka:");
    key.push_str(group);
    key.push(':');
    key.push_str(topic);
    if let Some(id) = topic_id {
        key.push('@');
        key.push_str(id);
    }
    key.push(':');
    key.push_str(partition);
    key.push(':');
    key.push_str(offset);
    key
}

/// The topic as idempotency keys name it: `<topic>@<topic id>` where the cluster has topic
/// ids (KIP-516; `@` is not allowed in topic names), else the name alone. A topic deleted and
/// created again under the same name gets a new id, so its records are not taken for the
/// old topic's by a dispatcher that remembers keys.
pub fn key_topic<'a>(topic: &'a str, topic_id: Option<&str>) -> std::borrow::Cow<'a, str> {
    match topic_id {
        Some(id) => std::borrow::Cow::Owned(format!("{topic}@{id}")),
        None => std::borrow::Cow::Borrowed(topic),
    }
}

/// The headers of a record, in order, duplicates kept. Names and values that are not UTF-8
/// are carried in base64 (read as bytes: see [`crate::codec::headers`]).
pub fn headers_of(msg: &OwnedMessage) -> Vec<EventHeader> {
    crate::codec::headers::raw_headers(msg)
        .map(|h| {
            let (name, name_encoding) = text_or_base64(h.name);
            let (value, encoding) = match h.value.map(text_or_base64) {
                None => (None, UTF8),
                Some((v, e)) => (Some(v), e),
            };
            EventHeader {
                name,
                name_encoding,
                value,
                encoding,
            }
        })
        .collect()
}

const UTF8: &str = "utf8";
const BASE64: &str = "base64";

/// `bytes` as text when they are UTF-8, else in base64, with the encoding's name.
fn text_or_base64(bytes: &[u8]) -> (String, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(s) => (s.to_owned(), UTF8),
        Err(_) => (
            base64::engine::general_purpose::STANDARD.encode(bytes),
            BASE64,
        ),
    }
}

/// The last `traceparent` header of a record, as it is.
fn raw_traceparent(headers: &[EventHeader]) -> Option<&EventHeader> {
    headers
        .iter()
        .rev()
        .find(|h| h.name.eq_ignore_ascii_case("traceparent"))
}

/// The record's W3C `traceparent`, when it is valid trace context (W3C Trace Context §3.2):
/// `version-traceid-parentid-flags` in lowercase hex, version not `ff`, ids not all zeros,
/// exactly 55 characters for version `00`; a later version may append `-…`, of which only the
/// first 55 characters are passed on. Anything else is ignored, as W3C says.
pub fn traceparent(headers: &[EventHeader]) -> Option<&str> {
    let h = raw_traceparent(headers)?;
    if h.encoding != "utf8" {
        return None;
    }
    valid_traceparent(h.value.as_deref()?)
}

/// Whether the record carries a `traceparent` header that [`traceparent`] ignores.
pub fn has_invalid_traceparent(headers: &[EventHeader]) -> bool {
    raw_traceparent(headers).is_some() && traceparent(headers).is_none()
}

fn valid_traceparent(v: &str) -> Option<&str> {
    let b = v.as_bytes();
    let hex = |s: &[u8]| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let zeros = |s: &[u8]| s.iter().all(|&c| c == b'0');
    if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let (version, trace, parent, flags) = (&b[0..2], &b[3..35], &b[36..52], &b[53..55]);
    if !(hex(version) && hex(trace) && hex(parent) && hex(flags)) || version == b"ff" {
        return None;
    }
    if zeros(trace) || zeros(parent) {
        return None;
    }
    match (version, b.len()) {
        (b"00", 55) => Some(v),
        (b"00", _) => None,
        (_, 55) => Some(v),
        (_, _) if b[55] == b'-' => Some(&v[..55]),
        _ => None,
    }
}

/// A decoded record, as its event (or CloudEvent) is rendered from it.
#[derive(Clone, Copy, Debug)]
pub struct EventRecord<'a> {
    /// The idempotency key.
    pub id: &'a str,
    /// The record.
    pub msg: &'a OwnedMessage,
    /// Its headers ([`headers_of`]).
    pub headers: &'a [EventHeader],
    /// The decoded key.
    pub key: &'a Decoded,
    /// The decoded value.
    pub value: &'a Decoded,
}

/// Serialises the event for `record`.
pub fn render(source: EventSource<'_>, record: &EventRecord<'_>) -> Vec<u8> {
    let EventRecord {
        id,
        msg,
        headers,
        key,
        value,
    } = *record;
    let (timestamp_ms, timestamp_type) = match msg.timestamp() {
        Timestamp::NotAvailable => (None, "not_available"),
        Timestamp::CreateTime(t) => (Some(t), "create_time"),
        Timestamp::LogAppendTime(t) => (Some(t), "log_append_time"),
    };
    let event = Event {
        lead: Lead {
            id,
            source,
            topic: msg.topic(),
            partition: msg.partition(),
        },
        offset: msg.offset(),
        timestamp: timestamp_ms.map(crate::codec::rfc3339_millis),
        timestamp_ms,
        timestamp_type,
        key: &key.value,
        key_schema: &key.schema,
        headers,
        value: &value.value,
        value_schema: &value.schema,
    };
    // Sized for the usual event (envelope, headers, the decoded value as JSON) so that the
    // body is written without growing.
    let estimate = 512
        + 2 * (msg.payload().map_or(0, <[u8]>::len) + msg.key().map_or(0, <[u8]>::len))
        + headers
            .iter()
            .map(|h| 32 + h.name.len() + h.value.as_ref().map_or(0, String::len))
            .sum::<usize>();
    let mut body = Vec::with_capacity(estimate);
    match serde_json::to_writer(&mut body, &event) {
        Ok(()) => body,
        Err(_) => b"{}".to_vec(),
    }
}

/// What a batch request says of itself, besides its events.
#[derive(Clone, Debug, Serialize)]
pub struct BatchHead<'a> {
    /// `id`, `connection`, `trigger`, `workflow`, `topic` and `partition`.
    #[serde(flatten)]
    pub lead: Lead<'a>,
    /// The first event's offset.
    pub first_offset: i64,
    /// The last event's offset.
    pub last_offset: i64,
    /// How many events follow.
    pub count: usize,
}

/// The body of a batch request: the head's members and `events`, the events of
/// [`render`] in offset order (spliced as they are, not parsed again).
pub fn render_batch(head: &BatchHead<'_>, events: &[Vec<u8>]) -> Vec<u8> {
    let mut body = serde_json::to_vec(head).unwrap_or_else(|_| b"{}".to_vec());
    let size = events.iter().map(|e| e.len() + 1).sum::<usize>() + 16;
    body.reserve(size);
    // Replace the closing brace by the events member.
    let _ = body.pop();
    body.extend_from_slice(b",\"events\":[");
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(e);
    }
    body.extend_from_slice(b"]}");
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idempotency_key_names_group_topic_id_partition_and_offset() {
        for (topic_id, partition, offset) in [
            (None, 0, 0),
            (Some("AbC-_9xyz0123456789abc"), 7, 1_234_567),
            (None, i32::MAX, i64::MAX),
            (Some("x"), -1, -1001),
        ] {
            let topic = key_topic("orders.v2", topic_id);
            assert_eq!(
                idempotency_key("grp", "orders.v2", topic_id, partition, offset),
                format!("kafka:grp:{topic}:{partition}:{offset}")
            );
        }
        assert_eq!(
            idempotency_key("g", "t", Some("id"), 0, 3),
            "kafka:g:t@id:0:3"
        );
    }

    fn header(value: &str) -> Vec<EventHeader> {
        vec![EventHeader {
            name: "traceparent".into(),
            name_encoding: "utf8",
            value: Some(value.into()),
            encoding: "utf8",
        }]
    }

    /// The members an event and a batch begin with, in this order (docs/event.md).
    const LEADING_MEMBERS: [&str; 6] = [
        "id",
        "connection",
        "trigger",
        "workflow",
        "topic",
        "partition",
    ];

    fn members(v: &Json) -> Vec<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    #[test]
    fn an_event_has_its_members_in_the_documented_order() {
        let msg = OwnedMessage::new(
            Some(b"{}".to_vec()),
            Some(b"k".to_vec()),
            "t".into(),
            Timestamp::CreateTime(1_700_000_000_123),
            0,
            3,
            None,
        );
        let decoded = |value: Json| Decoded {
            value,
            schema: SchemaInfo {
                format: "json",
                id: None,
                subject: None,
                version: None,
                name: None,
            },
        };
        let source = EventSource {
            connection: "c",
            trigger: "tr",
            workflow: "w",
        };
        let body = render(
            source,
            &EventRecord {
                id: "kafka:g:t:0:3",
                msg: &msg,
                headers: &[],
                key: &decoded(Json::from("k")),
                value: &decoded(serde_json::json!({})),
            },
        );
        let v: Json = serde_json::from_slice(&body).unwrap();
        let after = [
            "offset",
            "timestamp",
            "timestamp_ms",
            "timestamp_type",
            "key",
            "key_schema",
            "headers",
            "value",
            "value_schema",
        ];
        assert_eq!(members(&v), [&LEADING_MEMBERS[..], &after].concat());
        assert_eq!(
            (v["connection"].as_str(), v["workflow"].as_str()),
            (Some("c"), Some("w"))
        );
    }

    #[test]
    fn a_batch_body_is_its_head_and_its_events() {
        let head = BatchHead {
            lead: Lead {
                id: "kafka:g:t:0:3-4:2",
                source: EventSource {
                    connection: "c",
                    trigger: "tr",
                    workflow: "w",
                },
                topic: "t",
                partition: 0,
            },
            first_offset: 3,
            last_offset: 4,
            count: 2,
        };
        let body = render_batch(
            &head,
            &[br#"{"id":"a"}"#.to_vec(), br#"{"id":"b"}"#.to_vec()],
        );
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["id"], "kafka:g:t:0:3-4:2");
        assert_eq!(v["count"], 2);
        // The members in the documented order, the source's among them.
        let after = ["first_offset", "last_offset", "count", "events"];
        assert_eq!(members(&v), [&LEADING_MEMBERS[..], &after].concat());
        assert_eq!(v["events"][1]["id"], "b");
    }

    #[test]
    fn traceparent_follows_w3c_rules() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(traceparent(&header(ok)), Some(ok));
        assert!(!has_invalid_traceparent(&header(ok)));
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert_eq!(traceparent(&header(later)), Some(&later[..55]));
        for bad in [
            // 55 bytes ending in a newline: HTTP cannot carry it.
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\n",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
            "",
        ] {
            assert_eq!(traceparent(&header(bad)), None, "{bad:?}");
            assert!(has_invalid_traceparent(&header(bad)), "{bad:?}");
        }
        assert!(!has_invalid_traceparent(&[]));
    }

    #[test]
    fn a_filter_reads_the_events_headers_as_text_bytes_or_null() {
        use crate::config::filter::{Filter, FilterInput, Verdict};
        use rdkafka::message::{Header, OwnedHeaders};
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "source",
                value: Some("checkout"),
            })
            .insert(Header {
                key: "bin",
                value: Some(&[0xff_u8][..]),
            })
            .insert(Header::<&str> {
                key: "none",
                value: None,
            });
        let msg = OwnedMessage::new(
            None,
            None,
            "t".into(),
            Timestamp::NotAvailable,
            0,
            0,
            Some(headers),
        );
        let headers = headers_of(&msg);
        let input = FilterInput {
            key: &Json::Null,
            value: &Json::Null,
            headers: &headers,
            topic: "t",
            partition: 0,
            offset: 0,
            timestamp_ms: None,
        };
        let filter = Filter::compile(
            r#"headers.source == "checkout" && headers.bin == b'\xff' && headers.none == null"#,
        )
        .unwrap();
        assert_eq!(filter.evaluate(&input), Verdict::Match);
    }
}
