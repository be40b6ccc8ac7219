//! JSON to record bytes for the produce path: Schema Registry formats in the Confluent wire
//! format (Avro, Protobuf, JSON Schema), and plain `json`, `string` and `bytes`.
//!
//! Schemas are looked up by subject (TopicNameStrategy unless named), version or id, through
//! the registry client's caches: a schema is compiled once per id, and `latest` is asked
//! again at most every 30 s. Nothing is registered: producing needs a schema that exists.

use std::sync::Arc;

use base64::Engine as _;
use prost::Message as _;
use prost_reflect::{DeserializeOptions, DynamicMessage, FileDescriptor, MessageDescriptor};
use serde::Deserialize;
use serde_json::Value as Json;
use thiserror::Error;

use super::avro::Names;
use super::avro_json::{self, Mismatch};
use super::registry::{CompiledSchema, RegistryClient, RegistryError, ResolvedSchema};
use super::wire;

/// How one side (key or value) of a produced record is encoded.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProduceFormat {
    /// Through the Schema Registry: Avro, Protobuf or JSON Schema, as the subject's schema is.
    SchemaRegistry,
    /// The JSON text of the value.
    #[default]
    Json,
    /// A JSON string, written as its UTF-8 bytes.
    String,
    /// A base64 JSON string, written as the decoded bytes.
    Bytes,
}

impl ProduceFormat {
    /// The name used in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SchemaRegistry => "schema_registry",
            Self::Json => "json",
            Self::String => "string",
            Self::Bytes => "bytes",
        }
    }
}

/// Which registered schema to encode with. Empty: the latest version of the subject named
/// by TopicNameStrategy (`<topic>-key` or `<topic>-value`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SchemaSelector {
    /// The subject; default `<topic>-value` or `<topic>-key`.
    #[serde(default)]
    pub subject: Option<String>,
    /// The version within the subject; default the latest.
    #[serde(default)]
    pub version: Option<i64>,
    /// A schema id, instead of subject and version.
    #[serde(default)]
    pub id: Option<u32>,
    /// Protobuf only: the full name of the message type; default the file's first message.
    #[serde(default)]
    pub message: Option<String>,
}

/// Why a value could not be encoded.
#[derive(Debug, Error)]
pub enum EncodeError {
    /// The JSON does not match the schema (422).
    #[error("{side} does not match {schema}: {mismatch}")]
    Mismatch {
        /// `key` or `value`.
        side: &'static str,
        /// The schema, as `subject orders-value version 3 (id 12, avro)`.
        schema: String,
        /// Where and why.
        mismatch: Mismatch,
    },
    /// The JSON cannot be written in the requested plain format (422).
    #[error("{side} cannot be written as {format}: {reason}")]
    Format {
        /// `key` or `value`.
        side: &'static str,
        /// The format asked for.
        format: &'static str,
        /// Why.
        reason: String,
    },
    /// `schema_registry` asked of a connection without a registry (422).
    #[error("{side} format schema_registry needs [connections.<name>.schema_registry] configured")]
    NoRegistry {
        /// `key` or `value`.
        side: &'static str,
    },
    /// The schema could not be had (subject unknown: 422; registry down: 503).
    #[error("{side} schema: {source}")]
    Registry {
        /// `key` or `value`.
        side: &'static str,
        /// The registry's answer.
        #[source]
        source: RegistryError,
    },
}

/// Encodes produced keys and values for one connection.
pub struct Encoder {
    registry: Option<Arc<RegistryClient>>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl Encoder {
    /// An encoder using `registry` for the `schema_registry` format.
    pub fn new(registry: Option<Arc<RegistryClient>>) -> Self {
        Self { registry }
    }

    /// Encodes `json` for `topic`. JSON `null` is an absent key or a tombstone value, in
    /// every format.
    pub async fn encode(
        &self,
        json: &Json,
        format: ProduceFormat,
        selector: &SchemaSelector,
        topic: &str,
        is_key: bool,
    ) -> Result<Option<Vec<u8>>, EncodeError> {
        let side = if is_key { "key" } else { "value" };
        if json.is_null() {
            return Ok(None);
        }
        let plain = |reason: &str| EncodeError::Format {
            side,
            format: format.as_str(),
            reason: reason.to_owned(),
        };
        Ok(Some(match format {
            ProduceFormat::Json => serde_json::to_vec(json).map_err(|e| plain(&e.to_string()))?,
            ProduceFormat::String => match json {
                Json::String(s) => s.clone().into_bytes(),
                _ => return Err(plain("expected a JSON string")),
            },
            ProduceFormat::Bytes => match json {
                Json::String(s) => base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map_err(|_| plain("expected a base64 string"))?,
                _ => return Err(plain("expected a base64 string")),
            },
            ProduceFormat::SchemaRegistry => {
                let registry = self
                    .registry
                    .as_ref()
                    .ok_or(EncodeError::NoRegistry { side })?;
                let schema = match selector.id {
                    Some(id) => registry.schema(id).await,
                    None => {
                        let subject = selector
                            .subject
                            .clone()
                            .unwrap_or_else(|| format!("{topic}-{side}"));
                        registry
                            .schema_for_subject(&subject, selector.version)
                            .await
                    }
                }
                .map_err(|source| EncodeError::Registry { side, source })?;
                self.encode_with(json, &schema, selector, topic, is_key)?
            }
        }))
    }

    fn encode_with(
        &self,
        json: &Json,
        schema: &ResolvedSchema,
        selector: &SchemaSelector,
        topic: &str,
        is_key: bool,
    ) -> Result<Vec<u8>, EncodeError> {
        let side = if is_key { "key" } else { "value" };
        let describe = || {
            let at = match (&selector.subject, selector.version) {
                _ if selector.id.is_some() => String::new(),
                (Some(s), v) => format!("subject {s} {} ", version_text(v)),
                (None, v) => format!("subject {topic}-{side} {} ", version_text(v)),
            };
            format!(
                "{at}(schema id {}, {})",
                schema.id,
                schema.schema_type().as_str()
            )
        };
        let mismatch = |m: Mismatch| EncodeError::Mismatch {
            side,
            schema: describe(),
            mismatch: m,
        };
        let mut out = Vec::with_capacity(64);
        out.push(wire::MAGIC_BYTE);
        out.extend_from_slice(&schema.id.to_be_bytes());
        match &schema.kind {
            CompiledSchema::Avro {
                schema: s,
                references,
                ..
            } => {
                let names = Names::collect(std::iter::once(s).chain(references.iter()));
                let value = avro_json::from_json(json, s, &names).map_err(mismatch)?;
                let refs: Vec<&apache_avro::Schema> = references.iter().collect();
                use apache_avro::writer::datum::GenericDatumWriter;
                let writer = if refs.is_empty() {
                    GenericDatumWriter::builder(s).build()
                } else {
                    GenericDatumWriter::builder(s)
                        .schemata(refs)
                        .and_then(|b| b.build())
                };
                let datum = writer
                    .and_then(|w| w.write_value_to_vec(value))
                    .map_err(|e| {
                        mismatch(Mismatch {
                            path: "$".to_owned(),
                            reason: e.to_string(),
                        })
                    })?;
                out.extend_from_slice(&datum);
            }
            CompiledSchema::Protobuf { file } => {
                let desc = pick_message(file, selector.message.as_deref()).map_err(|reason| {
                    mismatch(Mismatch {
                        path: "$".to_owned(),
                        reason,
                    })
                })?;
                let message = proto_from_json(json, &desc).map_err(mismatch)?;
                wire::write_message_indexes(&index_path(file, &desc), &mut out);
                message.encode(&mut out).map_err(|e| {
                    mismatch(Mismatch {
                        path: "$".to_owned(),
                        reason: e.to_string(),
                    })
                })?;
            }
            CompiledSchema::Json { validator, .. } => {
                if let Err(e) = validator.validate(json) {
                    return Err(mismatch(Mismatch {
                        path: pointer_to_path(e.instance_path.as_str()),
                        reason: e.to_string(),
                    }));
                }
                serde_json::to_writer(&mut out, json).map_err(|e| {
                    mismatch(Mismatch {
                        path: "$".to_owned(),
                        reason: e.to_string(),
                    })
                })?;
            }
        }
        Ok(out)
    }
}

fn version_text(v: Option<i64>) -> String {
    v.map_or_else(|| "latest".to_owned(), |v| format!("version {v}"))
}

/// `/customer/emails/2` to `$.customer.emails[2]`.
pub(crate) fn pointer_to_path(pointer: &str) -> String {
    let mut out = String::from("$");
    for seg in pointer.split('/').skip(1) {
        let seg = seg.replace("~1", "/").replace("~0", "~");
        if !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_digit()) {
            out.push_str(&format!("[{seg}]"));
        } else {
            avro_json::push_key(&mut out, &seg);
        }
    }
    out
}

/// The message named `name` in `file`, or the file's first message.
fn pick_message(file: &FileDescriptor, name: Option<&str>) -> Result<MessageDescriptor, String> {
    match name {
        Some(n) => file
            .parent_pool()
            .get_message_by_name(n.trim_start_matches('.'))
            .filter(|m| m.parent_file() == *file)
            .ok_or_else(|| format!("message type {n} is not in the registered schema")),
        None => file
            .messages()
            .next()
            .ok_or_else(|| "the registered schema defines no message".to_owned()),
    }
}

/// The message-index path of `desc` within `file`: top-level index, then nested indexes.
fn index_path(file: &FileDescriptor, desc: &MessageDescriptor) -> Vec<usize> {
    let mut chain = vec![desc.clone()];
    while let Some(parent) = chain.last().and_then(MessageDescriptor::parent_message) {
        chain.push(parent);
    }
    chain.reverse();
    let mut path = Vec::with_capacity(chain.len());
    let top = file
        .messages()
        .position(|m| m == chain[0])
        .unwrap_or_default();
    path.push(top);
    for pair in chain.windows(2) {
        let i = pair[0]
            .child_messages()
            .position(|m| m == pair[1])
            .unwrap_or_default();
        path.push(i);
    }
    path
}

/// The proto3 JSON mapping (field JSON names or proto names; unknown fields refused).
fn proto_from_json(json: &Json, desc: &MessageDescriptor) -> Result<DynamicMessage, Mismatch> {
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(json, &mut track);
    let options = DeserializeOptions::new().deny_unknown_fields(true);
    DynamicMessage::deserialize_with_options(desc.clone(), de, &options).map_err(|e| Mismatch {
        path: avro_json::serde_path(&track.path()),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_pointers_become_paths() {
        assert_eq!(pointer_to_path(""), "$");
        assert_eq!(
            pointer_to_path("/customer/emails/2"),
            "$.customer.emails[2]"
        );
        assert_eq!(pointer_to_path("/a~1b"), "$[\"a/b\"]");
    }

    fn proto_file() -> FileDescriptor {
        let file = protox::file::File::from_source(
            "order.proto",
            r#"syntax = "proto3"; package acme;
               message Order { string id = 1; int64 cents = 2; Line line = 3;
                 message Line { string sku = 1; } }
               message Other { bool ok = 1; }"#,
        )
        .unwrap();
        let mut resolver = protox::file::ChainFileResolver::new();
        resolver.add(SingleFile(file));
        let mut compiler = protox::Compiler::with_file_resolver(resolver);
        let _ = compiler.open_file("order.proto").unwrap();
        compiler
            .descriptor_pool()
            .get_file_by_name("order.proto")
            .unwrap()
    }

    struct SingleFile(protox::file::File);
    impl protox::file::FileResolver for SingleFile {
        fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
            if name == self.0.name() {
                Ok(self.0.clone())
            } else {
                Err(protox::Error::file_not_found(name))
            }
        }
    }

    #[test]
    fn protobuf_message_selection_and_index_paths() {
        let file = proto_file();
        let first = pick_message(&file, None).unwrap();
        assert_eq!(first.full_name(), "acme.Order");
        assert_eq!(index_path(&file, &first), vec![0]);
        let other = pick_message(&file, Some("acme.Other")).unwrap();
        assert_eq!(index_path(&file, &other), vec![1]);
        let line = pick_message(&file, Some("acme.Order.Line")).unwrap();
        assert_eq!(index_path(&file, &line), vec![0, 0]);
        assert!(pick_message(&file, Some("acme.Nope")).is_err());
    }

    #[test]
    fn protobuf_mismatches_name_the_field() {
        let file = proto_file();
        let desc = pick_message(&file, None).unwrap();
        let ok = proto_from_json(
            &json!({"id": "a", "cents": "12", "line": {"sku": "x"}}),
            &desc,
        )
        .unwrap();
        assert_eq!(ok.encode_to_vec().len(), 10);
        let e = proto_from_json(&json!({"id": "a", "line": {"sku": 5}}), &desc).unwrap_err();
        assert_eq!(e.path, "$.line.sku", "{e}");
        let e = proto_from_json(&json!({"id": "a", "colour": 1}), &desc).unwrap_err();
        assert!(e.reason.contains("colour"), "{e}");
    }

    #[tokio::test]
    async fn plain_formats() {
        let enc = Encoder::new(None);
        let sel = SchemaSelector::default();
        let j = json!({"a": 1});
        let got = enc
            .encode(&j, ProduceFormat::Json, &sel, "t", false)
            .await
            .unwrap();
        assert_eq!(got.as_deref(), Some(&b"{\"a\":1}"[..]));
        let got = enc
            .encode(&json!("k"), ProduceFormat::String, &sel, "t", true)
            .await
            .unwrap();
        assert_eq!(got.as_deref(), Some(&b"k"[..]));
        let got = enc
            .encode(&json!("AAE="), ProduceFormat::Bytes, &sel, "t", true)
            .await
            .unwrap();
        assert_eq!(got.as_deref(), Some(&[0_u8, 1][..]));
        assert!(enc
            .encode(&Json::Null, ProduceFormat::String, &sel, "t", false)
            .await
            .unwrap()
            .is_none());
        let e = enc
            .encode(&json!(3), ProduceFormat::String, &sel, "t", true)
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "key cannot be written as string: expected a JSON string"
        );
        let e = enc
            .encode(&j, ProduceFormat::SchemaRegistry, &sel, "t", false)
            .await
            .unwrap_err();
        assert!(matches!(e, EncodeError::NoRegistry { .. }));
    }
}
