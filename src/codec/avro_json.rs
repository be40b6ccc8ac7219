//! JSON to Avro values, driven by the schema: the inverse of [`super::avro::decode`].
//!
//! Accepts what the decoder writes (unions unwrapped, enums by symbol, bytes and fixed in
//! base64, decimals as strings, dates and timestamps in RFC 3339) and the obvious
//! alternatives (timestamps as epoch integers, decimals as numbers, a union branch tagged
//! `{"<type name>": value}` as in Avro's JSON encoding). A mismatch names the field path.

use std::collections::HashMap;

use apache_avro::schema::{RecordSchema, Schema, UnionSchema};
use apache_avro::types::Value;
use base64::Engine as _;
use serde_json::Value as Json;

use super::avro::Names;
use super::time;

/// Where in the JSON document a value failed to match, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// JSON path such as `$.customer.emails[2]`.
    pub path: String,
    /// What was expected.
    pub reason: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.reason)
    }
}

fn kind(j: &Json) -> &'static str {
    match j {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// A serde_path_to_error path (`a.b[2].c`) as a JSON path (`$.a.b[2].c`).
pub(crate) fn serde_path(path: &serde_path_to_error::Path) -> String {
    let inner = path.to_string();
    if inner == "." || inner.is_empty() {
        "$".to_owned()
    } else {
        format!("$.{inner}").replace(".[", "[")
    }
}

/// Converts `json` to a value of `schema`.
pub(crate) fn from_json(
    json: &Json,
    schema: &Schema,
    names: &Names<'_>,
) -> Result<Value, Mismatch> {
    let mut path = String::from("$");
    convert(json, schema, names, &mut path)
}

fn fail<T>(path: &str, reason: impl Into<String>) -> Result<T, Mismatch> {
    Err(Mismatch {
        path: path.to_owned(),
        reason: reason.into(),
    })
}

fn expected<T>(path: &str, what: &str, got: &Json) -> Result<T, Mismatch> {
    fail(path, format!("expected {what}, got {}", kind(got)))
}

fn integer(json: &Json, path: &str, min: i64, max: i64, what: &str) -> Result<i64, Mismatch> {
    let n = match json {
        Json::Number(n) => n.as_i64(),
        // 64-bit integers may come as decimal strings (the proto3 JSON habit).
        Json::String(s) => s.parse::<i64>().ok(),
        _ => None,
    };
    match n {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        Some(_) => fail(path, format!("{json} is out of range for {what}")),
        None => expected(path, what, json),
    }
}

fn float(json: &Json, path: &str, what: &str) -> Result<f64, Mismatch> {
    match json {
        Json::Number(n) => n.as_f64().map_or_else(|| expected(path, what, json), Ok),
        Json::String(s)
            if matches!(
                s.as_str(),
                "NaN" | "Infinity" | "-Infinity" | "inf" | "-inf"
            ) =>
        {
            Ok(s.replace("Infinity", "inf")
                .parse::<f64>()
                .unwrap_or(f64::NAN))
        }
        _ => expected(path, what, json),
    }
}

fn base64_bytes(json: &Json, path: &str) -> Result<Vec<u8>, Mismatch> {
    match json {
        Json::String(s) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .or_else(|_| fail(path, "expected base64-encoded bytes")),
        _ => expected(path, "base64-encoded bytes (a string)", json),
    }
}

/// A count of `per_second` units since the epoch: an integer, or an RFC 3339 string.
fn epoch_count(json: &Json, path: &str, per_second: i64, utc: bool) -> Result<i64, Mismatch> {
    match json {
        Json::String(s) => {
            let Some(nanos) = time::parse_timestamp(s, utc) else {
                let form = if utc {
                    "an RFC 3339 timestamp with offset"
                } else {
                    "a local timestamp without offset"
                };
                return fail(path, format!("{s:?} is not {form}"));
            };
            let count = nanos.div_euclid(i128::from(1_000_000_000 / per_second));
            i64::try_from(count).or_else(|_| fail(path, "timestamp out of range"))
        }
        _ => integer(
            json,
            path,
            i64::MIN,
            i64::MAX,
            "a timestamp (string or integer)",
        ),
    }
}

/// Nanoseconds since midnight from `HH:MM:SS[.fff]`, or `per_unit` nanoseconds times an
/// integer count.
fn time_of_day(json: &Json, path: &str, per_unit: i64, what: &str) -> Result<i64, Mismatch> {
    match json {
        Json::String(s) => time::parse_time_of_day(s).map_or_else(
            || fail(path, format!("{s:?} is not a time HH:MM:SS[.fff]")),
            Ok,
        ),
        _ => Ok(integer(json, path, 0, 86_400_000_000_000 / per_unit, what)? * per_unit),
    }
}

/// A decimal string or number to the unscaled big-endian two's-complement bytes.
fn decimal(json: &Json, path: &str, scale: usize, precision: usize) -> Result<Vec<u8>, Mismatch> {
    let text = match json {
        Json::String(s) => s.clone(),
        Json::Number(n) => n.to_string(),
        _ => return expected(path, "a decimal (string or number)", json),
    };
    let (neg, body) = match text.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, text.strip_prefix('+').unwrap_or(&text)),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let valid = !(int.is_empty() && frac.is_empty())
        && int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit());
    if !valid {
        return fail(path, format!("{text:?} is not a decimal number"));
    }
    let frac_trimmed = frac.trim_end_matches('0');
    if frac_trimmed.len() > scale {
        return fail(path, format!("{text} has more than {scale} decimal places"));
    }
    let digits = format!("{int}{frac_trimmed:0<scale$}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > precision {
        return fail(path, format!("{text} exceeds precision {precision}"));
    }
    let mut unscaled: num_bigint::BigInt = if digits.is_empty() {
        0.into()
    } else {
        digits
            .parse()
            .or_else(|_| fail(path, format!("{text:?} is not a decimal number")))?
    };
    if neg {
        unscaled = -unscaled;
    }
    Ok(unscaled.to_signed_bytes_be())
}

fn convert(
    json: &Json,
    schema: &Schema,
    names: &Names<'_>,
    path: &mut String,
) -> Result<Value, Mismatch> {
    let schema = match schema {
        Schema::Ref { name } => match names.get(name) {
            Some(s) => s,
            None => {
                return fail(
                    path,
                    format!("unresolved schema reference {}", name.fullname(None)),
                )
            }
        },
        s => s,
    };
    Ok(match schema {
        Schema::Null => match json {
            Json::Null => Value::Null,
            _ => return expected(path, "null", json),
        },
        Schema::Boolean => match json {
            Json::Bool(b) => Value::Boolean(*b),
            _ => return expected(path, "a boolean", json),
        },
        Schema::Int => {
            Value::Int(integer(json, path, i32::MIN.into(), i32::MAX.into(), "an int")? as i32)
        }
        Schema::Long => Value::Long(integer(json, path, i64::MIN, i64::MAX, "a long")?),
        Schema::Float => Value::Float(float(json, path, "a float")? as f32),
        Schema::Double => Value::Double(float(json, path, "a double")?),
        Schema::Bytes => Value::Bytes(base64_bytes(json, path)?),
        Schema::String => match json {
            Json::String(s) => Value::String(s.clone()),
            _ => return expected(path, "a string", json),
        },
        Schema::Uuid(_) => match json {
            Json::String(s) if is_uuid(s) => {
                Value::Uuid(s.parse().or_else(|_| fail(path, "expected a UUID"))?)
            }
            _ => return expected(path, "a UUID string", json),
        },
        Schema::Fixed(f) => {
            let bytes = base64_bytes(json, path)?;
            if bytes.len() != f.size {
                return fail(
                    path,
                    format!(
                        "expected {} bytes for fixed {}, got {}",
                        f.size,
                        f.name.fullname(None),
                        bytes.len()
                    ),
                );
            }
            Value::Fixed(f.size, bytes)
        }
        Schema::Enum(e) => match json {
            Json::String(s) => match e.symbols.iter().position(|x| x == s) {
                Some(i) => Value::Enum(i as u32, s.clone()),
                None => {
                    return fail(
                        path,
                        format!(
                            "{s:?} is not a symbol of enum {} ({})",
                            e.name.fullname(None),
                            e.symbols.join(", ")
                        ),
                    )
                }
            },
            _ => return expected(path, "an enum symbol (a string)", json),
        },
        Schema::Array(a) => match json {
            Json::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    out.push(convert(item, &a.items, names, path)?);
                    path.truncate(len);
                }
                Value::Array(out)
            }
            _ => return expected(path, "an array", json),
        },
        Schema::Map(m) => match json {
            Json::Object(entries) => {
                let mut out = HashMap::with_capacity(entries.len());
                for (k, v) in entries {
                    let len = path.len();
                    push_key(path, k);
                    let _ = out.insert(k.clone(), convert(v, &m.types, names, path)?);
                    path.truncate(len);
                }
                Value::Map(out)
            }
            _ => return expected(path, "an object (map)", json),
        },
        Schema::Record(r) => record(json, r, names, path)?,
        Schema::Union(u) => union(json, u, names, path)?,
        Schema::Decimal(d) => Value::Decimal(apache_avro::Decimal::from(decimal(
            json,
            path,
            d.scale,
            d.precision,
        )?)),
        Schema::BigDecimal => match json {
            Json::String(s) => Value::BigDecimal(
                s.parse()
                    .or_else(|_| fail(path, format!("{s:?} is not a decimal number")))?,
            ),
            Json::Number(n) => Value::BigDecimal(
                n.to_string()
                    .parse()
                    .or_else(|_| fail(path, "not a decimal number"))?,
            ),
            _ => return expected(path, "a decimal (string or number)", json),
        },
        Schema::Date => match json {
            Json::String(s) => {
                let days = time::parse_date(s)
                    .map_or_else(|| fail(path, format!("{s:?} is not a date YYYY-MM-DD")), Ok)?;
                Value::Date(i32::try_from(days).or_else(|_| fail(path, "date out of range"))?)
            }
            _ => Value::Date(integer(
                json,
                path,
                i32::MIN.into(),
                i32::MAX.into(),
                "a date (YYYY-MM-DD or days since 1970-01-01)",
            )? as i32),
        },
        Schema::TimeMillis => Value::TimeMillis(
            (time_of_day(
                json,
                path,
                1_000_000,
                "a time (HH:MM:SS.fff or ms since midnight)",
            )? / 1_000_000) as i32,
        ),
        Schema::TimeMicros => Value::TimeMicros(
            time_of_day(
                json,
                path,
                1_000,
                "a time (HH:MM:SS.ffffff or µs since midnight)",
            )? / 1_000,
        ),
        Schema::TimestampMillis => Value::TimestampMillis(epoch_count(json, path, 1_000, true)?),
        Schema::TimestampMicros => {
            Value::TimestampMicros(epoch_count(json, path, 1_000_000, true)?)
        }
        Schema::TimestampNanos => {
            Value::TimestampNanos(epoch_count(json, path, 1_000_000_000, true)?)
        }
        Schema::LocalTimestampMillis => {
            Value::LocalTimestampMillis(epoch_count(json, path, 1_000, false)?)
        }
        Schema::LocalTimestampMicros => {
            Value::LocalTimestampMicros(epoch_count(json, path, 1_000_000, false)?)
        }
        Schema::LocalTimestampNanos => {
            Value::LocalTimestampNanos(epoch_count(json, path, 1_000_000_000, false)?)
        }
        Schema::Duration(_) => match json {
            Json::Object(o) => {
                let part = |name: &str, path: &mut String| -> Result<u32, Mismatch> {
                    let len = path.len();
                    push_key(path, name);
                    let v = o.get(name).unwrap_or(&Json::Null);
                    let n = integer(v, path, 0, u32::MAX.into(), "an unsigned 32-bit integer");
                    path.truncate(len);
                    Ok(n? as u32)
                };
                let (months, days, millis) = (
                    part("months", path)?,
                    part("days", path)?,
                    part("millis", path)?,
                );
                Value::Duration(apache_avro::Duration::new(
                    apache_avro::Months::new(months),
                    apache_avro::Days::new(days),
                    apache_avro::Millis::new(millis),
                ))
            }
            _ => return expected(path, "a duration {months, days, millis}", json),
        },
        Schema::Ref { .. } => return fail(path, "nested schema reference"),
    })
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// Appends `.key`, or `["key"]` when the key is not a plain identifier.
pub(crate) fn push_key(path: &mut String, key: &str) {
    if !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        path.push('.');
        path.push_str(key);
    } else {
        path.push_str(&format!("[{}]", Json::String(key.to_owned())));
    }
}

fn record(
    json: &Json,
    r: &RecordSchema,
    names: &Names<'_>,
    path: &mut String,
) -> Result<Value, Mismatch> {
    let Json::Object(obj) = json else {
        return expected(
            path,
            &format!("an object (record {})", r.name.fullname(None)),
            json,
        );
    };
    if let Some(unknown) = obj.keys().find(|k| !r.fields.iter().any(|f| &f.name == *k)) {
        let len = path.len();
        push_key(path, unknown);
        let m = fail(
            path,
            format!("record {} has no field {unknown:?}", r.name.fullname(None)),
        );
        path.truncate(len);
        return m;
    }
    let mut fields = Vec::with_capacity(r.fields.len());
    for f in &r.fields {
        let len = path.len();
        push_key(path, &f.name);
        let value = match (obj.get(&f.name), &f.default) {
            (Some(v), _) => convert(v, &f.schema, names, path)?,
            // An Avro default of a union is a value of its first branch.
            (None, Some(default)) => match &f.schema {
                Schema::Union(u) if !u.variants().is_empty() => Value::Union(
                    0,
                    Box::new(convert(default, &u.variants()[0], names, path)?),
                ),
                s => convert(default, s, names, path)?,
            },
            (None, None) => return fail(path, "required field is missing"),
        };
        path.truncate(len);
        fields.push((f.name.clone(), value));
    }
    Ok(Value::Record(fields))
}

/// The name a union branch is tagged with in Avro's JSON encoding.
fn branch_name(s: &Schema) -> Option<String> {
    Some(match s {
        Schema::Null => "null".into(),
        Schema::Boolean => "boolean".into(),
        Schema::Int | Schema::Date | Schema::TimeMillis => "int".into(),
        Schema::Long
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => "long".into(),
        Schema::Float => "float".into(),
        Schema::Double => "double".into(),
        Schema::Bytes | Schema::BigDecimal => "bytes".into(),
        Schema::String | Schema::Uuid(_) => "string".into(),
        Schema::Array(_) => "array".into(),
        Schema::Map(_) => "map".into(),
        Schema::Record(r) => r.name.fullname(None),
        Schema::Enum(e) => e.name.fullname(None),
        Schema::Fixed(f) | Schema::Duration(f) => f.name.fullname(None),
        Schema::Ref { name } => name.fullname(None),
        Schema::Decimal(_) | Schema::Union(_) => return None,
    })
}

fn union(
    json: &Json,
    u: &UnionSchema,
    names: &Names<'_>,
    path: &mut String,
) -> Result<Value, Mismatch> {
    let variants = u.variants();
    // Tagged form: {"string": "x"} or {"com.acme.Customer": {...}} (short names too).
    if let Json::Object(o) = json {
        if o.len() == 1 {
            let (tag, inner) = o.iter().next().expect("one entry");
            for (i, v) in variants.iter().enumerate() {
                if let Some(name) = branch_name(v) {
                    let short = name.rsplit('.').next().unwrap_or(&name);
                    if name == *tag || short == tag {
                        if let Ok(value) = convert(inner, v, names, &mut path.clone()) {
                            return Ok(Value::Union(i as u32, Box::new(value)));
                        }
                    }
                }
            }
        }
    }
    // Plain form: the first branch that takes the value.
    let mut first_error = None;
    for (i, v) in variants.iter().enumerate() {
        match convert(json, v, names, &mut path.clone()) {
            Ok(value) => return Ok(Value::Union(i as u32, Box::new(value))),
            Err(e) => {
                // The deepest error is the most useful one to report.
                let better = first_error
                    .as_ref()
                    .is_none_or(|f: &Mismatch| e.path.len() > f.path.len());
                if better {
                    first_error = Some(e);
                }
            }
        }
    }
    let names_list: Vec<String> = variants.iter().filter_map(branch_name).collect();
    match first_error {
        Some(e) if e.path != *path => Err(e),
        _ => fail(
            path,
            format!(
                "{} matches no branch of the union [{}]",
                kind(json),
                names_list.join(", ")
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::parse_str(
            r#"{"type":"record","name":"Order","namespace":"com.acme","fields":[
                {"name":"id","type":"long"},
                {"name":"customer","type":{"type":"record","name":"Customer","fields":[
                    {"name":"email","type":"string"},
                    {"name":"tier","type":{"type":"enum","name":"Tier","symbols":["GOLD","SILVER"]}}]}},
                {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
                {"name":"note","type":["null","string"],"default":null},
                {"name":"tags","type":{"type":"array","items":"string"},"default":[]},
                {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
                {"name":"day","type":{"type":"int","logicalType":"date"}}]}"#,
        )
        .unwrap()
    }

    fn roundtrip(s: &Schema, j: &Json) -> Json {
        let names = Names::collect([s]);
        let v = from_json(j, s, &names).unwrap();
        let bytes = apache_avro::writer::datum::GenericDatumWriter::builder(s)
            .build()
            .unwrap()
            .write_value_to_vec(v)
            .unwrap();
        super::super::avro::decode(s, &[], &bytes, &super::super::avro::Limits::default()).unwrap()
    }

    #[test]
    fn what_the_decoder_writes_encodes_back_to_the_same() {
        let s = schema();
        let j = json!({"id": 7, "customer": {"email": "a@b.c", "tier": "GOLD"}, "amount": "12.30",
            "note": "hi", "tags": ["x"], "at": "2023-11-14T22:13:20.123Z", "day": "2024-01-01"});
        assert_eq!(roundtrip(&s, &j), j);
    }

    #[test]
    fn defaults_tagged_unions_and_alternative_forms() {
        let s = schema();
        let j = json!({"id": "7", "customer": {"email": "a@b.c", "tier": "SILVER"}, "amount": 5,
            "note": {"string": "tagged"}, "at": 1_700_000_000_123_i64, "day": 19_723});
        let out = roundtrip(&s, &j);
        assert_eq!(out["note"], "tagged");
        assert_eq!(out["tags"], json!([]));
        assert_eq!(out["amount"], "5.00");
        assert_eq!(out["at"], "2023-11-14T22:13:20.123Z");
        assert_eq!(out["day"], "2024-01-01");
    }

    #[test]
    fn mismatches_name_the_field_path() {
        let s = schema();
        let names = Names::collect([&s]);
        let base = json!({"id": 1, "customer": {"email": "a@b.c", "tier": "GOLD"}, "amount": "1",
            "at": 0, "day": 0});
        let err = |patch: &dyn Fn(&mut Json)| {
            let mut j = base.clone();
            patch(&mut j);
            from_json(&j, &s, &names).unwrap_err()
        };
        let e = err(&|j| j["customer"]["email"] = json!(5));
        assert_eq!(e.path, "$.customer.email");
        assert_eq!(e.reason, "expected a string, got a number");
        let e = err(&|j| j["customer"]["tier"] = json!("BRONZE"));
        assert_eq!(e.path, "$.customer.tier");
        let e = err(&|j| {
            j.as_object_mut().unwrap().remove("id");
        });
        assert_eq!(e.to_string(), "$.id: required field is missing");
        let e = err(&|j| j["colour"] = json!("red"));
        assert_eq!(e.path, "$.colour");
        let e = err(&|j| j["tags"] = json!(["a", 2]));
        assert_eq!(e.path, "$.tags[1]");
        let e = err(&|j| j["amount"] = json!("1.234"));
        assert!(e.reason.contains("decimal places"), "{e}");
        let e = err(&|j| j["note"] = json!(3));
        assert_eq!(e.path, "$.note");
        assert!(e.reason.contains("no branch"), "{e}");
        let e = err(&|j| j["id"] = json!(1.5));
        assert_eq!(e.path, "$.id");
    }
}
