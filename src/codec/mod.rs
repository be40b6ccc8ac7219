//! Decoding of message keys and values into the event's JSON.
//!
//! Formats per trigger (`key_format`, `value_format`): `schema_registry` (Confluent wire
//! format: Avro, Protobuf, JSON Schema), `json`, `string`, `bytes`, or `auto`. Schemas are
//! resolved by id through [`registry::RegistryClient`] and cached; the pure parts (framing,
//! value mapping) live in [`wire`], [`avro`] and [`protobuf`].

mod avro;
pub mod avro_json;
pub mod encode;
pub mod headers;
mod protobuf;
pub mod registry;
mod time;
pub mod wire;

use std::sync::Arc;

use base64::Engine as _;
use serde::Serialize;
use serde_json::Value as Json;
use thiserror::Error;

use crate::config::PayloadFormat;
use registry::{CompiledSchema, RegistryClient, RegistryError};
use wire::WireError;

pub use avro::Limits;

/// Which part of a record is decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// The record key.
    Key,
    /// The record value.
    Value,
}

/// How a key or value was decoded: the `key_schema` / `value_schema` block of the event.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct SchemaInfo {
    /// `avro`, `protobuf`, `json_schema`, `json`, `string`, `bytes` or `null`.
    pub format: &'static str,
    /// Registry schema id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// Registry subject, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<Arc<str>>,
    /// Version within the subject, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    /// Full record or message name (Avro record, Protobuf message, JSON Schema title).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<Arc<str>>,
}

/// A decoded key or value.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    /// The JSON value.
    pub value: Json,
    /// How it was decoded.
    pub schema: SchemaInfo,
}

/// Why a key or value could not be decoded.
#[derive(Debug, Error)]
pub enum DecodeError {
    /// The framing is wrong.
    #[error("bad schema registry framing: {0}")]
    Wire(#[from] WireError),
    /// The registry could not provide the schema.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The payload does not match its schema or declared format.
    #[error("{format} payload does not decode: {reason}")]
    Payload {
        /// The format tried.
        format: &'static str,
        /// Why.
        reason: String,
    },
    /// The payload nests deeper, or holds more values, than the decoding limits allow
    /// ([`Limits`]): refused before it can exhaust the stack or memory.
    #[error("{format} payload exceeds a decoding limit: {reason}")]
    Limit {
        /// The format tried.
        format: &'static str,
        /// Which limit.
        reason: String,
    },
    /// Registry framing found but the connection has no registry configured.
    #[error("payload needs a schema registry but the connection has none")]
    NoRegistry,
}

/// What to do about a decode error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disposition {
    /// Wait and try again: the input may decode later (registry outage, schema not yet there).
    Retry,
    /// The message itself is bad: apply the trigger's error policy.
    Reject,
    /// Configuration is wrong (registry credentials): stop the trigger.
    Fatal,
}

impl DecodeError {
    /// Classifies the error.
    pub fn disposition(&self) -> Disposition {
        match self {
            Self::Registry(
                RegistryError::Unavailable(_)
                | RegistryError::SchemaNotFound { .. }
                | RegistryError::SubjectNotFound { .. },
            ) => Disposition::Retry,
            Self::Registry(RegistryError::Unauthorized { .. }) | Self::NoRegistry => {
                Disposition::Fatal
            }
            Self::Registry(RegistryError::Invalid { .. })
            | Self::Wire(_)
            | Self::Payload { .. }
            | Self::Limit { .. } => Disposition::Reject,
        }
    }

    /// The schema id the error is about, when there is one.
    pub fn schema_id(&self) -> Option<u32> {
        match self {
            Self::Registry(
                RegistryError::SchemaNotFound { id } | RegistryError::Invalid { id, .. },
            ) => Some(*id),
            _ => None,
        }
    }

    /// A stable class name for logs, headers and metric labels.
    pub fn class(&self) -> &'static str {
        match self {
            Self::Wire(_) => "wire_format",
            Self::Registry(
                RegistryError::SchemaNotFound { .. } | RegistryError::SubjectNotFound { .. },
            ) => "schema_not_found",
            Self::Registry(RegistryError::Unauthorized { .. }) => "registry_unauthorized",
            Self::Registry(RegistryError::Unavailable(_)) => "registry_unavailable",
            Self::Registry(RegistryError::Invalid { .. }) => "schema_invalid",
            Self::Payload { .. } => "payload",
            Self::Limit { .. } => "decode_limit",
            Self::NoRegistry => "no_registry",
        }
    }
}

/// Decodes keys and values for one connection.
#[derive(Clone, Debug)]
pub struct Decoder {
    registry: Option<Arc<RegistryClient>>,
    limits: Limits,
}

impl Decoder {
    /// A decoder using `registry` for framed payloads, with the default [`Limits`].
    pub fn new(registry: Option<Arc<RegistryClient>>) -> Self {
        Self {
            registry,
            limits: Limits::default(),
        }
    }

    /// Decodes `bytes` (None for a null key or a tombstone) per `format`.
    pub async fn decode(
        &self,
        format: PayloadFormat,
        bytes: Option<&[u8]>,
        topic: &str,
        field: Field,
    ) -> Result<Decoded, DecodeError> {
        let Some(bytes) = bytes else {
            return Ok(Decoded {
                value: Json::Null,
                schema: SchemaInfo {
                    format: "null",
                    ..SchemaInfo::default()
                },
            });
        };
        match format {
            PayloadFormat::SchemaRegistry => self.decode_framed(bytes, topic, field).await,
            PayloadFormat::Json => decode_json(bytes, &self.limits),
            PayloadFormat::String => decode_string(bytes),
            PayloadFormat::Bytes => Ok(decode_bytes(bytes)),
            PayloadFormat::Auto => {
                if self.registry.is_some() && wire::looks_framed(bytes) {
                    return self.decode_framed(bytes, topic, field).await;
                }
                if matches!(bytes.first(), Some(b'{' | b'[')) {
                    match decode_json(bytes, &self.limits) {
                        Ok(d) => return Ok(d),
                        Err(e @ DecodeError::Limit { .. }) => return Err(e),
                        Err(_) => {}
                    }
                }
                Ok(decode_string(bytes).unwrap_or_else(|_| decode_bytes(bytes)))
            }
        }
    }

    async fn decode_framed(
        &self,
        bytes: &[u8],
        topic: &str,
        field: Field,
    ) -> Result<Decoded, DecodeError> {
        let frame = wire::parse_frame(bytes)?;
        let registry = self.registry.as_ref().ok_or(DecodeError::NoRegistry)?;
        let schema = registry.schema(frame.schema_id).await?;
        self.decode_resolved(&schema, frame.body, topic, field)
    }

    /// Decodes the body of a framed payload written with `schema`.
    pub(crate) fn decode_resolved(
        &self,
        schema: &registry::ResolvedSchema,
        body: &[u8],
        topic: &str,
        field: Field,
    ) -> Result<Decoded, DecodeError> {
        let subject = schema.subject_for(topic, field == Field::Key);
        let mut info = SchemaInfo {
            format: schema.schema_type().as_str(),
            id: Some(schema.id),
            subject: subject.map(|s| s.subject.clone()),
            version: subject.map(|s| s.version),
            name: None,
        };
        let format = info.format;
        let value = match &schema.kind {
            CompiledSchema::Avro {
                schema,
                references,
                name,
            } => {
                let v =
                    avro::decode(schema, references, body, &self.limits).map_err(|r| match r {
                        avro::Refusal::Payload(reason) => DecodeError::Payload { format, reason },
                        avro::Refusal::Limit(reason) => DecodeError::Limit { format, reason },
                    })?;
                info.name = name.clone();
                v
            }
            CompiledSchema::Protobuf { file } => {
                let (path, body) = wire::read_message_indexes(body)?;
                let (name, v) = protobuf::decode(file, &path, body).map_err(|reason| {
                    // prost refuses messages nested past 100 levels before recursing further.
                    if reason.contains("recursion limit") {
                        DecodeError::Limit { format, reason }
                    } else {
                        DecodeError::Payload { format, reason }
                    }
                })?;
                check_shape(&v, body.len(), &self.limits, format)?;
                info.name = Some(Arc::from(name));
                v
            }
            CompiledSchema::Json {
                validator, title, ..
            } => {
                let v: Json = parse_json(body, format)?;
                check_shape(&v, body.len(), &self.limits, format)?;
                if let Some(e) = validator.iter_errors(&v).next() {
                    return Err(DecodeError::Payload {
                        format,
                        reason: format!(
                            "{}: {e}",
                            encode::pointer_to_path(e.instance_path.as_str())
                        ),
                    });
                }
                info.name = title.clone();
                v
            }
        };
        Ok(Decoded {
            value,
            schema: info,
        })
    }
}

/// Parses JSON; serde_json refuses nesting past 128 levels before recursing further.
fn parse_json(bytes: &[u8], format: &'static str) -> Result<Json, DecodeError> {
    serde_json::from_slice(bytes).map_err(|e| {
        if e.to_string().contains("recursion limit exceeded") {
            DecodeError::Limit {
                format,
                reason: e.to_string(),
            }
        } else {
            DecodeError::Payload {
                format,
                reason: e.to_string(),
            }
        }
    })
}

/// Enforces [`Limits`] on an already decoded value (Protobuf, JSON), without recursion.
fn check_shape(
    value: &Json,
    payload_len: usize,
    limits: &Limits,
    format: &'static str,
) -> Result<(), DecodeError> {
    let mut budget = limits.value_budget(payload_len);
    let mut stack: Vec<(&Json, usize)> = vec![(value, 0)];
    while let Some((v, depth)) = stack.pop() {
        budget = budget.checked_sub(1).ok_or_else(|| DecodeError::Limit {
            format,
            reason: "payload holds more values than its size allows".to_owned(),
        })?;
        let children: Box<dyn Iterator<Item = &Json>> = match v {
            Json::Array(a) => Box::new(a.iter()),
            Json::Object(o) => Box::new(o.values()),
            _ => continue,
        };
        if depth >= limits.max_depth {
            return Err(DecodeError::Limit {
                format,
                reason: format!("payload nests deeper than {} levels", limits.max_depth),
            });
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    Ok(())
}

fn decode_json(bytes: &[u8], limits: &Limits) -> Result<Decoded, DecodeError> {
    let value = parse_json(bytes, "json")?;
    check_shape(&value, bytes.len(), limits, "json")?;
    Ok(Decoded {
        value,
        schema: SchemaInfo {
            format: "json",
            ..SchemaInfo::default()
        },
    })
}

fn decode_string(bytes: &[u8]) -> Result<Decoded, DecodeError> {
    let s = std::str::from_utf8(bytes).map_err(|e| DecodeError::Payload {
        format: "string",
        reason: e.to_string(),
    })?;
    Ok(Decoded {
        value: Json::String(s.to_owned()),
        schema: SchemaInfo {
            format: "string",
            ..SchemaInfo::default()
        },
    })
}

fn decode_bytes(bytes: &[u8]) -> Decoded {
    Decoded {
        value: Json::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
        schema: SchemaInfo {
            format: "bytes",
            ..SchemaInfo::default()
        },
    }
}

/// Milliseconds since the epoch as RFC 3339 UTC with millisecond precision.
pub fn rfc3339_millis(ms: i64) -> String {
    time::timestamp(ms, 1_000, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoder() -> Decoder {
        Decoder::new(None)
    }

    #[tokio::test]
    async fn auto_picks_json_then_string_then_bytes() {
        let d = decoder();
        let j = d
            .decode(PayloadFormat::Auto, Some(br#"{"a":1}"#), "t", Field::Value)
            .await
            .unwrap();
        assert_eq!(j.schema.format, "json");
        let s = d
            .decode(PayloadFormat::Auto, Some(b"order-1"), "t", Field::Key)
            .await
            .unwrap();
        assert_eq!(s.value, Json::String("order-1".into()));
        let b = d
            .decode(PayloadFormat::Auto, Some(&[0xff, 0xfe]), "t", Field::Key)
            .await
            .unwrap();
        assert_eq!(
            (b.schema.format, b.value),
            ("bytes", Json::String("//4=".into()))
        );
        let n = d
            .decode(PayloadFormat::Auto, None, "t", Field::Key)
            .await
            .unwrap();
        assert_eq!(n.schema.format, "null");
    }

    /// What `decode_framed` does after the registry lookup, for a compiled schema.
    fn decode_compiled(
        schema: &registry::ResolvedSchema,
        body: &[u8],
    ) -> Result<Json, DecodeError> {
        let d = Decoder::new(None);
        d.decode_resolved(schema, body, "t", Field::Value)
            .map(|decoded| decoded.value)
    }

    fn compile(kind: registry::SchemaType, text: &str) -> registry::ResolvedSchema {
        registry::ResolvedSchema {
            id: 7,
            kind: registry::compile(7, kind, text, &[]).unwrap(),
            subjects: vec![],
        }
    }

    /// `Node { int32 v = 1; Node next = 2; }` nested `depth` deep, built back to front.
    fn nested_protobuf(depth: usize) -> Vec<u8> {
        let mut rev: Vec<u8> = vec![0x02, 0x08]; // innermost: v = 2, reversed
        for _ in 0..depth {
            let mut varint = Vec::new();
            let mut len = rev.len();
            while len >= 0x80 {
                varint.push((len as u8) | 0x80);
                len >>= 7;
            }
            varint.push(len as u8);
            rev.extend(varint.iter().rev());
            rev.push(0x12); // field 2, length-delimited
        }
        rev.reverse();
        rev
    }

    #[test]
    fn deep_protobuf_is_a_decode_limit_not_a_stack_overflow() {
        let kind = compile(
            registry::SchemaType::Protobuf,
            "syntax = \"proto3\"; message Node { int32 v = 1; Node next = 2; }",
        );
        let framed = |depth: usize| {
            let mut b = vec![0u8]; // message index [0]
            b.extend(nested_protobuf(depth));
            b
        };
        assert!(decode_compiled(&kind, &framed(3)).is_ok());
        for depth in [65, 99, 150, 200_000] {
            let e = decode_compiled(&kind, &framed(depth)).unwrap_err();
            assert_eq!(e.class(), "decode_limit", "depth {depth}: {e}");
            assert_eq!(e.disposition(), Disposition::Reject);
        }
    }

    #[test]
    fn an_avro_records_schema_block_is_shared_not_rebuilt_per_record() {
        let mut schema = compile(
            registry::SchemaType::Avro,
            r#"{"type":"record","name":"Order","namespace":"shop","fields":[
                {"name":"id","type":"long"},
                {"name":"next","type":["null","Order"]}]}"#,
        );
        schema.subjects = vec![registry::SubjectVersion {
            subject: "orders-value".into(),
            version: 3,
        }];
        let d = Decoder::new(None);
        // id 1, next: Order { id 2, next: null } (the union's second branch refers to the
        // record by name).
        let body = [0x02, 0x02, 0x04, 0x00];
        let first = d
            .decode_resolved(&schema, &body, "orders", Field::Value)
            .unwrap();
        let second = d
            .decode_resolved(&schema, &body, "orders", Field::Value)
            .unwrap();
        assert_eq!(
            first.value,
            serde_json::json!({"id": 1, "next": {"id": 2, "next": null}})
        );
        assert_eq!(first.schema.name.as_deref(), Some("shop.Order"));
        assert_eq!(first.schema.subject.as_deref(), Some("orders-value"));
        let (a, b) = (first.schema, second.schema);
        assert!(Arc::ptr_eq(
            a.name.as_ref().unwrap(),
            b.name.as_ref().unwrap()
        ));
        assert!(Arc::ptr_eq(
            a.subject.as_ref().unwrap(),
            b.subject.as_ref().unwrap()
        ));
    }

    #[test]
    fn deep_json_is_a_decode_limit() {
        let d = decoder();
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        assert!(decode_json(deep(60).as_bytes(), &d.limits).is_ok());
        for n in [70, 200, 200_000] {
            let e = decode_json(deep(n).as_bytes(), &d.limits).unwrap_err();
            assert_eq!(e.class(), "decode_limit", "depth {n}: {e}");
        }
    }

    #[test]
    fn json_schema_payloads_are_validated_on_consume_with_the_path() {
        let kind = compile(
            registry::SchemaType::Json,
            r#"{"type":"object","title":"Order","properties":{"id":{"type":"integer"},
                "lines":{"type":"array","items":{"type":"object","properties":{"qty":{"type":"integer"}}}}},
                "required":["id"]}"#,
        );
        assert_eq!(
            decode_compiled(&kind, br#"{"id":1,"lines":[{"qty":2}]}"#).unwrap(),
            serde_json::json!({"id":1,"lines":[{"qty":2}]})
        );
        let e = decode_compiled(&kind, br#"{"id":"x"}"#).unwrap_err();
        assert_eq!(
            (e.class(), e.disposition()),
            ("payload", Disposition::Reject)
        );
        assert!(e.to_string().contains("$.id"), "{e}");
        let e =
            decode_compiled(&kind, br#"{"id":1,"lines":[{"qty":2},{"qty":"many"}]}"#).unwrap_err();
        assert!(e.to_string().contains("$.lines[1].qty"), "{e}");
        let e = decode_compiled(&kind, br#"{"lines":[]}"#).unwrap_err();
        assert_eq!(e.class(), "payload", "{e}");
        let decoded = Decoder::new(None)
            .decode_resolved(&kind, br#"{"id":1}"#, "t", Field::Value)
            .unwrap();
        assert_eq!(decoded.schema.name.as_deref(), Some("Order"));
    }

    /// The cost per event of validating JSON Schema payloads on consume, printed (run with
    /// `cargo test --release --lib -- --ignored --nocapture json_schema_validation_cost`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn json_schema_validation_cost() {
        let schema = compile(
            registry::SchemaType::Json,
            r#"{"type":"object","properties":{"id":{"type":"integer"},"customer":{"type":"string"},
                "amount":{"type":"number","minimum":0},"currency":{"enum":["EUR","USD"]},
                "at":{"type":"string"},"lines":{"type":"array","items":{"type":"object",
                "properties":{"sku":{"type":"string"},"qty":{"type":"integer"}}}}},
                "required":["id","customer","amount"]}"#,
        );
        let body = br#"{"id":42,"customer":"c-1","amount":12.5,"currency":"EUR","at":"2026-12-03T08:00:00Z","lines":[{"sku":"a","qty":1},{"sku":"b","qty":2}]}"#;
        let n = 50_000;
        let d = Decoder::new(None);
        let t = std::time::Instant::now();
        for _ in 0..n {
            let _ = decode_json(body, &d.limits).unwrap();
        }
        let parse = t.elapsed();
        let t = std::time::Instant::now();
        for _ in 0..n {
            let _ = decode_compiled(&schema, body).unwrap();
        }
        let validated = t.elapsed();
        println!(
            "per event: parse and limits {:.2} µs, with JSON Schema validation {:.2} µs, validation {:.2} µs",
            parse.as_secs_f64() * 1e6 / n as f64,
            validated.as_secs_f64() * 1e6 / n as f64,
            (validated.as_secs_f64() - parse.as_secs_f64()) * 1e6 / n as f64
        );
    }

    #[tokio::test]
    async fn framed_without_registry_is_fatal_and_bad_frames_are_rejected() {
        let d = decoder();
        let refused = |format, bytes: &'static [u8]| {
            let d = &d;
            async move {
                let e = d.decode(format, Some(bytes), "t", Field::Value).await;
                e.unwrap_err().disposition()
            }
        };
        let framed = PayloadFormat::SchemaRegistry;
        assert_eq!(
            refused(framed, &[0, 0, 0, 0, 1, 2]).await,
            Disposition::Fatal
        );
        assert_eq!(refused(framed, &[7, 0, 0, 0, 1]).await, Disposition::Reject);
        assert_eq!(
            refused(PayloadFormat::String, &[0xff]).await,
            Disposition::Reject
        );
    }
}
