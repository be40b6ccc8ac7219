//! `envelope = "cloudevents"`: a record as a CloudEvents 1.0 event in HTTP binary content
//! mode, so any CloudEvents sink can be the dispatcher.
//!
//! The body is the decoded value (JSON for Avro, Protobuf, JSON Schema and JSON values; the
//! text of a `string` value; the record's bytes for `bytes`), with its media type in
//! `Content-Type`. The context attributes travel in `ce-*` headers:
//!
//! | header | value |
//! |---|---|
//! | `ce-specversion` | `1.0` |
//! | `ce-id` | the idempotency key (`kafka:<group>:<topic>:<partition>:<offset>`) |
//! | `ce-source` | `kafka://<first bootstrap server>/<topic>` |
//! | `ce-type` | `dispatcher.cloudevents_type` (default `dev.tessel.kafka.record`) |
//! | `ce-subject`, `ce-partitionkey` | the key (its text, or its JSON for a structured key); absent for a null key |
//! | `ce-time` | the record timestamp, RFC 3339; absent without one |
//! | `ce-kafkatopic`, `ce-kafkapartition`, `ce-kafkaoffset` | where the record is |
//!
//! `partitionkey` is the CloudEvents partitioning extension, which the Kafka protocol binding
//! maps to the record key. Values are percent-encoded as the HTTP binding asks (anything
//! outside printable ASCII, space, `"` and `%`). A batch trigger's batch goes
//! in structured batch mode (`application/cloudevents-batch+json`): a JSON array of events
//! with the same attributes as members ([`CloudEvents::structured`]).

use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use rdkafka::message::Message;
use serde_json::Value as Json;

use super::event::{self, EventRecord, EventSource};
use crate::codec::Decoded;
use crate::config::{DispatcherConfig, Envelope};

/// The body of a dispatch request for a record and the headers its envelope adds: the event
/// of docs/event.md and none (`tessel`), or a CloudEvent (`cloudevents`).
pub fn request(
    cloudevents: Option<&CloudEvents>,
    source: EventSource<'_>,
    record: &EventRecord<'_>,
) -> (Vec<u8>, HeaderMap) {
    match cloudevents {
        None => (event::render(source, record), HeaderMap::new()),
        Some(ce) => ce.render(&ce_record(record)),
    }
}

/// The CloudEvents `specversion` sent.
pub const SPEC_VERSION: &str = "1.0";

/// A trigger's CloudEvents settings.
#[derive(Clone, Debug)]
pub struct CloudEvents {
    /// `kafka://<first bootstrap server>/`.
    source_prefix: String,
    /// `ce-type`.
    event_type: String,
}

/// A record, as far as its CloudEvent depends on it.
#[derive(Clone, Copy, Debug)]
pub struct CeRecord<'a> {
    /// The idempotency key.
    pub id: &'a str,
    /// Topic.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Record timestamp, ms since the epoch.
    pub timestamp_ms: Option<i64>,
    /// The decoded key.
    pub key: &'a Json,
    /// The decoded value.
    pub value: &'a Decoded,
    /// The record's value bytes (the body of a `bytes` value).
    pub payload: Option<&'a [u8]>,
}

impl CloudEvents {
    /// The settings of a dispatcher with `envelope = "cloudevents"`; None for `tessel`.
    /// `bootstrap` is the connection's `bootstrap.servers`.
    pub fn for_dispatcher(config: &DispatcherConfig, bootstrap: &str) -> Option<Self> {
        (config.envelope == Envelope::Cloudevents).then(|| Self {
            source_prefix: format!(
                "kafka://{}/",
                bootstrap.split(',').next().unwrap_or_default().trim()
            ),
            event_type: config.cloudevents_type.clone(),
        })
    }

    /// The body and the headers of the request for `record`.
    pub fn render(&self, record: &CeRecord<'_>) -> (Vec<u8>, HeaderMap) {
        let (body, content_type, attributes) = self.binary_mode(record);
        let mut headers = HeaderMap::with_capacity(attributes.len() + 1);
        let _ = headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        for (name, value) in attributes {
            // Percent-encoded: always a valid header value.
            if let Ok(v) = HeaderValue::from_str(&value) {
                let _ = headers.insert(HeaderName::from_static(name), v);
            }
        }
        (body, headers)
    }

    /// The body, its media type and the `ce-*` headers (values percent-encoded). Pure.
    pub fn binary_mode(
        &self,
        r: &CeRecord<'_>,
    ) -> (Vec<u8>, &'static str, Vec<(&'static str, String)>) {
        let attributes = self
            .attributes(r)
            .into_iter()
            .map(|(name, value)| (name, percent_encode(&value)))
            .collect();
        let (body, content_type) = data(r);
        (body, content_type, attributes)
    }

    /// The context attributes of `r`, as `ce-<name>` and the value as is.
    fn attributes(&self, r: &CeRecord<'_>) -> Vec<(&'static str, String)> {
        let mut attributes = vec![
            ("ce-specversion", SPEC_VERSION.to_owned()),
            ("ce-id", r.id.to_owned()),
            ("ce-source", format!("{}{}", self.source_prefix, r.topic)),
            ("ce-type", self.event_type.clone()),
        ];
        if let Some(key) = key_text(r.key) {
            attributes.push(("ce-subject", key.clone()));
            attributes.push(("ce-partitionkey", key));
        }
        if let Some(ms) = r.timestamp_ms {
            attributes.push(("ce-time", crate::codec::rfc3339_millis(ms)));
        }
        attributes.push(("ce-kafkatopic", r.topic.to_owned()));
        attributes.push(("ce-kafkapartition", r.partition.to_string()));
        attributes.push(("ce-kafkaoffset", r.offset.to_string()));
        attributes
    }

    /// `r` as a structured-mode CloudEvent (a JSON object): the attributes of
    /// [`CloudEvents::binary_mode`] as members, `datacontenttype`, and the value in `data`
    /// (JSON or text) or `data_base64` (`bytes`). Pure.
    pub fn structured(&self, r: &CeRecord<'_>) -> Json {
        let mut event = serde_json::Map::new();
        for (name, value) in self.attributes(r) {
            let _ = event.insert(name["ce-".len()..].to_owned(), Json::String(value));
        }
        match (r.value.schema.format, &r.value.value) {
            ("string", Json::String(s)) => {
                let _ = event.insert("datacontenttype".into(), "text/plain; charset=utf-8".into());
                let _ = event.insert("data".into(), Json::String(s.clone()));
            }
            ("bytes", _) => {
                use base64::Engine as _;
                let _ = event.insert("datacontenttype".into(), "application/octet-stream".into());
                let _ = event.insert(
                    "data_base64".into(),
                    base64::engine::general_purpose::STANDARD
                        .encode(r.payload.unwrap_or_default())
                        .into(),
                );
            }
            (_, v) => {
                let _ = event.insert("datacontenttype".into(), "application/json".into());
                let _ = event.insert("data".into(), v.clone());
            }
        }
        Json::Object(event)
    }
}

/// The media type of a structured batch.
pub const BATCH_CONTENT_TYPE: &str = "application/cloudevents-batch+json";

/// A batch in structured batch mode: the JSON array of `events` and its headers.
pub fn structured_batch(events: &[Json]) -> (Vec<u8>, HeaderMap) {
    let body = serde_json::to_vec(events).unwrap_or_else(|_| b"[]".to_vec());
    let mut headers = HeaderMap::with_capacity(1);
    let _ = headers.insert(CONTENT_TYPE, HeaderValue::from_static(BATCH_CONTENT_TYPE));
    (body, headers)
}

/// A record's CloudEvents view (for a single event's request and for each event of a batch).
pub fn ce_record<'a>(record: &EventRecord<'a>) -> CeRecord<'a> {
    let msg = record.msg;
    CeRecord {
        id: record.id,
        topic: msg.topic(),
        partition: msg.partition(),
        offset: msg.offset(),
        timestamp_ms: msg.timestamp().to_millis(),
        key: &record.key.value,
        value: record.value,
        payload: msg.payload(),
    }
}

/// The body of a binary-mode event and its media type.
fn data(r: &CeRecord<'_>) -> (Vec<u8>, &'static str) {
    match (r.value.schema.format, &r.value.value) {
        ("string", Json::String(s)) => (s.as_bytes().to_vec(), "text/plain; charset=utf-8"),
        ("bytes", _) => (
            r.payload.unwrap_or_default().to_vec(),
            "application/octet-stream",
        ),
        (_, v) => (
            serde_json::to_vec(v).unwrap_or_else(|_| b"null".to_vec()),
            "application/json",
        ),
    }
}

/// The key as a CloudEvents string: its text, or its JSON; None for a null key.
fn key_text(key: &Json) -> Option<String> {
    match key {
        Json::Null => None,
        Json::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// Percent-encodes what the CloudEvents HTTP binding asks for in header values: bytes outside
/// printable ASCII, space, `"` and `%`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x21..=0x7e).contains(&b) && b != b'"' && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::SchemaInfo;
    use serde_json::json;

    fn ce() -> CloudEvents {
        let config: DispatcherConfig =
            toml::from_str("url = \"http://x/\"\nenvelope = \"cloudevents\"").unwrap();
        CloudEvents::for_dispatcher(&config, "b-1.kafka:9092, b-2.kafka:9092").unwrap()
    }

    fn decoded(format: &'static str, value: Json) -> Decoded {
        Decoded {
            value,
            schema: SchemaInfo {
                format,
                id: None,
                subject: None,
                version: None,
                name: None,
            },
        }
    }

    fn record<'a>(key: &'a Json, value: &'a Decoded, payload: Option<&'a [u8]>) -> CeRecord<'a> {
        CeRecord {
            id: "kafka:g:orders:2:17",
            topic: "orders",
            partition: 2,
            offset: 17,
            timestamp_ms: Some(1_700_000_000_123),
            key,
            value,
            payload,
        }
    }

    #[test]
    fn the_tessel_envelope_has_no_cloudevents() {
        let config: DispatcherConfig = toml::from_str("url = \"http://x/\"").unwrap();
        assert_eq!(config.envelope, Envelope::Tessel);
        assert!(CloudEvents::for_dispatcher(&config, "b:9092").is_none());
    }

    #[test]
    fn maps_a_record_to_binary_mode_headers() {
        let key = json!("ada lovelace");
        let value = decoded("avro", json!({"order_id": "o-1", "amount": 12.5}));
        let (body, content_type, attrs) = ce().binary_mode(&record(&key, &value, None));
        assert_eq!(content_type, "application/json");
        assert_eq!(
            serde_json::from_slice::<Json>(&body).unwrap(),
            json!({"order_id": "o-1", "amount": 12.5})
        );
        let attrs: std::collections::BTreeMap<_, _> = attrs.into_iter().collect();
        let expected: std::collections::BTreeMap<&str, String> = [
            ("ce-specversion", "1.0"),
            ("ce-id", "kafka:g:orders:2:17"),
            ("ce-source", "kafka://b-1.kafka:9092/orders"),
            ("ce-type", "dev.tessel.kafka.record"),
            ("ce-subject", "ada%20lovelace"),
            ("ce-partitionkey", "ada%20lovelace"),
            ("ce-time", "2023-11-14T22:13:20.123Z"),
            ("ce-kafkatopic", "orders"),
            ("ce-kafkapartition", "2"),
            ("ce-kafkaoffset", "17"),
        ]
        .into_iter()
        .map(|(k, v)| (k, v.to_owned()))
        .collect();
        assert_eq!(attrs, expected);
    }

    #[test]
    fn strings_bytes_null_keys_and_structured_keys() {
        let null = Json::Null;
        let text = decoded("string", json!("héllo"));
        let (body, ct, attrs) = ce().binary_mode(&record(&null, &text, Some("héllo".as_bytes())));
        assert_eq!(
            (body.as_slice(), ct),
            ("héllo".as_bytes(), "text/plain; charset=utf-8")
        );
        assert!(!attrs
            .iter()
            .any(|(k, _)| *k == "ce-subject" || *k == "ce-partitionkey"));

        let raw = [0xffu8, 0x00, 0x01];
        let bytes = decoded("bytes", json!("/wAB"));
        let key = json!({"order_id": 7});
        let (body, ct, attrs) = ce().binary_mode(&record(&key, &bytes, Some(&raw)));
        assert_eq!(
            (body.as_slice(), ct),
            (&raw[..], "application/octet-stream")
        );
        let subject = attrs.iter().find(|(k, _)| *k == "ce-subject").unwrap();
        assert_eq!(subject.1, "{%22order_id%22:7}");

        let tombstone = decoded("null", Json::Null);
        let (body, ct, _) = ce().binary_mode(&record(&key, &tombstone, None));
        assert_eq!((body.as_slice(), ct), (&b"null"[..], "application/json"));
    }

    #[test]
    fn header_values_are_percent_encoded() {
        assert_eq!(percent_encode("a b\"c%d"), "a%20b%22c%25d");
        assert_eq!(percent_encode("é\n"), "%C3%A9%0A");
        let (_, headers) = ce().render(&record(
            &json!("line\nbreak"),
            &decoded("json", json!({})),
            None,
        ));
        assert_eq!(headers["ce-subject"], "line%0Abreak");
        assert_eq!(headers[CONTENT_TYPE], "application/json");
    }

    /// On the wire, the envelope's `Content-Type` replaces the client's default
    /// (`application/json`) instead of joining it.
    #[tokio::test]
    async fn the_envelope_content_type_replaces_the_default_on_the_wire() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/events", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.ends_with(b"h\xc3\xa9llo") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "{}", String::from_utf8_lossy(&request));
                request.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                .await
                .unwrap();
            String::from_utf8(request).unwrap().to_ascii_lowercase()
        });
        let config: DispatcherConfig =
            toml::from_str(&format!("url = \"{url}\"\nenvelope = \"cloudevents\"")).unwrap();
        let dispatcher = crate::dispatch::HttpDispatcher::try_new(&config).unwrap();
        let key = json!("k");
        let text = decoded("string", json!("héllo"));
        let (body, envelope) = ce().render(&record(&key, &text, None));
        let request = crate::dispatch::DispatchRequest {
            key: "kafka:g:orders:2:17".to_owned(),
            body,
            envelope,
        };
        let (outcome, _) = dispatcher.send(request, None, false).await;
        assert_eq!(outcome.label(), "accepted");
        let request = server.await.unwrap();
        assert_eq!(request.matches("content-type:").count(), 1, "{request}");
        assert!(
            request.contains("content-type: text/plain; charset=utf-8\r\n"),
            "{request}"
        );
        assert!(
            request.contains("ce-id: kafka:g:orders:2:17\r\n"),
            "{request}"
        );
        assert!(
            request.contains("idempotency-key: kafka:g:orders:2:17\r\n"),
            "{request}"
        );
    }
}
