//! Avro values to the event's JSON, driven by the writer schema (documented in docs/event.md):
//! unions are unwrapped, enums are their symbol, bytes and fixed are base64, decimals are
//! strings, dates and timestamps are RFC 3339, longs are exact JSON integers.

use std::collections::HashMap;

use apache_avro::schema::{Name, Schema};
use apache_avro::types::Value;
use base64::Engine as _;
use serde_json::{json, Map, Value as Json};

use super::time;

/// Named schemas by full name, to resolve `Schema::Ref`.
pub(crate) struct Names<'a>(HashMap<Name, &'a Schema>);

impl<'a> Names<'a> {
    pub(crate) fn collect(schemas: impl IntoIterator<Item = &'a Schema>) -> Self {
        let mut names = HashMap::new();
        for s in schemas {
            walk(s, &mut names);
        }
        Self(names)
    }

    /// The named schema `name` refers to.
    pub(crate) fn get(&self, name: &apache_avro::schema::Name) -> Option<&'a Schema> {
        self.0.get(name).copied()
    }
}

fn walk<'a>(schema: &'a Schema, names: &mut HashMap<Name, &'a Schema>) {
    match schema {
        Schema::Record(r) if names.insert(r.name.clone(), schema).is_none() => {
            for f in &r.fields {
                walk(&f.schema, names);
            }
        }
        Schema::Enum(e) => {
            let _ = names.insert(e.name.clone(), schema);
        }
        Schema::Fixed(f) => {
            let _ = names.insert(f.name.clone(), schema);
        }
        Schema::Array(a) => walk(&a.items, names),
        Schema::Map(m) => walk(&m.types, names),
        Schema::Union(u) => u.variants().iter().for_each(|v| walk(v, names)),
        _ => {}
    }
}

/// Decodes one Avro datum written with `schema` to the event's JSON.
pub(crate) fn decode(
    schema: &Schema,
    references: &[Schema],
    mut body: &[u8],
) -> Result<Json, String> {
    let refs: Vec<&Schema> = references.iter().collect();
    let reader = if refs.is_empty() {
        apache_avro::reader::datum::GenericDatumReader::builder(schema).build()
    } else {
        apache_avro::reader::datum::GenericDatumReader::builder(schema)
            .writer_schemata(refs)
            .map_err(|e| e.to_string())?
            .build()
    }
    .map_err(|e| e.to_string())?;
    let value = reader.read_value(&mut body).map_err(|e| e.to_string())?;
    if !body.is_empty() {
        return Err(format!("{} bytes left after the avro datum", body.len()));
    }
    let names = Names::collect(std::iter::once(schema).chain(references.iter()));
    to_json(&value, schema, &names)
}

/// The record, enum or fixed name of a schema, for the event's schema block.
pub(crate) fn schema_name(schema: &Schema) -> Option<String> {
    match schema {
        Schema::Record(r) => Some(r.name.fullname(None)),
        Schema::Enum(e) => Some(e.name.fullname(None)),
        Schema::Fixed(f) => Some(f.name.fullname(None)),
        _ => None,
    }
}

fn b64(bytes: &[u8]) -> Json {
    Json::String(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// Maps a decoded value to JSON. apache-avro returns `Null` for a string cut short by the end
/// of the payload; a `Null` where the schema wants something else is therefore a truncated
/// payload and an error.
pub(crate) fn to_json(value: &Value, schema: &Schema, names: &Names<'_>) -> Result<Json, String> {
    let schema = match schema {
        Schema::Ref { name } => names.0.get(name).copied().unwrap_or(schema),
        s => s,
    };
    Ok(match value {
        Value::Null if matches!(schema, Schema::Null) => Json::Null,
        Value::Null => return Err("payload ends before the datum does (truncated)".to_owned()),
        Value::Boolean(b) => Json::Bool(*b),
        Value::Int(i) => json!(i),
        Value::Long(l) => json!(l),
        Value::Float(f) => float(f64::from(*f)),
        Value::Double(d) => float(*d),
        Value::Bytes(b) => b64(b),
        Value::String(s) => Json::String(s.clone()),
        Value::Fixed(_, b) => b64(b),
        Value::Enum(_, symbol) => Json::String(symbol.clone()),
        Value::Union(idx, inner) => {
            let branch = match schema {
                Schema::Union(u) => u.variants().get(*idx as usize).unwrap_or(schema),
                s => s,
            };
            to_json(inner, branch, names)?
        }
        Value::Array(items) => {
            let item_schema = match schema {
                Schema::Array(a) => &*a.items,
                s => s,
            };
            Json::Array(
                items
                    .iter()
                    .map(|v| to_json(v, item_schema, names))
                    .collect::<Result<_, _>>()?,
            )
        }
        Value::Map(entries) => {
            let value_schema = match schema {
                Schema::Map(m) => &*m.types,
                s => s,
            };
            let mut keys: Vec<&String> = entries.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                let _ = out.insert(k.clone(), to_json(&entries[k], value_schema, names)?);
            }
            Json::Object(out)
        }
        Value::Record(fields) => {
            let mut out = Map::new();
            for (i, (name, v)) in fields.iter().enumerate() {
                let field_schema = match schema {
                    Schema::Record(r) => r
                        .fields
                        .get(i)
                        .filter(|f| &f.name == name)
                        .or_else(|| r.fields.iter().find(|f| &f.name == name))
                        .map(|f| &f.schema),
                    _ => None,
                };
                let _ = out.insert(
                    name.clone(),
                    to_json(v, field_schema.unwrap_or(&Schema::Null), names)?,
                );
            }
            Json::Object(out)
        }
        Value::Date(d) => Json::String(time::date(i64::from(*d))),
        Value::Decimal(d) => {
            let scale = match schema {
                Schema::Decimal(ds) => ds.scale,
                _ => 0,
            };
            let unscaled = num_bigint::BigInt::from(d.clone());
            Json::String(scaled_decimal(&unscaled.to_string(), scale))
        }
        Value::BigDecimal(d) => Json::String(d.to_string()),
        Value::TimeMillis(t) => Json::String(time::time_of_day(i64::from(*t) * 1_000_000, 3)),
        Value::TimeMicros(t) => Json::String(time::time_of_day(t * 1_000, 6)),
        Value::TimestampMillis(t) => Json::String(time::timestamp(*t, 1_000, true)),
        Value::TimestampMicros(t) => Json::String(time::timestamp(*t, 1_000_000, true)),
        Value::TimestampNanos(t) => Json::String(time::timestamp(*t, 1_000_000_000, true)),
        Value::LocalTimestampMillis(t) => Json::String(time::timestamp(*t, 1_000, false)),
        Value::LocalTimestampMicros(t) => Json::String(time::timestamp(*t, 1_000_000, false)),
        Value::LocalTimestampNanos(t) => Json::String(time::timestamp(*t, 1_000_000_000, false)),
        Value::Duration(d) => json!({
            "months": u32::from(d.months()),
            "days": u32::from(d.days()),
            "millis": u32::from(d.millis()),
        }),
        Value::Uuid(u) => Json::String(u.to_string()),
    })
}

/// NaN and infinities have no JSON number; they are written as strings.
fn float(f: f64) -> Json {
    serde_json::Number::from_f64(f)
        .map(Json::Number)
        .unwrap_or_else(|| Json::String(f.to_string()))
}

/// Places the decimal point `scale` digits from the right of an integer string.
pub(crate) fn scaled_decimal(unscaled: &str, scale: usize) -> String {
    if scale == 0 {
        return unscaled.to_owned();
    }
    let (sign, digits) = match unscaled.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", unscaled),
    };
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{sign}{int}.{frac}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_decimals() {
        assert_eq!(scaled_decimal("12345", 2), "123.45");
        assert_eq!(scaled_decimal("-5", 3), "-0.005");
        assert_eq!(scaled_decimal("0", 2), "0.00");
        assert_eq!(scaled_decimal("7", 0), "7");
    }

    #[test]
    #[allow(deprecated)]
    fn maps_a_record_with_logical_types() {
        let schema = Schema::parse_str(
            r#"{"type":"record","name":"R","namespace":"t","fields":[
            {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
            {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
            {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B"]}},
            {"name":"note","type":["null","string"]},
            {"name":"big","type":"long"}]}"#,
        )
        .unwrap();
        let mut value = apache_avro::types::Record::new(&schema).unwrap();
        value.put(
            "amount",
            Value::Decimal(apache_avro::Decimal::from(vec![0x30, 0x39])),
        );
        value.put("at", Value::TimestampMillis(0));
        value.put("kind", Value::Enum(1, "B".into()));
        value.put(
            "note",
            Value::Union(1, Box::new(Value::String("hi".into()))),
        );
        value.put("big", Value::Long(9_007_199_254_740_993));
        let bytes = apache_avro::to_avro_datum(&schema, value).unwrap();
        let json = decode(&schema, &[], &bytes).unwrap();
        assert_eq!(
            json.to_string(),
            r#"{"amount":"123.45","at":"1970-01-01T00:00:00.000Z","kind":"B","note":"hi","big":9007199254740993}"#
        );
    }

    #[test]
    fn truncated_datum_is_an_error() {
        let schema = Schema::parse_str(
            r#"{"type":"record","name":"R","fields":[{"name":"s","type":"string"}]}"#,
        )
        .unwrap();
        assert!(decode(&schema, &[], &[0x10, b'a']).is_err());
    }
}
