//! Decoding of message keys and values into the event's JSON.
//!
//! Formats per trigger (`key_format`, `value_format`): `schema_registry` (Confluent wire
//! format: Avro, Protobuf, JSON Schema), `json`, `string`, `bytes`, or `auto`. Schemas are
//! resolved by id through [`registry::RegistryClient`] and cached; the pure parts (framing,
//! value mapping) live in [`wire`], [`avro`] and [`protobuf`].

mod avro;
pub mod avro_json;
pub mod encode;
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

/// Largest single allocation apache-avro may make while decoding (a bytes or string field).
const MAX_AVRO_ALLOCATION: usize = 32 * 1024 * 1024;

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
    pub subject: Option<String>,
    /// Version within the subject, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    /// Full record or message name (Avro record, Protobuf message, JSON Schema title).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
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
            | Self::Payload { .. } => Disposition::Reject,
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
            Self::NoRegistry => "no_registry",
        }
    }
}

/// Decodes keys and values for one connection.
#[derive(Clone, Debug)]
pub struct Decoder {
    registry: Option<Arc<RegistryClient>>,
}

impl Decoder {
    /// A decoder using `registry` for framed payloads.
    pub fn new(registry: Option<Arc<RegistryClient>>) -> Self {
        // A corrupt length prefix must not make apache-avro allocate without bound.
        let _ = apache_avro::util::max_allocation_bytes(MAX_AVRO_ALLOCATION);
        Self { registry }
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
            PayloadFormat::Json => decode_json(bytes),
            PayloadFormat::String => decode_string(bytes),
            PayloadFormat::Bytes => Ok(decode_bytes(bytes)),
            PayloadFormat::Auto => {
                if self.registry.is_some() && wire::looks_framed(bytes) {
                    return self.decode_framed(bytes, topic, field).await;
                }
                if matches!(bytes.first(), Some(b'{' | b'[')) {
                    if let Ok(d) = decode_json(bytes) {
                        return Ok(d);
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
        let subject = schema.subject_for(topic, field == Field::Key);
        let mut info = SchemaInfo {
            format: schema.schema_type().as_str(),
            id: Some(schema.id),
            subject: subject.map(|s| s.subject.clone()),
            version: subject.map(|s| s.version),
            name: None,
        };
        let payload_err = |reason: String| DecodeError::Payload {
            format: info.format,
            reason,
        };
        let value = match &schema.kind {
            CompiledSchema::Avro { schema, references } => {
                let v = avro::decode(schema, references, frame.body).map_err(payload_err)?;
                info.name = avro::schema_name(schema);
                v
            }
            CompiledSchema::Protobuf { file } => {
                let (path, body) = wire::read_message_indexes(frame.body)?;
                let (name, v) = protobuf::decode(file, &path, body).map_err(payload_err)?;
                info.name = Some(name);
                v
            }
            CompiledSchema::Json { schema } => {
                let v: Json =
                    serde_json::from_slice(frame.body).map_err(|e| payload_err(e.to_string()))?;
                info.name = schema
                    .get("title")
                    .and_then(Json::as_str)
                    .map(str::to_owned);
                v
            }
        };
        Ok(Decoded {
            value,
            schema: info,
        })
    }
}

fn decode_json(bytes: &[u8]) -> Result<Decoded, DecodeError> {
    let value = serde_json::from_slice(bytes).map_err(|e| DecodeError::Payload {
        format: "json",
        reason: e.to_string(),
    })?;
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

    #[tokio::test]
    async fn framed_without_registry_is_fatal_and_bad_frames_are_rejected() {
        let d = decoder();
        let e = d
            .decode(
                PayloadFormat::SchemaRegistry,
                Some(&[0, 0, 0, 0, 1, 2]),
                "t",
                Field::Value,
            )
            .await
            .unwrap_err();
        assert_eq!(e.disposition(), Disposition::Fatal);
        let e = d
            .decode(
                PayloadFormat::SchemaRegistry,
                Some(&[7, 0, 0, 0, 1]),
                "t",
                Field::Value,
            )
            .await
            .unwrap_err();
        assert_eq!(e.disposition(), Disposition::Reject);
        let e = d
            .decode(PayloadFormat::String, Some(&[0xff]), "t", Field::Value)
            .await
            .unwrap_err();
        assert_eq!(e.disposition(), Disposition::Reject);
    }
}
