//! Trigger filters: `filter = '<CEL expression>'` on a trigger, in the Common Expression
//! Language, evaluated on the decoded record before a run is started.
//!
//! The expression is compiled when the configuration is loaded (a [`Filter`] deserializes by
//! compiling), so a syntax error or a variable the filter cannot see is a configuration error
//! at the filter's key, with the line and column, for `run` and `config check` alike.
//!
//! What the expression sees (see README, "Filters"):
//! - `key`, `value`: the decoded key and value, as the event carries them (docs/event.md):
//!   JSON integers are CEL `int` (`uint` above `i64`), other numbers `double`, objects maps;
//! - `headers`: a map from header name to value (`string`; `bytes` for a value that is not
//!   UTF-8; `null` for none); of repeated names the last one;
//! - `topic` (`string`), `partition`, `offset` (`int`);
//! - `timestamp`: the record timestamp (`google.protobuf.Timestamp`), or `null` without one.
//!
//! Evaluation is pure and synchronous. Only the variables the expression names are built for a
//! record, so a filter on `headers` never converts the value. An evaluation error (a missing
//! key, a comparison of a string with a number, a result that is not a `bool`) is not a match;
//! the worker counts it apart from the records the filter refused.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use base64::Engine as _;
use cel::common::ast::{EntryExpr, Expr};
use cel::common::types::{
    CelBool, CelBytes, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString,
    CelTimestamp, CelUInt,
};
use cel::common::value::Val;
use cel::IdedExpr;
use cel::{Context, Env, Program, Value};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value as Json;

use rdkafka::message::{Message, OwnedMessage};

use super::worker::{TriggerRuntime, WorkOutcome};
use crate::codec::Decoded;
use crate::dispatch::event::EventHeader;

/// The variables a filter may use.
pub const VARIABLES: [&str; 7] = [
    "key",
    "value",
    "headers",
    "topic",
    "partition",
    "offset",
    "timestamp",
];

/// A compiled filter. Cheap to clone (shared); Serialize and Debug show the expression.
#[derive(Clone)]
pub struct Filter {
    inner: Arc<Compiled>,
}

struct Compiled {
    source: String,
    env: Arc<Env>,
    program: Program,
    uses: Uses,
    /// Whether an evaluation error was logged at warn already (once per trigger).
    warned: AtomicBool,
}

/// Which variables the expression names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Uses {
    key: Reads,
    value: Reads,
    headers: bool,
    topic: bool,
    partition: bool,
    offset: bool,
    timestamp: bool,
}

/// How much of a decoded key or value an expression reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Reads {
    /// Nothing: the variable is not bound.
    #[default]
    Nothing,
    /// Only these fields, each through a selection (`value.amount`, `has(value.email)`):
    /// of an object, only they are converted; the others could not change the result.
    Fields(Vec<String>),
    /// The whole value (`size(value)`, `"x" in value`, `value == {…}`, a string method).
    Whole,
}

/// Why an expression is not a filter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    /// The text is not a CEL expression.
    #[error("not a CEL expression: line {line}, column {column}: {message}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What the parser said.
        message: String,
    },
    /// The expression names a variable the filter does not provide.
    #[error("unknown variable `{name}` (a filter sees key, value, headers, topic, partition, offset and timestamp)")]
    UnknownVariable {
        /// The variable.
        name: String,
    },
}

/// The record as the filter sees it.
#[derive(Clone, Copy, Debug)]
pub struct FilterInput<'a> {
    /// The decoded key.
    pub key: &'a Json,
    /// The decoded value.
    pub value: &'a Json,
    /// The record headers, in order.
    pub headers: &'a [EventHeader],
    /// Topic.
    pub topic: &'a str,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Record timestamp, ms since the epoch.
    pub timestamp_ms: Option<i64>,
}

/// What a filter said about a record.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The expression is true: the record starts a run.
    Match,
    /// The expression is false: no run.
    NoMatch,
    /// The expression could not be evaluated on this record (a missing key, a wrong type):
    /// treated as no match, counted apart.
    Error(String),
}

impl Filter {
    /// Compiles `source`.
    pub fn compile(source: &str) -> Result<Self, FilterError> {
        let env = Arc::new(Env::stdlib());
        let program = env.compile(source).map_err(|errors| {
            let first = errors.errors.first();
            let (line, column) = first.map_or((1, 1), |e| (e.pos.0, e.pos.1));
            FilterError::Syntax {
                line: usize::try_from(line).unwrap_or(0).max(1),
                column: usize::try_from(column).unwrap_or(0).max(1),
                message: first.map_or_else(|| "cannot parse".to_owned(), |e| one_line(&e.msg)),
            }
        })?;
        let mut names = Names::default();
        names.walk(program.expression(), &mut Vec::new());
        let mut uses = Uses::default();
        for &name in &names.free {
            match name {
                "key" => uses.key = names.reads(name),
                "value" => uses.value = names.reads(name),
                "headers" => uses.headers = true,
                "topic" => uses.topic = true,
                "partition" => uses.partition = true,
                "offset" => uses.offset = true,
                "timestamp" => uses.timestamp = true,
                // Type names (`type(value.n) == int`).
                "int" | "uint" | "double" | "bool" | "string" | "bytes" | "list" | "map"
                | "null_type" | "type" | "dyn" => {}
                other => {
                    return Err(FilterError::UnknownVariable {
                        name: other.to_owned(),
                    })
                }
            }
        }
        Ok(Self {
            inner: Arc::new(Compiled {
                source: source.to_owned(),
                env,
                program,
                uses,
                warned: AtomicBool::new(false),
            }),
        })
    }

    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    /// Evaluates the filter on a record.
    pub fn evaluate(&self, input: &FilterInput<'_>) -> Verdict {
        let c = &*self.inner;
        let mut ctx = Context::with_env(Arc::clone(&c.env));
        if let Some(key) = reads_val(&c.uses.key, input.key) {
            ctx.add_variable_as_val("key", key);
        }
        if let Some(value) = reads_val(&c.uses.value, input.value) {
            ctx.add_variable_as_val("value", value);
        }
        if c.uses.headers {
            ctx.add_variable_as_val("headers", headers_val(input.headers));
        }
        if c.uses.topic {
            ctx.add_variable_as_val("topic", Box::new(CelString::from(input.topic)));
        }
        if c.uses.partition {
            ctx.add_variable_as_val(
                "partition",
                Box::new(CelInt::from(i64::from(input.partition))),
            );
        }
        if c.uses.offset {
            ctx.add_variable_as_val("offset", Box::new(CelInt::from(input.offset)));
        }
        if c.uses.timestamp {
            ctx.add_variable_as_val("timestamp", timestamp_val(input.timestamp_ms));
        }
        match c.program.execute(&ctx) {
            Ok(Value::Bool(true)) => Verdict::Match,
            Ok(Value::Bool(false)) => Verdict::NoMatch,
            Ok(other) => Verdict::Error(format!(
                "the filter returned {:?}, not a bool",
                other.type_of()
            )),
            Err(e) => Verdict::Error(one_line(&e.to_string())),
        }
    }

    /// True the first time it is called (an evaluation error is logged at warn once per
    /// trigger; later ones at debug).
    pub fn first_error(&self) -> bool {
        !self.inner.warned.swap(true, Ordering::Relaxed)
    }
}

/// A trigger's filter on a decoded record: None when the record may start a run (no filter,
/// or it matches), else how it was handled. The worker's one call into this module.
pub(crate) fn screen(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    headers: &[EventHeader],
    key: &Decoded,
    value: &Decoded,
) -> Option<WorkOutcome> {
    let filter = trigger.config.filter.as_ref()?;
    let input = FilterInput {
        key: &key.value,
        value: &value.value,
        headers,
        topic: msg.topic(),
        partition: msg.partition(),
        offset: msg.offset(),
        timestamp_ms: msg.timestamp().to_millis(),
    };
    match filter.evaluate(&input) {
        Verdict::Match => None,
        Verdict::NoMatch => Some(WorkOutcome::Filtered),
        Verdict::Error(reason) => {
            if filter.first_error() {
                tracing::warn!(
                    connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                    partition = msg.partition(), offset = msg.offset(), error = %reason,
                    "the filter cannot be evaluated on this record; counted as not matching (outcome=\"filter_error\"; said once per trigger, then at debug)"
                );
            } else {
                tracing::debug!(
                    connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                    partition = msg.partition(), offset = msg.offset(), error = %reason,
                    "the filter cannot be evaluated on this record; counted as not matching"
                );
            }
            Some(WorkOutcome::FilterError)
        }
    }
}

/// The identifiers an expression reads that no comprehension (`exists`, `all`, `map`, …) in it
/// binds, and how each is read.
#[derive(Default)]
struct Names<'a> {
    /// Every free identifier.
    free: BTreeSet<&'a str>,
    /// Those read other than through a field selection.
    whole: BTreeSet<&'a str>,
    /// The fields selected on each.
    fields: BTreeMap<&'a str, BTreeSet<&'a str>>,
}

impl<'a> Names<'a> {
    fn reads(&self, name: &str) -> Reads {
        if !self.free.contains(name) {
            Reads::Nothing
        } else if self.whole.contains(name) {
            Reads::Whole
        } else {
            let fields = self.fields.get(name).into_iter().flatten();
            Reads::Fields(fields.map(|f| (*f).to_owned()).collect())
        }
    }

    fn free_ident(e: &'a IdedExpr, bound: &[&'a str]) -> Option<&'a str> {
        match &e.expr {
            Expr::Ident(name) if !name.starts_with('@') && !bound.contains(&name.as_str()) => {
                Some(name.as_str())
            }
            _ => None,
        }
    }

    fn walk(&mut self, e: &'a IdedExpr, bound: &mut Vec<&'a str>) {
        match &e.expr {
            Expr::Unspecified | Expr::Literal(_) => {}
            Expr::Ident(_) => {
                if let Some(name) = Self::free_ident(e, bound) {
                    let _ = self.free.insert(name);
                    let _ = self.whole.insert(name);
                }
            }
            Expr::Select(s) => match Self::free_ident(&s.operand, bound) {
                Some(name) => {
                    let _ = self.free.insert(name);
                    let _ = self
                        .fields
                        .entry(name)
                        .or_default()
                        .insert(s.field.as_str());
                }
                None => self.walk(&s.operand, bound),
            },
            Expr::Call(c) => {
                if let Some(t) = &c.target {
                    self.walk(t, bound);
                }
                for a in &c.args {
                    self.walk(a, bound);
                }
            }
            Expr::List(l) => {
                for x in &l.elements {
                    self.walk(x, bound);
                }
            }
            Expr::Map(m) => {
                for entry in &m.entries {
                    self.walk_entry(&entry.expr, bound);
                }
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    self.walk_entry(&entry.expr, bound);
                }
            }
            Expr::Comprehension(c) => {
                self.walk(&c.iter_range, bound);
                self.walk(&c.accu_init, bound);
                let depth = bound.len();
                bound.push(c.iter_var.as_str());
                if let Some(v) = &c.iter_var2 {
                    bound.push(v.as_str());
                }
                bound.push(c.accu_var.as_str());
                for part in [&c.loop_cond, &c.loop_step, &c.result] {
                    self.walk(part, bound);
                }
                bound.truncate(depth);
            }
        }
    }

    fn walk_entry(&mut self, e: &'a EntryExpr, bound: &mut Vec<&'a str>) {
        match e {
            EntryExpr::StructField(f) => self.walk(&f.value, bound),
            EntryExpr::MapEntry(m) => {
                self.walk(&m.key, bound);
                self.walk(&m.value, bound);
            }
        }
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The CEL value of a decoded key or value, built straight from the JSON and borrowing its
/// strings (no copy of the text, no intermediate `cel::Value`).
fn json_val<'v>(v: &'v Json) -> Box<dyn Val + 'v> {
    match v {
        Json::Null => Box::new(CelNull),
        Json::Bool(b) => Box::new(CelBool::from(*b)),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Box::new(CelInt::from(i))
            } else if let Some(u) = n.as_u64() {
                Box::new(CelUInt::from(u))
            } else {
                Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN)))
            }
        }
        Json::String(s) => Box::new(CelString::from(s.as_str())),
        Json::Array(items) => Box::new(CelList::from(
            items.iter().map(json_val).collect::<Vec<_>>(),
        )),
        Json::Object(fields) => Box::new(CelMap::from(
            fields
                .iter()
                .map(|(k, v)| (CelMapKey::String(CelString::from(k.as_str())), json_val(v)))
                .collect::<HashMap<_, _>>(),
        )),
    }
}

/// The CEL value of a key or value as far as the expression reads it: of an object whose
/// fields are only selected, those fields.
fn reads_val<'v>(reads: &Reads, v: &'v Json) -> Option<Box<dyn Val + 'v>> {
    match (reads, v) {
        (Reads::Nothing, _) => None,
        (Reads::Fields(fields), Json::Object(all)) => Some(Box::new(CelMap::from(
            fields
                .iter()
                .filter_map(|f| all.get_key_value(f.as_str()))
                .map(|(k, v)| (CelMapKey::String(CelString::from(k.as_str())), json_val(v)))
                .collect::<HashMap<_, _>>(),
        ))),
        _ => Some(json_val(v)),
    }
}

fn headers_val<'v>(headers: &'v [EventHeader]) -> Box<dyn Val + 'v> {
    let mut map: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = HashMap::with_capacity(headers.len());
    for h in headers {
        let value: Box<dyn Val + 'v> = match (&h.value, h.encoding) {
            (None, _) => Box::new(CelNull),
            (Some(b64), "base64") => match base64::engine::general_purpose::STANDARD.decode(b64) {
                Ok(bytes) => Box::new(CelBytes::from(bytes)),
                Err(_) => Box::new(CelNull),
            },
            (Some(text), _) => Box::new(CelString::from(text.as_str())),
        };
        // Later headers of a name replace earlier ones.
        let _ = map.insert(CelMapKey::String(CelString::from(h.name.as_str())), value);
    }
    Box::new(CelMap::from(map))
}

fn timestamp_val(ms: Option<i64>) -> Box<dyn Val + 'static> {
    match ms.and_then(chrono::DateTime::from_timestamp_millis) {
        Some(t) => Box::new(CelTimestamp::from(t.fixed_offset())),
        None => Box::new(CelNull),
    }
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Filter").field(&self.inner.source).finish()
    }
}

impl Serialize for Filter {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.inner.source)
    }
}

impl<'de> Deserialize<'de> for Filter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let source = String::deserialize(d)?;
        Filter::compile(&source).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn input<'a>(key: &'a Json, value: &'a Json, headers: &'a [EventHeader]) -> FilterInput<'a> {
        FilterInput {
            key,
            value,
            headers,
            topic: "payments",
            partition: 3,
            offset: 42,
            timestamp_ms: Some(1_700_000_000_123),
        }
    }

    fn header(name: &str, value: &str) -> EventHeader {
        EventHeader {
            name: name.into(),
            value: Some(value.into()),
            encoding: "utf8",
        }
    }

    fn eval(expr: &str, value: Json) -> Verdict {
        let headers = [
            header("source", "web"),
            header("source", "checkout"),
            EventHeader {
                name: "bin".into(),
                value: Some("/w==".into()),
                encoding: "base64",
            },
        ];
        let key = json!("cust-7");
        Filter::compile(expr)
            .unwrap()
            .evaluate(&input(&key, &value, &headers))
    }

    #[test]
    fn a_syntax_error_names_line_and_column() {
        let e = Filter::compile("value.amount > ").unwrap_err();
        match &e {
            FilterError::Syntax { line, column, .. } => {
                assert_eq!((*line, *column), (1, 16), "{e}");
            }
            other => panic!("expected a syntax error, got {other:?}"),
        }
        let e = Filter::compile("value.amount > 1 &&\n  headers.source = \"x\"").unwrap_err();
        assert!(matches!(e, FilterError::Syntax { line: 2, .. }), "{e}");
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn an_unknown_variable_is_refused_and_comprehension_variables_are_not() {
        assert_eq!(
            Filter::compile("amount > 3").unwrap_err(),
            FilterError::UnknownVariable {
                name: "amount".into()
            }
        );
        assert!(Filter::compile("value.items.exists(i, i > 2)").is_ok());
        assert!(Filter::compile("value.items.all(x, x.n > 2) && offset >= 0").is_ok());
    }

    #[test]
    fn evaluates_on_typed_values() {
        let v = json!({"amount": 1500.5, "count": 3, "big": 18_446_744_073_709_551_615u64,
                       "tags": ["a", "vip"], "customer": {"country": "NO"}, "note": null});
        let m = |e: &str| eval(e, v.clone());
        assert_eq!(
            m(r#"value.amount > 1000.0 && headers.source == "checkout""#),
            Verdict::Match
        );
        assert_eq!(m("value.amount > 2000.0"), Verdict::NoMatch);
        assert_eq!(m("value.count == 3"), Verdict::Match);
        assert_eq!(m("value.big == 18446744073709551615u"), Verdict::Match);
        assert_eq!(m(r#""vip" in value.tags"#), Verdict::Match);
        assert_eq!(m(r#"value.customer.country == "NO""#), Verdict::Match);
        assert_eq!(m("value.note == null"), Verdict::Match);
        assert_eq!(
            m(r#"key == "cust-7" && key.startsWith("cust-")"#),
            Verdict::Match
        );
        assert_eq!(
            m(r#"topic == "payments" && partition == 3 && offset == 42"#),
            Verdict::Match
        );
        assert_eq!(m("headers.bin == b'\\xff'"), Verdict::Match);
        assert_eq!(
            m(r#"timestamp > timestamp("2023-11-14T22:13:20Z")"#),
            Verdict::Match
        );
        assert_eq!(
            m(r#"has(value.customer) && !has(value.missing)"#),
            Verdict::Match
        );
        assert_eq!(m(r#"value.customer.country.matches("^N")"#), Verdict::Match);
        assert_eq!(
            m(r#""source" in headers && !("nope" in headers)"#),
            Verdict::Match
        );
        assert_eq!(
            m("int(value.amount) == 1500 && double(value.count) > 2.5"),
            Verdict::Match
        );
        assert_eq!(
            m("size(value.tags) == 2 && size(value) == 6"),
            Verdict::Match
        );
        // Avro decimals and Protobuf 64-bit integers are strings in the event: converted.
        let typed = json!({"price": "1234.50", "weight": "9007199254740993"});
        assert_eq!(
            eval(
                "double(value.price) > 1000.0 && int(value.weight) > 9007199254740992",
                typed
            ),
            Verdict::Match
        );
        // Comparisons mix int and double; arithmetic does not (see the evaluation errors).
        assert_eq!(
            m("value.count > 2.5 && value.amount > 1000 && value.count == 3.0"),
            Verdict::Match
        );
    }

    #[test]
    fn only_the_selected_fields_of_an_object_are_built() {
        let reads = |e: &str| Filter::compile(e).unwrap().inner.uses.value.clone();
        assert_eq!(
            reads("value.amount > 1.0 && has(value.email) && value.customer.country == 'NO'"),
            Reads::Fields(vec!["amount".into(), "customer".into(), "email".into()])
        );
        assert_eq!(reads("size(value) > 1 && value.a > 0"), Reads::Whole);
        assert_eq!(reads(r#""a" in value"#), Reads::Whole);
        assert_eq!(
            reads("value.items.exists(value, value > 1)"),
            Reads::Fields(vec!["items".into()])
        );
        assert_eq!(reads("key == 'k'"), Reads::Nothing);
        // The same answers as with the whole value.
        let v = json!({"a": 1, "b": {"c": "x"}, "n": null});
        for (expr, verdict) in [
            ("value.a == 1 && value.b.c == 'x'", Verdict::Match),
            ("has(value.n) && !has(value.z)", Verdict::Match),
            ("value.z == 1", Verdict::Error(String::new())),
            ("size(value) == 3", Verdict::Match),
        ] {
            let got = eval(expr, v.clone());
            match verdict {
                Verdict::Error(_) => assert!(matches!(got, Verdict::Error(_)), "{expr}: {got:?}"),
                want => assert_eq!(got, want, "{expr}"),
            }
        }
        // A value that is not an object is built whole (selecting on it is an error either way).
        assert!(matches!(
            eval("value.a == 1", json!("text")),
            Verdict::Error(_)
        ));
        assert_eq!(
            eval("value.startsWith('te')", json!("text")),
            Verdict::Match
        );
    }

    #[test]
    fn evaluation_errors_are_not_matches() {
        let v = json!({"amount": "12", "n": 1});
        // A missing field, a missing header, a wrong type, a result that is not a bool.
        for expr in [
            "value.missing > 3",
            r#"headers.nope == "x""#,
            "value.amount > 10",
            "value.n",
            "value.n + 1.5 > 0.0",
        ] {
            assert!(
                matches!(eval(expr, v.clone()), Verdict::Error(_)),
                "{expr}: {:?}",
                eval(expr, v.clone())
            );
        }
    }

    #[test]
    fn round_trips_through_serde_as_its_text() {
        #[derive(Deserialize, Serialize)]
        struct T {
            filter: Filter,
        }
        let t: T = toml::from_str("filter = 'value.n > 1'").unwrap();
        assert_eq!(t.filter.source(), "value.n > 1");
        assert_eq!(
            toml::to_string(&t).unwrap().trim(),
            "filter = \"value.n > 1\""
        );
        let e = toml::from_str::<T>("filter = 'value.n >'").err().unwrap();
        assert!(e.to_string().contains("line 1, column"), "{e}");
    }

    /// The cost of a filter per event, printed (never a pass/fail on speed). Run optimised:
    /// `cargo test --lib --config 'profile.dev.package."tessel-kafka".opt-level=3'
    /// --config 'profile.dev.package.cel.opt-level=3' -- --ignored --nocapture filter_cost`.
    #[test]
    #[ignore = "a measurement: run with --ignored --nocapture, optimised"]
    fn filter_cost_per_event() {
        use std::hint::black_box;
        use std::time::Instant;
        let value = json!({
            "order_id": "o-000123", "amount": 1234.5, "currency": "EUR", "status": "PAID",
            "placed_at": "2024-03-01T12:34:56.789Z", "channel": "web",
            "customer": {"id": 77, "name": "Ada Lovelace", "email": "ada@example.com", "country": "NO"},
            "items": [{"sku": "A-1", "qty": 2, "price": 500.0}, {"sku": "B-7", "qty": 1, "price": 234.5}],
            "tags": ["vip", "first-order"]
        });
        let key = json!("cust-77");
        let headers = [
            header("source", "checkout"),
            header(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            header("content-type", "application/json"),
        ];
        let input = input(&key, &value, &headers);
        let n: u32 = 100_000;
        let timed = |what: &str, f: &dyn Fn() -> bool| {
            for _ in 0..1_000 {
                black_box(f());
            }
            let start = Instant::now();
            for _ in 0..n {
                black_box(f());
            }
            let ns = start.elapsed().as_nanos() / u128::from(n);
            println!("{ns:>7} ns/event  {what}");
        };
        timed("serde_json::to_vec(value) (for scale)", &|| {
            !serde_json::to_vec(black_box(&value)).unwrap().is_empty()
        });
        for expr in [
            r#"headers.source == "checkout""#,
            r#"value.amount > 1000.0 && headers.source == "checkout""#,
            r#"value.customer.country == "NO" && value.items.exists(i, i.sku == "B-7")"#,
            r#"topic == "payments" && partition == 3"#,
        ] {
            let f = Filter::compile(expr).unwrap();
            assert_eq!(f.evaluate(&input), Verdict::Match, "{expr}");
            timed(expr, &|| f.evaluate(black_box(&input)) == Verdict::Match);
        }
    }
}
