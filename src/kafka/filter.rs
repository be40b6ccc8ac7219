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

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use base64::Engine as _;
use cel::common::ast::{EntryExpr, Expr};
use cel::objects::{Key, Map};
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Uses {
    key: bool,
    value: bool,
    headers: bool,
    topic: bool,
    partition: bool,
    offset: bool,
    timestamp: bool,
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
        let mut names = BTreeSet::new();
        free_variables(program.expression(), &mut Vec::new(), &mut names);
        let mut uses = Uses::default();
        for name in names {
            match name {
                "key" => uses.key = true,
                "value" => uses.value = true,
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
        if c.uses.key {
            ctx.add_variable_from_value("key", json_to_cel(input.key));
        }
        if c.uses.value {
            ctx.add_variable_from_value("value", json_to_cel(input.value));
        }
        if c.uses.headers {
            ctx.add_variable_from_value("headers", headers_to_cel(input.headers));
        }
        if c.uses.topic {
            ctx.add_variable_from_value("topic", input.topic);
        }
        if c.uses.partition {
            ctx.add_variable_from_value("partition", i64::from(input.partition));
        }
        if c.uses.offset {
            ctx.add_variable_from_value("offset", input.offset);
        }
        if c.uses.timestamp {
            ctx.add_variable_from_value("timestamp", timestamp_to_cel(input.timestamp_ms));
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

/// The identifiers `e` reads that no comprehension (`exists`, `all`, `map`, …) inside it binds.
fn free_variables<'a>(e: &'a IdedExpr, bound: &mut Vec<&'a str>, out: &mut BTreeSet<&'a str>) {
    match &e.expr {
        Expr::Unspecified | Expr::Literal(_) => {}
        Expr::Ident(name) => {
            if !name.starts_with('@') && !bound.contains(&name.as_str()) {
                let _ = out.insert(name.as_str());
            }
        }
        Expr::Select(s) => free_variables(&s.operand, bound, out),
        Expr::Call(c) => {
            if let Some(t) = &c.target {
                free_variables(t, bound, out);
            }
            for a in &c.args {
                free_variables(a, bound, out);
            }
        }
        Expr::List(l) => {
            for x in &l.elements {
                free_variables(x, bound, out);
            }
        }
        Expr::Map(m) => {
            for entry in &m.entries {
                entry_variables(&entry.expr, bound, out);
            }
        }
        Expr::Struct(s) => {
            for entry in &s.entries {
                entry_variables(&entry.expr, bound, out);
            }
        }
        Expr::Comprehension(c) => {
            free_variables(&c.iter_range, bound, out);
            free_variables(&c.accu_init, bound, out);
            let depth = bound.len();
            bound.push(c.iter_var.as_str());
            if let Some(v) = &c.iter_var2 {
                bound.push(v.as_str());
            }
            bound.push(c.accu_var.as_str());
            for part in [&c.loop_cond, &c.loop_step, &c.result] {
                free_variables(part, bound, out);
            }
            bound.truncate(depth);
        }
    }
}

fn entry_variables<'a>(e: &'a EntryExpr, bound: &mut Vec<&'a str>, out: &mut BTreeSet<&'a str>) {
    match e {
        EntryExpr::StructField(f) => free_variables(&f.value, bound, out),
        EntryExpr::MapEntry(m) => {
            free_variables(&m.key, bound, out);
            free_variables(&m.value, bound, out);
        }
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The CEL value of a decoded key or value.
fn json_to_cel(v: &Json) -> Value {
    match v {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                Value::UInt(u)
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::String(Arc::new(s.clone())),
        Json::Array(items) => Value::List(Arc::new(items.iter().map(json_to_cel).collect())),
        Json::Object(fields) => {
            let map: HashMap<Key, Value> = fields
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), json_to_cel(v)))
                .collect();
            Value::Map(Map { map: Arc::new(map) })
        }
    }
}

fn headers_to_cel(headers: &[EventHeader]) -> Value {
    let mut map: HashMap<Key, Value> = HashMap::with_capacity(headers.len());
    for h in headers {
        let value = match (&h.value, h.encoding) {
            (None, _) => Value::Null,
            (Some(b64), "base64") => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_or(Value::Null, |b| Value::Bytes(Arc::new(b))),
            (Some(s), _) => Value::String(Arc::new(s.clone())),
        };
        // Later headers of a name replace earlier ones.
        let _ = map.insert(Key::String(Arc::new(h.name.clone())), value);
    }
    Value::Map(Map { map: Arc::new(map) })
}

fn timestamp_to_cel(ms: Option<i64>) -> Value {
    ms.and_then(chrono::DateTime::from_timestamp_millis)
        .map_or(Value::Null, |t| Value::Timestamp(t.fixed_offset()))
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
}
