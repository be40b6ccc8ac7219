//! Avro values to the event's JSON, driven by the writer schema (documented in docs/event.md):
//! unions are unwrapped, enums are their symbol, bytes and fixed are base64, decimals are
//! strings, dates and timestamps are RFC 3339, longs are exact JSON integers.

use std::cell::OnceCell;
use std::collections::HashMap;

use apache_avro::schema::{InnerDecimalSchema, Name, Schema, UuidSchema};
use base64::Engine as _;
use serde_json::{json, Map, Value as Json};

use super::time;

/// Named schemas by full name, to resolve `Schema::Ref`. The names are borrowed from the
/// schemas: building the table allocates one map, no name.
pub(crate) struct Names<'a>(HashMap<&'a Name, &'a Schema>);

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

fn walk<'a>(schema: &'a Schema, names: &mut HashMap<&'a Name, &'a Schema>) {
    match schema {
        Schema::Record(r) if names.insert(&r.name, schema).is_none() => {
            for f in &r.fields {
                walk(&f.schema, names);
            }
        }
        Schema::Enum(e) => {
            let _ = names.insert(&e.name, schema);
        }
        Schema::Fixed(f) | Schema::Duration(f) | Schema::Uuid(UuidSchema::Fixed(f)) => {
            let _ = names.insert(&f.name, schema);
        }
        // A decimal on a named fixed is referred to by the fixed's name; the reference must
        // find the decimal, not a bare fixed, or the scale is lost.
        Schema::Decimal(d) => {
            if let InnerDecimalSchema::Fixed(f) = &d.inner {
                let _ = names.insert(&f.name, schema);
            }
        }
        Schema::Array(a) => walk(&a.items, names),
        Schema::Map(m) => walk(&m.types, names),
        Schema::Union(u) => u.variants().iter().for_each(|v| walk(v, names)),
        _ => {}
    }
}

/// Decodes one Avro datum written with `schema` straight to the event's JSON.
///
/// The decoder is our own, driven by the writer schema: every read is length-checked (a
/// payload cut anywhere is an error, never a default), nesting deeper than
/// `limits.max_depth` and more values than the payload's size allows are refused before they
/// can exhaust the stack or memory, and named types are resolved through `references` so that
/// a decimal `fixed` used again by name keeps its scale.
pub(crate) fn decode(
    schema: &Schema,
    references: &[Schema],
    body: &[u8],
    limits: &Limits,
) -> Result<Json, Refusal> {
    let names = LazyNames {
        schema,
        references,
        names: OnceCell::new(),
    };
    let mut reader = Reader {
        buf: body,
        names: &names,
        budget: limits.value_budget(body.len()),
        max_depth: limits.max_depth,
    };
    let value = reader.value(schema, 0)?;
    if !reader.buf.is_empty() {
        return Err(Refusal::Payload(format!(
            "{} bytes left after the avro datum",
            reader.buf.len()
        )));
    }
    Ok(value)
}

/// Why a payload was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It does not match its schema (truncated, bad index, bad length, trailing bytes).
    Payload(String),
    /// It is nested deeper, or holds more values, than the decoding limits allow.
    Limit(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Payload(s) | Self::Limit(s) => f.write_str(s),
        }
    }
}

/// Bounds on what one payload may make the decoders build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Deepest nesting of records, arrays, maps (Avro), messages (Protobuf) or
    /// objects and arrays (JSON).
    pub max_depth: usize,
    /// Values allowed per payload byte, on top of [`Limits::base_values`].
    pub values_per_byte: usize,
    /// Values allowed whatever the payload's size (zero-byte values such as nulls and empty
    /// records need some room).
    pub base_values: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_depth: 64,
            values_per_byte: 8,
            base_values: 4096,
        }
    }
}

impl Limits {
    /// How many values a payload of `len` bytes may decode to.
    pub fn value_budget(&self, len: usize) -> usize {
        self.base_values
            .saturating_add(len.saturating_mul(self.values_per_byte))
    }
}

/// The longest decimal (in bytes of its unscaled two's-complement integer) that is turned into
/// digits: 128 bytes is over 300 digits, far past any registered precision, and keeps a hostile
/// length from costing quadratic time.
const MAX_DECIMAL_BYTES: usize = 128;
/// The largest scale magnitude of an Avro `big-decimal`.
const MAX_BIG_DECIMAL_SCALE: i64 = 1_000;

/// The table of named schemas, built on the first `Schema::Ref` a datum meets: most records
/// never refer to a type by name, and building it per record was a map and a walk of the
/// schema for every message.
struct LazyNames<'n> {
    schema: &'n Schema,
    references: &'n [Schema],
    names: OnceCell<Names<'n>>,
}

impl<'n> LazyNames<'n> {
    fn get(&self, name: &Name) -> Option<&'n Schema> {
        self.names
            .get_or_init(|| {
                Names::collect(std::iter::once(self.schema).chain(self.references.iter()))
            })
            .get(name)
    }
}

struct Reader<'a, 'n> {
    buf: &'a [u8],
    names: &'n LazyNames<'n>,
    budget: usize,
    max_depth: usize,
}

fn truncated(what: &str) -> Refusal {
    Refusal::Payload(format!("payload ends inside {what} (truncated)"))
}

impl<'a> Reader<'a, '_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Refusal> {
        if n > self.buf.len() {
            return Err(truncated(what));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// A zig-zag varint of at most 10 bytes.
    fn long(&mut self, what: &str) -> Result<i64, Refusal> {
        let mut raw: u64 = 0;
        for i in 0..10 {
            let Some((&b, rest)) = self.buf.split_first() else {
                return Err(truncated(what));
            };
            self.buf = rest;
            if i == 9 && b > 1 {
                return Err(Refusal::Payload(format!(
                    "{what}: varint longer than 64 bits"
                )));
            }
            raw |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok((raw >> 1) as i64 ^ -((raw & 1) as i64));
            }
        }
        Err(Refusal::Payload(format!(
            "{what}: varint longer than 64 bits"
        )))
    }

    fn int(&mut self, what: &str) -> Result<i32, Refusal> {
        let v = self.long(what)?;
        i32::try_from(v).map_err(|_| Refusal::Payload(format!("{what}: {v} does not fit an int")))
    }

    /// A length or count: never negative, never more than `limit`.
    fn len(&mut self, what: &str) -> Result<usize, Refusal> {
        let n = self.long(what)?;
        let n = usize::try_from(n)
            .map_err(|_| Refusal::Payload(format!("{what}: negative length {n}")))?;
        if n > self.buf.len() {
            return Err(truncated(what));
        }
        Ok(n)
    }

    fn bytes(&mut self, what: &str) -> Result<&'a [u8], Refusal> {
        let n = self.len(what)?;
        self.take(n, what)
    }

    fn string(&mut self, what: &str) -> Result<&'a str, Refusal> {
        let b = self.bytes(what)?;
        std::str::from_utf8(b).map_err(|e| Refusal::Payload(format!("{what}: not UTF-8: {e}")))
    }

    fn spend(&mut self, n: usize) -> Result<(), Refusal> {
        match self.budget.checked_sub(n) {
            Some(left) => {
                self.budget = left;
                Ok(())
            }
            None => Err(Refusal::Limit(
                "payload holds more values than its size allows (decoding limit)".to_owned(),
            )),
        }
    }

    fn deeper(&self, depth: usize) -> Result<usize, Refusal> {
        if depth >= self.max_depth {
            return Err(Refusal::Limit(format!(
                "payload nests deeper than {} levels (decoding limit)",
                self.max_depth
            )));
        }
        Ok(depth + 1)
    }

    /// The items of an array or the entries of a map: blocks of `count` items, a negative
    /// count followed by the block's size in bytes, ended by a zero count.
    fn blocks(
        &mut self,
        what: &str,
        mut item: impl FnMut(&mut Self) -> Result<(), Refusal>,
    ) -> Result<(), Refusal> {
        loop {
            let count = self.long(what)?;
            if count == 0 {
                return Ok(());
            }
            if count < 0 {
                let _size = self.len(what)?;
            }
            let count = count.unsigned_abs();
            // Every item costs at least one value of the budget: refuse a hostile count now,
            // before looping over it.
            let count = usize::try_from(count).unwrap_or(usize::MAX);
            if count > self.budget {
                return Err(Refusal::Limit(format!(
                    "{what}: a block of {count} items is more than the payload's size allows (decoding limit)"
                )));
            }
            for _ in 0..count {
                item(self)?;
            }
        }
    }

    fn value(&mut self, schema: &Schema, depth: usize) -> Result<Json, Refusal> {
        self.spend(1)?;
        Ok(match schema {
            Schema::Ref { name } => {
                let target = self.names.get(name).ok_or_else(|| {
                    Refusal::Payload(format!(
                        "schema names {} but does not define it",
                        name.fullname(None)
                    ))
                })?;
                if matches!(target, Schema::Ref { .. }) {
                    return Err(Refusal::Payload("schema reference loops".to_owned()));
                }
                // The reference itself was not a value: give its unit back.
                self.budget += 1;
                return self.value(target, depth);
            }
            Schema::Null => Json::Null,
            Schema::Boolean => match self.take(1, "a boolean")?[0] {
                0 => Json::Bool(false),
                1 => Json::Bool(true),
                b => return Err(Refusal::Payload(format!("boolean byte {b} is not 0 or 1"))),
            },
            Schema::Int => Json::from(self.int("an int")?),
            Schema::Long => Json::from(self.long("a long")?),
            Schema::Float => {
                let b = self.take(4, "a float")?;
                float(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            }
            Schema::Double => {
                let b = self.take(8, "a double")?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                float(f64::from_le_bytes(a))
            }
            Schema::Bytes => b64(self.bytes("bytes")?),
            Schema::String => Json::String(self.string("a string")?.to_owned()),
            Schema::Fixed(f) => b64(self.take(f.size, "a fixed")?),
            Schema::Enum(e) => {
                let i = self.int("an enum index")?;
                let symbol = usize::try_from(i)
                    .ok()
                    .and_then(|i| e.symbols.get(i))
                    .ok_or_else(|| {
                        Refusal::Payload(format!(
                            "enum index {i} is not a symbol of {}",
                            e.name.fullname(None)
                        ))
                    })?;
                Json::String(symbol.clone())
            }
            Schema::Union(u) => {
                let i = self.long("a union index")?;
                let branch = usize::try_from(i)
                    .ok()
                    .and_then(|i| u.variants().get(i))
                    .ok_or_else(|| {
                        Refusal::Payload(format!(
                            "union index {i} is not one of the {} branches",
                            u.variants().len()
                        ))
                    })?;
                self.budget += 1;
                return self.value(branch, depth);
            }
            Schema::Array(a) => {
                let depth = self.deeper(depth)?;
                let mut items = Vec::new();
                self.blocks("an array", |r| {
                    items.push(r.value(&a.items, depth)?);
                    Ok(())
                })?;
                Json::Array(items)
            }
            Schema::Map(m) => {
                let depth = self.deeper(depth)?;
                let mut entries: Vec<(String, Json)> = Vec::new();
                self.blocks("a map", |r| {
                    let k = r.string("a map key")?.to_owned();
                    let v = r.value(&m.types, depth)?;
                    entries.push((k, v));
                    Ok(())
                })?;
                // Sorted by key (documented); a repeated key keeps its last value.
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                let mut out = Map::with_capacity(entries.len());
                for (k, v) in entries {
                    let _ = out.insert(k, v);
                }
                Json::Object(out)
            }
            Schema::Record(r) => {
                let depth = self.deeper(depth)?;
                let mut out = Map::with_capacity(r.fields.len());
                for f in &r.fields {
                    let v = self.value(&f.schema, depth)?;
                    let _ = out.insert(f.name.clone(), v);
                }
                Json::Object(out)
            }
            Schema::Decimal(d) => {
                let unscaled = match &d.inner {
                    InnerDecimalSchema::Bytes => self.bytes("a decimal")?,
                    InnerDecimalSchema::Fixed(f) => self.take(f.size, "a decimal")?,
                };
                Json::String(decimal_string(unscaled, d.scale as i64)?)
            }
            Schema::BigDecimal => {
                let mut inner = Reader {
                    buf: self.bytes("a big-decimal")?,
                    names: self.names,
                    budget: 0,
                    max_depth: 0,
                };
                let unscaled = inner.bytes("a big-decimal's digits")?;
                let scale = inner.long("a big-decimal's scale")?;
                if !inner.buf.is_empty() {
                    return Err(Refusal::Payload(
                        "bytes left inside a big-decimal".to_owned(),
                    ));
                }
                Json::String(decimal_string(unscaled, scale)?)
            }
            Schema::Uuid(kind) => match kind {
                UuidSchema::String => Json::String(self.string("a uuid")?.to_owned()),
                UuidSchema::Bytes => uuid(self.bytes("a uuid")?)?,
                UuidSchema::Fixed(f) => uuid(self.take(f.size, "a uuid")?)?,
            },
            Schema::Date => Json::String(time::date(i64::from(self.int("a date")?))),
            Schema::TimeMillis => Json::String(time::time_of_day(
                i64::from(self.int("a time-millis")?) * 1_000_000,
                3,
            )),
            Schema::TimeMicros => Json::String(time::time_of_day(
                self.long("a time-micros")?.rem_euclid(86_400_000_000) * 1_000,
                6,
            )),
            Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => {
                let (per_second, utc) = timestamp_unit(schema);
                Json::String(time::timestamp(self.long("a timestamp")?, per_second, utc))
            }
            Schema::Duration(f) => {
                let b = self.take(f.size, "a duration")?;
                if b.len() != 12 {
                    return Err(Refusal::Payload(format!(
                        "duration is {} bytes, not 12",
                        b.len()
                    )));
                }
                let part = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                json!({"months": part(0), "days": part(4), "millis": part(8)})
            }
        })
    }
}

fn uuid(b: &[u8]) -> Result<Json, Refusal> {
    if b.len() != 16 {
        return Err(Refusal::Payload(format!(
            "uuid is {} bytes, not 16",
            b.len()
        )));
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(Json::String(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )))
}

/// A two's-complement big-endian unscaled integer and a scale as decimal text.
fn decimal_string(unscaled: &[u8], scale: i64) -> Result<String, Refusal> {
    if unscaled.len() > MAX_DECIMAL_BYTES {
        return Err(Refusal::Limit(format!(
            "decimal of {} bytes is longer than {MAX_DECIMAL_BYTES} (decoding limit)",
            unscaled.len()
        )));
    }
    if !(-MAX_BIG_DECIMAL_SCALE..=MAX_BIG_DECIMAL_SCALE).contains(&scale) {
        return Err(Refusal::Limit(format!(
            "decimal scale {scale} is outside ±{MAX_BIG_DECIMAL_SCALE} (decoding limit)"
        )));
    }
    let digits = num_bigint::BigInt::from_signed_bytes_be(unscaled).to_string();
    Ok(if scale >= 0 {
        scaled_decimal(&digits, scale as usize)
    } else if digits == "0" {
        digits
    } else {
        format!("{digits}{}", "0".repeat(scale.unsigned_abs() as usize))
    })
}

/// Of a timestamp logical type: its units per second, and whether it is UTC (`timestamp-*`)
/// rather than local (`local-timestamp-*`).
fn timestamp_unit(schema: &Schema) -> (i64, bool) {
    match schema {
        Schema::TimestampMicros => (1_000_000, true),
        Schema::TimestampNanos => (1_000_000_000, true),
        Schema::LocalTimestampMillis => (1_000, false),
        Schema::LocalTimestampMicros => (1_000_000, false),
        Schema::LocalTimestampNanos => (1_000_000_000, false),
        // timestamp-millis.
        _ => (1_000, true),
    }
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
    use apache_avro::types::Value;

    fn parse(s: &str) -> Schema {
        Schema::parse_str(s).unwrap()
    }

    fn dec(schema: &Schema, bytes: &[u8]) -> Result<Json, Refusal> {
        decode(schema, &[], bytes, &Limits::default())
    }

    #[test]
    fn scales_decimals() {
        assert_eq!(scaled_decimal("12345", 2), "123.45");
        assert_eq!(scaled_decimal("-5", 3), "-0.005");
        assert_eq!(scaled_decimal("0", 2), "0.00");
        assert_eq!(scaled_decimal("7", 0), "7");
        assert_eq!(decimal_string(&[0x30, 0x39], -2).unwrap(), "1234500");
        assert_eq!(decimal_string(&[0xff], 1).unwrap(), "-0.1");
    }

    #[test]
    #[allow(deprecated)]
    fn maps_a_record_with_logical_types() {
        let schema = parse(
            r#"{"type":"record","name":"R","namespace":"t","fields":[
            {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
            {"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}},
            {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B"]}},
            {"name":"note","type":["null","string"]},
            {"name":"big","type":"long"},
            {"name":"m","type":{"type":"map","values":"int"}},
            {"name":"u","type":{"type":"string","logicalType":"uuid"}}]}"#,
        );
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
        value.put(
            "m",
            Value::Map(
                [
                    ("b".to_owned(), Value::Int(2)),
                    ("a".to_owned(), Value::Int(1)),
                ]
                .into(),
            ),
        );
        value.put(
            "u",
            Value::Uuid("936da01f-9abd-4d9d-80c7-02af85c822a8".parse().unwrap()),
        );
        let bytes = apache_avro::to_avro_datum(&schema, value).unwrap();
        let json = dec(&schema, &bytes).unwrap();
        assert_eq!(
            json.to_string(),
            r#"{"amount":"123.45","at":"1970-01-01T00:00:00.000Z","kind":"B","note":"hi","big":9007199254740993,"m":{"a":1,"b":2},"u":"936da01f-9abd-4d9d-80c7-02af85c822a8"}"#
        );
    }

    #[test]
    fn a_payload_cut_anywhere_is_an_error() {
        // {id: long, note: ["null","string"]} with note = "hello": cut at every byte.
        let schema = parse(
            r#"{"type":"record","name":"R","fields":[{"name":"id","type":"long"},
            {"name":"note","type":["null","string"]}]}"#,
        );
        let full = [0x54, 0x02, 0x0a, b'h', b'e', b'l', b'l', b'o'];
        assert_eq!(
            dec(&schema, &full).unwrap().to_string(),
            r#"{"id":42,"note":"hello"}"#
        );
        for cut in 0..full.len() {
            assert!(
                matches!(dec(&schema, &full[..cut]), Err(Refusal::Payload(_))),
                "cut at {cut}"
            );
        }
        assert!(
            dec(&schema, &[0x54, 0x04]).is_err(),
            "union index out of range"
        );
        assert!(dec(&schema, &[0x54, 0x01]).is_err(), "negative union index");
        assert!(
            dec(&schema, &[0x54, 0x02, 0x09]).is_err(),
            "negative length"
        );
        assert!(dec(&schema, &[0x54, 0x00, 0x00]).is_err(), "trailing byte");
        let eleven = [0xff; 11];
        assert!(
            dec(&parse(r#""long""#), &eleven).is_err(),
            "varint too long"
        );
        assert!(dec(&parse(r#""int""#), &[0xff, 0xff, 0xff, 0xff, 0x7f]).is_err());
        assert!(dec(&parse(r#""boolean""#), &[2]).is_err());
    }

    #[test]
    fn recursion_deeper_than_the_limit_is_refused_without_overflowing_the_stack() {
        let schema = parse(
            r#"{"type":"record","name":"Node","fields":[{"name":"v","type":"int"},
            {"name":"next","type":["null","Node"]}]}"#,
        );
        let nest = |depth: usize| {
            let mut b = Vec::new();
            for _ in 0..depth {
                b.extend([0x02, 0x02]); // v = 1, next = branch 1 (Node)
            }
            b.extend([0x02, 0x00]); // v = 1, next = null
            b
        };
        assert!(dec(&schema, &nest(10)).is_ok());
        assert!(dec(&schema, &nest(63)).is_ok());
        assert!(matches!(dec(&schema, &nest(64)), Err(Refusal::Limit(_))));
        assert!(matches!(
            dec(&schema, &nest(200_000)),
            Err(Refusal::Limit(_))
        ));
    }

    #[test]
    fn huge_counts_of_empty_items_are_refused_before_allocation() {
        let schema = parse(r#"{"type":"array","items":{"type":"array","items":"null"}}"#);
        // One block claiming 2^62 items, then one inner block claiming as many.
        let mut b = vec![0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        b.extend_from_slice(&b.clone());
        assert!(matches!(dec(&schema, &b), Err(Refusal::Limit(_))));
        // 100 nulls in 2 bytes are fine.
        let inner = parse(r#"{"type":"array","items":"null"}"#);
        assert_eq!(
            dec(&inner, &[0xc8, 0x01, 0x00])
                .unwrap()
                .as_array()
                .unwrap()
                .len(),
            100
        );
        // A budget's worth of nulls from a few bytes is refused.
        let many = (Limits::default().value_budget(4) + 1) as i64;
        let mut b = Vec::new();
        let mut z = ((many << 1) ^ (many >> 63)) as u64;
        while z >= 0x80 {
            b.push((z as u8) | 0x80);
            z >>= 7;
        }
        b.push(z as u8);
        b.push(0);
        assert!(matches!(dec(&inner, &b), Err(Refusal::Limit(_))));
    }

    #[test]
    fn a_named_decimal_fixed_keeps_its_scale_when_used_again_by_name() {
        let money = r#"{"type":"fixed","name":"Money","namespace":"shop","size":4,
            "logicalType":"decimal","precision":9,"scale":2}"#;
        let schema = parse(&format!(
            r#"{{"type":"record","name":"Order","namespace":"shop","fields":[
            {{"name":"price","type":{money}}},{{"name":"discount","type":"Money"}}]}}"#
        ));
        let bytes = [0, 0, 0x30, 0x39, 0, 0, 0, 0x7b];
        assert_eq!(
            dec(&schema, &bytes).unwrap().to_string(),
            r#"{"price":"123.45","discount":"1.23"}"#
        );
        // The same across a schema reference: Money registered on its own subject.
        let (main, refs) = Schema::parse_str_with_list(
            r#"{"type":"record","name":"Order","namespace":"shop","fields":[
            {"name":"price","type":"Money"},{"name":"discount","type":"Money"}]}"#,
            [money],
        )
        .unwrap();
        assert_eq!(
            decode(&main, &refs, &bytes, &Limits::default())
                .unwrap()
                .to_string(),
            r#"{"price":"123.45","discount":"1.23"}"#
        );
    }

    #[test]
    fn oversized_decimals_are_a_limit_not_a_quadratic_conversion() {
        let schema = parse(r#"{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}"#);
        let mut b = vec![0x80, 0x08]; // length 512
        b.extend(std::iter::repeat_n(0x11, 512));
        assert!(matches!(dec(&schema, &b), Err(Refusal::Limit(_))));
    }
}
