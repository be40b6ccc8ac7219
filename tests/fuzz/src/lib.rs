//! Structure-aware generators for the fuzz targets: random Avro schemas, Protobuf files and
//! JSON Schemas, rendered as the registry would hand them over, so that the fuzzer explores
//! the decoders with schemas as varied as the payloads (recursive named types, unions,
//! logical types, maps, oneofs, nested messages), not only one fixed schema.

use arbitrary::{Arbitrary, Result, Unstructured};

/// Deepest schema tree generated (recursion through named references goes further).
const MAX_SCHEMA_DEPTH: u32 = 4;

/// An Avro schema as JSON text, with named records that may refer to themselves.
pub fn avro_schema(u: &mut Unstructured<'_>) -> Result<String> {
    let mut names = Vec::new();
    let s = avro_type(u, 0, &mut names)?;
    Ok(s.to_string())
}

fn avro_type(
    u: &mut Unstructured<'_>,
    depth: u32,
    names: &mut Vec<String>,
) -> Result<serde_json::Value> {
    use serde_json::json;
    let leaf = depth >= MAX_SCHEMA_DEPTH;
    let choice = u.int_in_range(0..=if leaf { 17 } else { 23 })?;
    Ok(match choice {
        0 => json!("null"),
        1 => json!("boolean"),
        2 => json!("int"),
        3 => json!("long"),
        4 => json!("float"),
        5 => json!("double"),
        6 => json!("bytes"),
        7 => json!("string"),
        8 => {
            let n = format!("F{}", names.len());
            names.push(n.clone());
            json!({"type": "fixed", "name": n, "size": u.int_in_range(0..=20)?})
        }
        9 => {
            let n = format!("E{}", names.len());
            names.push(n.clone());
            let count = u.int_in_range(1..=4)?;
            json!({"type": "enum", "name": n, "symbols": (0..count).map(|i| format!("S{i}")).collect::<Vec<_>>()})
        }
        10 => {
            json!({"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": u.int_in_range(0..=10)?})
        }
        11 => {
            let n = format!("D{}", names.len());
            names.push(n.clone());
            json!({"type": "fixed", "name": n, "size": u.int_in_range(1..=16)?, "logicalType": "decimal", "precision": 9, "scale": u.int_in_range(0..=4)?})
        }
        12 => json!({"type": "int", "logicalType": *u.choose(&["date", "time-millis"])?}),
        13 => json!({"type": "long", "logicalType": *u.choose(&[
            "time-micros", "timestamp-millis", "timestamp-micros", "timestamp-nanos",
            "local-timestamp-millis", "local-timestamp-micros", "local-timestamp-nanos"])?}),
        14 => json!({"type": "string", "logicalType": "uuid"}),
        15 => {
            let n = format!("U{}", names.len());
            names.push(n.clone());
            json!({"type": "fixed", "name": n, "size": 16, "logicalType": "uuid"})
        }
        16 => {
            let n = format!("T{}", names.len());
            names.push(n.clone());
            json!({"type": "fixed", "name": n, "size": 12, "logicalType": "duration"})
        }
        17 if !names.is_empty() => json!(u.choose(names)?.clone()),
        17 => json!({"type": "bytes", "logicalType": "big-decimal"}),
        18 | 19 => {
            // A record, whose fields may name it (recursion through a union with null).
            let n = format!("R{}", names.len());
            names.push(n.clone());
            let count = u.int_in_range(0..=4)?;
            let mut fields = Vec::new();
            for i in 0..count {
                let t = if u.ratio(1, 4)? {
                    json!(["null", n.clone()])
                } else {
                    avro_type(u, depth + 1, names)?
                };
                fields.push(json!({"name": format!("f{i}"), "type": t}));
            }
            json!({"type": "record", "name": n, "fields": fields})
        }
        20 => json!({"type": "array", "items": avro_type(u, depth + 1, names)?}),
        21 => json!({"type": "map", "values": avro_type(u, depth + 1, names)?}),
        _ => {
            // A union of distinct unnamed kinds and named types.
            let mut branches = vec![json!("null")];
            for t in ["int", "string", "double"] {
                if u.arbitrary()? {
                    branches.push(json!(t));
                }
            }
            if u.arbitrary()? {
                branches.push(avro_type(u, depth + 1, names)?);
            }
            json!(branches)
        }
    })
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum ProtoScalar {
    Double,
    Float,
    Int32,
    Int64,
    Uint32,
    Uint64,
    Sint32,
    Sint64,
    Fixed32,
    Fixed64,
    Sfixed32,
    Sfixed64,
    Bool,
    String,
    Bytes,
    Timestamp,
    Duration,
    Struct,
    Any,
    Int64Value,
}

impl ProtoScalar {
    fn name(self) -> &'static str {
        match self {
            Self::Double => "double",
            Self::Float => "float",
            Self::Int32 => "int32",
            Self::Int64 => "int64",
            Self::Uint32 => "uint32",
            Self::Uint64 => "uint64",
            Self::Sint32 => "sint32",
            Self::Sint64 => "sint64",
            Self::Fixed32 => "fixed32",
            Self::Fixed64 => "fixed64",
            Self::Sfixed32 => "sfixed32",
            Self::Sfixed64 => "sfixed64",
            Self::Bool => "bool",
            Self::String => "string",
            Self::Bytes => "bytes",
            Self::Timestamp => "google.protobuf.Timestamp",
            Self::Duration => "google.protobuf.Duration",
            Self::Struct => "google.protobuf.Struct",
            Self::Any => "google.protobuf.Any",
            Self::Int64Value => "google.protobuf.Int64Value",
        }
    }
}

/// A proto3 (or proto2) file: messages with scalar, repeated, map, enum, oneof, nested and
/// self-referencing fields, importing the well-known types.
pub fn proto_file(u: &mut Unstructured<'_>) -> Result<String> {
    let proto2 = u.ratio(1, 5)?;
    let mut out = String::new();
    out.push_str(if proto2 {
        "syntax = \"proto2\";\n"
    } else {
        "syntax = \"proto3\";\n"
    });
    out.push_str("package fuzz;\nimport \"google/protobuf/timestamp.proto\";\nimport \"google/protobuf/duration.proto\";\nimport \"google/protobuf/struct.proto\";\nimport \"google/protobuf/any.proto\";\nimport \"google/protobuf/wrappers.proto\";\n");
    out.push_str("enum Color { COLOR_UNSPECIFIED = 0; RED = 1; GREEN = 2; }\n");
    let messages = u.int_in_range(1..=3)?;
    for m in 0..messages {
        out.push_str(&format!("message M{m} {{\n"));
        let fields = u.int_in_range(0..=6)?;
        let mut number = 1;
        let label = |u: &mut Unstructured<'_>| -> Result<&'static str> {
            Ok(if proto2 {
                *u.choose(&["optional ", "repeated "])?
            } else {
                *u.choose(&["", "repeated ", "optional "])?
            })
        };
        for f in 0..fields {
            let kind = u.int_in_range(0..=5)?;
            let line = match kind {
                0 | 1 => {
                    let s: ProtoScalar = u.arbitrary()?;
                    format!("  {}{} f{f} = {number};\n", label(u)?, s.name())
                }
                2 => format!(
                    "  {}M{} f{f} = {number};\n",
                    label(u)?,
                    u.int_in_range(0..=messages - 1)?
                ),
                3 => format!("  {}Color f{f} = {number};\n", label(u)?),
                4 => {
                    let v: ProtoScalar = u.arbitrary()?;
                    let v = match v {
                        ProtoScalar::Timestamp | ProtoScalar::Struct => "string",
                        other => other.name(),
                    };
                    format!("  map<string, {v}> f{f} = {number};\n")
                }
                _ => {
                    let a: ProtoScalar = u.arbitrary()?;
                    let r = number + 1;
                    number += 1;
                    format!(
                        "  oneof o{f} {{ {} a{f} = {number_a}; M{m} r{f} = {r}; }}\n",
                        a.name(),
                        number_a = r - 1
                    )
                }
            };
            out.push_str(&line);
            number += 1;
        }
        out.push_str("}\n");
    }
    Ok(out)
}

/// A JSON Schema document: objects, arrays, refs to `$defs`, combinators, formats.
pub fn json_schema(u: &mut Unstructured<'_>) -> Result<String> {
    let root = json_schema_node(u, 0)?;
    let mut doc = serde_json::json!({"$defs": {"node": json_schema_node(u, 1)?}});
    if let (Some(d), serde_json::Value::Object(r)) = (doc.as_object_mut(), root) {
        d.extend(r);
    }
    Ok(doc.to_string())
}

fn json_schema_node(u: &mut Unstructured<'_>, depth: u32) -> Result<serde_json::Value> {
    use serde_json::json;
    let leaf = depth >= MAX_SCHEMA_DEPTH;
    Ok(match u.int_in_range(0..=if leaf { 5 } else { 10 })? {
        0 => json!({"type": "integer", "minimum": u.int_in_range(-5i64..=5)?}),
        1 => {
            json!({"type": "string", "maxLength": u.int_in_range(0..=10)?, "pattern": *u.choose(&["^a", "b+$", "[0-9]{2}", ".*"])?})
        }
        2 => json!({"type": "number"}),
        3 => json!({"type": "boolean"}),
        4 => json!({"$ref": "#/$defs/node"}),
        5 => json!({"enum": [1, "a", null]}),
        6 | 7 => {
            let mut props = serde_json::Map::new();
            let n = u.int_in_range(0..=3)?;
            for i in 0..n {
                let _ = props.insert(format!("p{i}"), json_schema_node(u, depth + 1)?);
            }
            json!({"type": "object", "properties": props, "required": if n > 0 { vec!["p0"] } else { vec![] },
                   "additionalProperties": u.arbitrary::<bool>()?})
        }
        8 => {
            json!({"type": "array", "items": json_schema_node(u, depth + 1)?, "maxItems": u.int_in_range(0..=5)?})
        }
        9 => json!({"anyOf": [json_schema_node(u, depth + 1)?, json_schema_node(u, depth + 1)?]}),
        _ => json!({"not": json_schema_node(u, depth + 1)?}),
    })
}
