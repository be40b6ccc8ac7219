//! Protobuf payloads to the event's JSON: the proto3 JSON mapping (well-known types mapped,
//! 64-bit integers as decimal strings, enums by name, bytes base64) with the field names of the
//! `.proto` file and default values written out.

use prost_reflect::{DynamicMessage, FileDescriptor, MessageDescriptor, SerializeOptions};
use serde_json::Value as Json;

/// Finds the message at `path` (message-index array) in `file`.
pub(crate) fn message_at(
    file: &FileDescriptor,
    path: &[usize],
) -> Result<MessageDescriptor, String> {
    let (first, rest) = path.split_first().ok_or("empty message index array")?;
    let mut msg = file
        .messages()
        .nth(*first)
        .ok_or_else(|| format!("message index {first} is not in {}", file.name()))?;
    for &i in rest {
        let child = msg.child_messages().nth(i);
        msg = child
            .ok_or_else(|| format!("nested message index {i} is not in {}", msg.full_name()))?;
    }
    Ok(msg)
}

/// Decodes `body` as the message at `path`; returns its full name and JSON.
pub(crate) fn decode(
    file: &FileDescriptor,
    path: &[usize],
    body: &[u8],
) -> Result<(String, Json), String> {
    let desc = message_at(file, path)?;
    let msg = DynamicMessage::decode(desc.clone(), body).map_err(|e| e.to_string())?;
    let options = SerializeOptions::new()
        .skip_default_fields(false)
        .use_proto_field_name(true)
        .stringify_64_bit_integers(true);
    let json = msg
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| e.to_string())?;
    Ok((desc.full_name().to_owned(), json))
}
