//! Trigger filters: `filter = '<CEL expression>'` on a trigger, in the Common Expression
//! Language, evaluated on the decoded record before a run is started.
//!
//! The expression is compiled when the configuration is loaded (a [`Filter`] deserializes by
//! compiling), so a syntax error or a variable the filter cannot see is a configuration error
//! at the filter's key, with the line and column, for `run` and `config check` alike.
//!
//! What the expression sees (see docs/configuration.md, "Filters"):
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

use super::run::{TriggerRuntime, WorkOutcome};
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

/// The longest expression a filter may be, in bytes (docs/configuration.md, "Filters"): room for a long
/// list of ids, and a bound on the work of compiling it.
pub const MAX_LEN: usize = 16 * 1024;

/// How deeply a filter may nest (docs/configuration.md, "Filters"; what counts: [`check_nesting`]). The CEL
/// parser, the walk of the compiled expression and its evaluation recurse once per level, so an
/// expression nested far deeper (100 000 `(`, or `value.a.a.a…`) would overflow the stack and
/// abort the process: [`check_nesting`] refuses it before the parser sees it. Real filters nest
/// a few levels. A filter this deep evaluates on a 2 MiB stack (a tokio worker's) in a debug
/// build too (measured 2026-12-03: chains of 48 indexes, selections or operators do, 62 do
/// not), and compiles on [`COMPILE_STACK`].
pub const MAX_DEPTH: usize = 32;

/// The stack of the thread a filter is compiled on. The CEL parser (ANTLR-generated) takes
/// about 170 KiB of stack per parenthesis or bracket in a debug build (measured 2026-12-03:
/// 12 levels overflow 2 MiB, 64 fit 16 MiB), far less optimised, so a filter is not compiled
/// on the caller's stack (a tokio worker's is 2 MiB) but on a thread with about twice what
/// [`MAX_DEPTH`] levels take. Only the pages used are ever touched.
const COMPILE_STACK: usize = 16 << 20;

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
    /// No thread could be started to compile the expression on (see [`COMPILE_STACK`]).
    #[error("cannot start a thread to compile the filter on: {0}")]
    Thread(String),
    /// The expression is longer than [`MAX_LEN`].
    #[error("the expression is {len} bytes long; a filter is at most {max} bytes")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// [`MAX_LEN`].
        max: usize,
    },
    /// The expression nests deeper than [`MAX_DEPTH`] (see [`check_nesting`]).
    #[error("nested too deeply: the {what} at line {line}, column {column} goes past {max} levels (brackets, operators and field selections nest at most {max} deep in a filter)")]
    TooDeep {
        /// What went past the limit: `parenthesis`, `bracket`, `brace`, `call`, `index`,
        /// `field selection`, `operator`, `unary operator` or `conditional`.
        what: &'static str,
        /// 1-based line.
        line: usize,
        /// 1-based column, in characters.
        column: usize,
        /// [`MAX_DEPTH`].
        max: usize,
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
        if source.len() > MAX_LEN {
            return Err(FilterError::TooLong {
                len: source.len(),
                max: MAX_LEN,
            });
        }
        check_nesting(source)?;
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("filter-compile".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(scope, || Self::compile_checked(source))
                .map_err(|e| FilterError::Thread(e.to_string()))?
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Compiles `source`, no longer than [`MAX_LEN`] and nested no deeper than [`MAX_DEPTH`],
    /// on a thread with [`COMPILE_STACK`].
    fn compile_checked(source: &str) -> Result<Self, FilterError> {
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

/// One bracket of an expression (or the expression itself) while [`check_nesting`] scans it.
#[derive(Default)]
struct Level {
    /// 1 for a bracket, 0 for the expression itself.
    own: usize,
    /// The `?` of conditionals in it (each nests the rest of the bracket).
    conditionals: usize,
    /// Operators, field selections and indexes in the current operand (since the last `,`,
    /// `:`, `&&` or `||`).
    ops: usize,
    /// The deepest bracket closed in the current operand.
    inner: usize,
    /// The deepest operand finished in it.
    deepest: usize,
}

impl Level {
    fn operand(&self) -> usize {
        self.ops + self.inner
    }

    /// At least the depth of the expression tree under this bracket.
    fn depth(&self) -> usize {
        self.own + self.conditionals + self.deepest.max(self.operand())
    }

    fn end_operand(&mut self) {
        self.deepest = self.deepest.max(self.operand());
        self.ops = 0;
        self.inner = 0;
    }
}

/// Refuses an expression nested deeper than [`MAX_DEPTH`], by a scan of its text that never
/// recurses. It counts, along any path into the expression, the brackets (`(`, `[`, `{`, calls
/// and indexes) around it and the operators, field selections and `?` before or after it
/// within each bracket, which is at least the depth of the parse and of the expression tree.
/// `&&`, `||`, `,` and `:` separate operands (the parser builds `&&` and `||` chains
/// balanced), so `a && b && …` of any length is not deep. Strings and comments are skipped.
/// Returns the depth.
fn check_nesting(source: &str) -> Result<usize, FilterError> {
    let bytes = source.as_bytes();
    let mut deepest = 0;
    let mut levels = vec![Level::default()];
    // Whether the last token ends an operand: then `(` is a call, `[` an index, `-` binary.
    let mut after_operand = false;
    let mut i = 0;
    while i < bytes.len() {
        let at = i;
        let next = bytes.get(i + 1).copied();
        let what = match bytes[i] {
            b' ' | b'\t' | b'\r' | b'\n' => {
                i += 1;
                continue;
            }
            b'/' if next == Some(b'/') => {
                i = bytes[i..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(bytes.len(), |n| i + n);
                continue;
            }
            b'\'' | b'"' => {
                i = skip_string(bytes, i, false);
                after_operand = true;
                continue;
            }
            b'0'..=b'9' => {
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric()
                        || (bytes[i] == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)))
                {
                    i += 1;
                }
                after_operand = true;
                continue;
            }
            b if b.is_ascii_alphabetic() || b == b'_' => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let word = &bytes[at..i];
                if matches!(bytes.get(i), Some(b'\'' | b'"'))
                    && word.len() <= 2
                    && word.iter().all(|b| matches!(b, b'r' | b'R' | b'b' | b'B'))
                {
                    // A raw or bytes string: r'…', b"…", rb'…'.
                    let raw = word.iter().any(|b| matches!(b, b'r' | b'R'));
                    i = skip_string(bytes, i, raw);
                    after_operand = true;
                    continue;
                }
                if word == b"in" {
                    levels.last_mut().expect("the expression's level").ops += 1;
                    after_operand = false;
                    "operator"
                } else {
                    after_operand = true;
                    continue;
                }
            }
            open @ (b'(' | b'[' | b'{') => {
                i += 1;
                let what = match (open, after_operand) {
                    (b'(', true) => "call",
                    (b'(', false) => "parenthesis",
                    (b'[', true) => {
                        levels.last_mut().expect("the expression's level").ops += 1;
                        "index"
                    }
                    (b'[', false) => "bracket",
                    _ => "brace",
                };
                levels.push(Level {
                    own: 1,
                    ..Level::default()
                });
                after_operand = false;
                what
            }
            b')' | b']' | b'}' => {
                i += 1;
                if levels.len() > 1 {
                    let closed = levels.pop().expect("more than one level").depth();
                    let level = levels.last_mut().expect("the expression's level");
                    level.inner = level.inner.max(closed);
                }
                after_operand = true;
                // A closing bracket adds no depth: what it closed was counted already.
                continue;
            }
            b',' | b':' => {
                i += 1;
                levels
                    .last_mut()
                    .expect("the expression's level")
                    .end_operand();
                after_operand = false;
                continue;
            }
            b'&' | b'|' if next == Some(bytes[i]) => {
                i += 2;
                levels
                    .last_mut()
                    .expect("the expression's level")
                    .end_operand();
                after_operand = false;
                continue;
            }
            b'?' => {
                i += 1;
                levels
                    .last_mut()
                    .expect("the expression's level")
                    .conditionals += 1;
                after_operand = false;
                "conditional"
            }
            b'.' => {
                i += 1;
                levels.last_mut().expect("the expression's level").ops += 1;
                after_operand = false;
                "field selection"
            }
            b'!' | b'-' if !after_operand && next != Some(b'=') => {
                i += 1;
                levels.last_mut().expect("the expression's level").ops += 1;
                "unary operator"
            }
            b'=' | b'!' | b'<' | b'>' | b'+' | b'-' | b'*' | b'/' | b'%' => {
                i += 1;
                if next == Some(b'=') {
                    i += 1;
                }
                levels.last_mut().expect("the expression's level").ops += 1;
                after_operand = false;
                "operator"
            }
            _ => {
                // Not CEL: the parser says where.
                i += 1;
                continue;
            }
        };
        // The depth at this point: the brackets around it and what precedes it in each.
        let (innermost, outer) = levels.split_last().expect("the expression's level");
        let depth = outer
            .iter()
            .map(|l| l.own + l.conditionals + l.ops)
            .sum::<usize>()
            + innermost.depth();
        deepest = deepest.max(depth);
        if depth > MAX_DEPTH {
            let before = &source[..at];
            let line_start = before.rfind('\n').map_or(0, |n| n + 1);
            return Err(FilterError::TooDeep {
                what,
                line: before.matches('\n').count() + 1,
                column: before[line_start..].chars().count() + 1,
                max: MAX_DEPTH,
            });
        }
    }
    Ok(deepest)
}

/// The index after the string literal whose opening quote is at `start` (`'…'`, `"…"`, or
/// tripled; in a raw one a backslash escapes nothing), or the end of an unterminated one.
fn skip_string(bytes: &[u8], start: usize, raw: bool) -> usize {
    let quote = bytes[start];
    let triple = bytes[start..].starts_with(&[quote; 3]);
    let mut i = start + if triple { 3 } else { 1 };
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if !raw => i += 2,
            q if q == quote && (!triple || bytes[i..].starts_with(&[quote; 3])) => {
                return i + if triple { 3 } else { 1 };
            }
            b'\n' if !triple => return i,
            _ => i += 1,
        }
    }
    bytes.len()
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
            name_encoding: "utf8",
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
                name_encoding: "utf8",
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

    /// Runs `f` on a thread with a 2 MiB stack (a tokio worker's, and a test thread's): a
    /// stack overflow aborts the whole test binary, so a crash cannot pass unnoticed.
    fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    /// The hostile shapes: what goes past the limit, the expression for a repetition count
    /// `n`, how much the scan counts beyond `n` (what wraps the repeated part), and the value
    /// it is evaluated on.
    #[allow(clippy::type_complexity)]
    fn shapes() -> Vec<(&'static str, fn(usize) -> String, usize, Json)> {
        fn nested_a(n: usize) -> Json {
            (0..n).fold(json!(1), |v, _| json!({ "a": v }))
        }
        fn nested_list(n: usize) -> Json {
            (0..n).fold(json!(1), |v, _| json!([v]))
        }
        vec![
            // (((…true…)))
            (
                "parenthesis",
                |n| format!("{}true{}", "(".repeat(n), ")".repeat(n)),
                0,
                json!(null),
            ),
            // !!!…true
            (
                "unary operator",
                |n| format!("{}true", "!".repeat(n)),
                0,
                json!(null),
            ),
            // 2 > ---…1: `>`, and the run.
            (
                "unary operator",
                |n| format!("2 > {}1", "-".repeat(n)),
                1,
                json!(null),
            ),
            // 1 == value.a.a.….a: `==`, and a selection each.
            (
                "field selection",
                |n| format!("1 == value{}", ".a".repeat(n)),
                1,
                nested_a(MAX_DEPTH - 1),
            ),
            // 1 == value[0][0]…[0]: `==`, an index each, and the `0` in one.
            (
                "index",
                |n| format!("1 == value{}", "[0]".repeat(n)),
                2,
                nested_list(MAX_DEPTH - 2),
            ),
            // 1 == size([[[…]]]): `==`, and the call.
            (
                "bracket",
                |n| format!("1 == size({}{})", "[".repeat(n), "]".repeat(n)),
                2,
                json!(null),
            ),
            // 1 == size({1:{1:…1}}): `==`, and the call.
            (
                "brace",
                |n| format!("1 == size({}1{})", "{1:".repeat(n), "}".repeat(n)),
                2,
                json!(null),
            ),
            // "x" == string(string(…"x"…)): `==`.
            (
                "call",
                |n| format!("\"x\" == {}\"x\"{}", "string(".repeat(n), ")".repeat(n)),
                1,
                json!(null),
            ),
            // 1 + 1 + … + 1 > 0: an operator each, and `>`.
            (
                "operator",
                |n| format!("1{} > 0", " + 1".repeat(n)),
                1,
                json!(null),
            ),
            // true ? true : true ? … : true
            (
                "conditional",
                |n| format!("{}true", "true ? true : ".repeat(n)),
                0,
                json!(null),
            ),
            // 1 == value.f().f()….f(): `==`, a selection each, and a call.
            (
                "field selection",
                |n| format!("1 == value{}", ".f()".repeat(n)),
                2,
                json!(1),
            ),
        ]
    }

    #[test]
    fn nesting_up_to_the_limit_compiles_and_evaluates_on_a_small_stack() {
        for (what, shape, overhead, value) in shapes() {
            let expr = shape(MAX_DEPTH - overhead);
            let verdict = on_small_stack(move || {
                let key = json!(null);
                Filter::compile(&expr)
                    .map(|f| f.evaluate(&input(&key, &value, &[])))
                    .map_err(|e| e.to_string())
            });
            match verdict {
                // `value.f()` names no function: an evaluation error, after the recursion.
                Ok(Verdict::Error(_)) if what == "field selection" && overhead == 2 => {}
                Ok(Verdict::Match) => {}
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn nesting_past_the_limit_is_refused_naming_what_and_where() {
        for (what, shape, overhead, _) in shapes() {
            let expr = shape(MAX_DEPTH - overhead + 1);
            let e = Filter::compile(&expr).unwrap_err();
            assert!(
                matches!(e, FilterError::TooDeep { what: w, line: 1, max: MAX_DEPTH, .. } if w == what),
                "{what}: {e}"
            );
            // Far past it too, up to the longest expression, and on a small stack.
            let n = (MAX_DEPTH..)
                .take_while(|&n| shape(n).len() <= MAX_LEN)
                .last()
                .unwrap();
            let far = shape(n);
            let e = on_small_stack(move || Filter::compile(&far).map(|_| ())).unwrap_err();
            assert!(matches!(e, FilterError::TooDeep { .. }), "{what}: {e}");
        }
        let e = Filter::compile(&format!("{}1", "(".repeat(MAX_DEPTH + 1))).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "nested too deeply: the parenthesis at line 1, column {} goes past {MAX_DEPTH} levels (brackets, operators and field selections nest at most {MAX_DEPTH} deep in a filter)",
                MAX_DEPTH + 1
            )
        );
        // `==` is a level: the last of the parentheses goes past, at column 10 + MAX_DEPTH - 1
        // (in characters: `é` is two bytes).
        let e =
            Filter::compile(&format!("true &&\n  'é' == {}1", "(".repeat(MAX_DEPTH))).unwrap_err();
        assert_eq!(
            e,
            FilterError::TooDeep {
                what: "parenthesis",
                line: 2,
                column: 10 + MAX_DEPTH - 1,
                max: MAX_DEPTH
            }
        );
    }

    #[test]
    fn long_and_or_chains_strings_and_comments_are_not_deep() {
        // `&&` and `||` chains are balanced by the parser; separate operands are not summed.
        let clauses = (0..400)
            .map(|i| format!("value.a{i}.b != {i}"))
            .collect::<Vec<_>>();
        let expr = clauses.join(" && ");
        assert!(expr.len() < MAX_LEN);
        assert!(on_small_stack(move || Filter::compile(&expr).is_ok()));
        let ids = (0..2000).map(|i| i.to_string()).collect::<Vec<_>>();
        let expr = format!("[{}].exists(x, x == offset)", ids.join(", "));
        assert!(Filter::compile(&expr).is_ok());
        // Brackets in strings and comments are text.
        let deep = "(".repeat(MAX_DEPTH * 2);
        for expr in [
            format!("topic != '{deep}'"),
            format!("topic != \"{deep}\\\"{deep}\""),
            format!("topic != r'{deep}\\'"),
            format!("topic != '''{deep}'\n'{deep}'''"),
            format!("headers.x != b\"{deep}\""),
            format!("// {deep}\ntopic != 'x' // {deep}"),
        ] {
            assert!(Filter::compile(&expr).is_ok(), "{expr}");
        }
        // The example of docs/configuration.md.
        assert_eq!(check_nesting("value.items.exists(i, i.qty > 10)"), Ok(5));
        assert_eq!(check_nesting("(a + b.c) * 2 > 1 && !(x || y)"), Ok(5));
        // A number's decimal point is not a selection.
        let expr = format!("{}1.5 < 2.0", "-".repeat(MAX_DEPTH - 1));
        assert!(Filter::compile(&expr).is_ok());
    }

    #[test]
    fn an_expression_longer_than_the_limit_is_refused_before_parsing() {
        let at_limit = format!("topic == '{}'", "x".repeat(MAX_LEN - 11));
        assert_eq!(at_limit.len(), MAX_LEN);
        assert!(Filter::compile(&at_limit).is_ok());
        let e = Filter::compile(&format!("{at_limit} ")).unwrap_err();
        assert_eq!(
            e,
            FilterError::TooLong {
                len: MAX_LEN + 1,
                max: MAX_LEN
            }
        );
        // 100 000 `(`, on a small stack.
        let e = on_small_stack(|| Filter::compile(&"(".repeat(100_000)).map(|_| ())).unwrap_err();
        assert!(
            matches!(e, FilterError::TooLong { len: 100_000, .. }),
            "{e}"
        );
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
