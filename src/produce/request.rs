//! The produce request: one message, or a batch with shared defaults.
//!
//! ```json
//! {"topic": "orders.out", "key": "o-1", "value": {"id": 1}, "headers": {"source": "wf"}}
//! {"topic": "orders.out", "transactional": true,
//!  "messages": [{"key": "o-1", "value": {"id": 1}}, {"key": "o-2", "value": {"id": 2}}]}
//! ```
//!
//! Formats: `value_format` is `schema_registry` (default when the connection has a registry,
//! else `json`), `json`, `string` or `bytes`; `key_format` defaults to `string` for a string
//! key and `json` otherwise. `value_schema` / `key_schema` pick the registered schema
//! (`subject`, `version`, `id`, Protobuf `message`); default: the latest under
//! `<topic>-value` / `<topic>-key`. A batch's top-level `topic`, formats and schemas apply to
//! messages that do not set their own.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value as Json;

use crate::codec::encode::{ProduceFormat, SchemaSelector};

/// One message to write, after batch defaults are applied.
#[derive(Clone, Debug, Default)]
pub struct MessageIn {
    /// Destination topic.
    pub topic: String,
    /// Key as JSON; `null` for none.
    pub key: Json,
    /// Value as JSON; `null` for a tombstone.
    pub value: Json,
    /// Header values (UTF-8), `null` for a header without value.
    pub headers: Vec<(String, Option<String>)>,
    /// Explicit partition.
    pub partition: Option<i32>,
    /// Create time, milliseconds since the epoch.
    pub timestamp: Option<i64>,
    /// Key format; `None` picks by the key's JSON type.
    pub key_format: Option<ProduceFormat>,
    /// Value format; `None` is the connection's default.
    pub value_format: Option<ProduceFormat>,
    /// Key schema selector.
    pub key_schema: SchemaSelector,
    /// Value schema selector.
    pub value_schema: SchemaSelector,
}

/// A parsed request.
#[derive(Clone, Debug, Default)]
pub struct ProduceRequest {
    /// The messages in order.
    pub messages: Vec<MessageIn>,
    /// All or nothing.
    pub transactional: bool,
    /// Whether the body was a batch (`messages`) rather than one message.
    pub batch: bool,
}

/// Why a body is not a request.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not JSON (400).
    #[error("the body is not valid JSON: {0}")]
    Syntax(String),
    /// JSON of the wrong shape (400).
    #[error("the request does not have the expected shape: {path}: {reason}")]
    Shape {
        /// Where.
        path: String,
        /// Why.
        reason: String,
    },
    /// More messages than allowed (413).
    #[error("the batch has {count} messages; the limit is {limit} (produce.max_batch_messages)")]
    TooMany {
        /// Messages sent.
        count: usize,
        /// The limit.
        limit: usize,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    key: Option<Json>,
    /// `Some(Null)` when the body says `"value": null` (a tombstone); `None` when absent.
    #[serde(default, deserialize_with = "present")]
    value: Option<Json>,
    #[serde(default)]
    headers: BTreeMap<String, Option<String>>,
    #[serde(default)]
    partition: Option<i32>,
    #[serde(default)]
    timestamp: Option<i64>,
    #[serde(default)]
    key_format: Option<ProduceFormat>,
    #[serde(default)]
    value_format: Option<ProduceFormat>,
    #[serde(default)]
    key_schema: Option<SchemaSelector>,
    #[serde(default)]
    value_schema: Option<SchemaSelector>,
    #[serde(default)]
    messages: Option<Vec<Wire>>,
    #[serde(default)]
    transactional: bool,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Json>, D::Error> {
    Json::deserialize(d).map(Some)
}

/// Parses a request body; `max_batch` bounds the number of messages.
pub fn parse_request(body: &[u8], max_batch: usize) -> Result<ProduceRequest, RequestError> {
    let json: Json =
        serde_json::from_slice(body).map_err(|e| RequestError::Syntax(e.to_string()))?;
    parse_value(&json, max_batch)
}

/// Like [`parse_request`] for a request already parsed as JSON.
pub fn parse_value(json: &Json, max_batch: usize) -> Result<ProduceRequest, RequestError> {
    let wire: Wire = serde_path_to_error::deserialize(json).map_err(|e| RequestError::Shape {
        path: crate::codec::avro_json::serde_path(e.path()),
        reason: e.into_inner().to_string(),
    })?;
    let shape = |path: String, reason: &str| RequestError::Shape {
        path,
        reason: reason.to_owned(),
    };
    match wire.messages {
        None => {
            if wire.transactional {
                return Err(shape(
                    "$.transactional".into(),
                    "applies to a batch (`messages`) only",
                ));
            }
            let m = message(&wire, None, "$").map_err(|(p, r)| shape(p, &r))?;
            Ok(ProduceRequest {
                messages: vec![m],
                transactional: false,
                batch: false,
            })
        }
        Some(ref items) => {
            if wire.key.is_some() || wire.value.is_some() || wire.partition.is_some() {
                return Err(shape(
                    "$".into(),
                    "a batch carries key, value and partition per message, under `messages`",
                ));
            }
            if items.is_empty() {
                return Err(shape("$.messages".into(), "is empty"));
            }
            if items.len() > max_batch {
                return Err(RequestError::TooMany {
                    count: items.len(),
                    limit: max_batch,
                });
            }
            let mut messages = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let path = format!("$.messages[{i}]");
                if item.messages.is_some() || item.transactional {
                    return Err(shape(path, "messages do not nest"));
                }
                messages.push(message(item, Some(&wire), &path).map_err(|(p, r)| shape(p, &r))?);
            }
            Ok(ProduceRequest {
                messages,
                transactional: wire.transactional,
                batch: true,
            })
        }
    }
}

fn message(w: &Wire, batch: Option<&Wire>, path: &str) -> Result<MessageIn, (String, String)> {
    let topic = w
        .topic
        .clone()
        .or_else(|| batch.and_then(|b| b.topic.clone()))
        .filter(|t| !t.is_empty())
        .ok_or_else(|| (format!("{path}.topic"), "is required".to_owned()))?;
    let value = w.value.clone().ok_or_else(|| {
        (
            format!("{path}.value"),
            "is required (null writes a tombstone)".to_owned(),
        )
    })?;
    let mut headers: Vec<(String, Option<String>)> = batch
        .map(|b| {
            b.headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    for (k, v) in &w.headers {
        headers.retain(|(hk, _)| hk != k);
        headers.push((k.clone(), v.clone()));
    }
    Ok(MessageIn {
        topic,
        key: w.key.clone().unwrap_or(Json::Null),
        value,
        headers,
        partition: w.partition,
        timestamp: w.timestamp,
        key_format: w.key_format.or_else(|| batch.and_then(|b| b.key_format)),
        value_format: w
            .value_format
            .or_else(|| batch.and_then(|b| b.value_format)),
        key_schema: w
            .key_schema
            .clone()
            .or_else(|| batch.and_then(|b| b.key_schema.clone()))
            .unwrap_or_default(),
        value_schema: w
            .value_schema
            .clone()
            .or_else(|| batch.and_then(|b| b.value_schema.clone()))
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_message_and_batches_with_defaults() {
        let r = parse_request(
            br#"{"topic":"t","key":"k","value":{"a":1},"headers":{"h":"v"}}"#,
            10,
        )
        .unwrap();
        assert!(!r.batch);
        assert_eq!(r.messages[0].topic, "t");
        assert_eq!(
            r.messages[0].headers,
            vec![("h".to_owned(), Some("v".to_owned()))]
        );
        let r = parse_request(
            br#"{"topic":"t","value_format":"json","transactional":true,
                 "messages":[{"key":"a","value":1},{"topic":"u","value":null,"value_format":"string"}]}"#,
            10,
        )
        .unwrap();
        assert!(r.batch && r.transactional);
        assert_eq!(r.messages[0].topic, "t");
        assert_eq!(r.messages[0].value_format, Some(ProduceFormat::Json));
        assert_eq!(r.messages[1].topic, "u");
        assert_eq!(r.messages[1].value_format, Some(ProduceFormat::String));
        assert!(r.messages[1].value.is_null());
    }

    #[test]
    fn refusals_say_where() {
        let e = parse_request(b"{\"topic\": ", 10).unwrap_err();
        assert!(matches!(e, RequestError::Syntax(_)), "{e}");
        let e = parse_request(br#"{"value":1}"#, 10).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the request does not have the expected shape: $.topic: is required"
        );
        let e = parse_request(br#"{"topic":"t","vaule":1}"#, 10).unwrap_err();
        assert!(e.to_string().contains("vaule"), "{e}");
        let e = parse_request(br#"{"topic":"t","messages":[{"value":1},{"key":"k"}]}"#, 10)
            .unwrap_err();
        assert!(
            e.to_string().contains("$.messages[1].value: is required"),
            "{e}"
        );
        let e =
            parse_request(br#"{"topic":"t","messages":[{"value":1},{"value":2}]}"#, 1).unwrap_err();
        assert!(matches!(e, RequestError::TooMany { count: 2, limit: 1 }));
        let e = parse_request(br#"{"topic":"t","value":1,"value_format":"xml"}"#, 1).unwrap_err();
        assert!(e.to_string().contains("$.value_format"), "{e}");
    }
}
