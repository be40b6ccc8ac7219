//! Trigger filters: `filter = '<CEL expression>'` on a trigger, in the Common Expression
//! Language, evaluated on the decoded record before a run is started. The language lives
//! here, with the configuration that compiles it; a run applies it through `run::filter`.
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

/// A record header as a filter reads it (the event's `EventHeader` is one).
pub trait FilterHeader {
    /// The name.
    fn name(&self) -> &str;
    /// The value, None for a header without one: UTF-8 text, or base64 when [`Self::base64`].
    fn value(&self) -> Option<&str>;
    /// Whether the value is base64 of bytes that are not UTF-8.
    fn base64(&self) -> bool;
}

/// The record as the filter sees it.
#[derive(Clone, Copy, Debug)]
pub struct FilterInput<'a, H> {
    /// The decoded key.
    pub key: &'a Json,
    /// The decoded value.
    pub value: &'a Json,
    /// The record headers, in order.
    pub headers: &'a [H],
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
    pub fn evaluate<H: FilterHeader>(&self, input: &FilterInput<'_, H>) -> Verdict {
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
                    current(&mut levels).ops += 1;
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
                        current(&mut levels).ops += 1;
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
                    let level = current(&mut levels);
                    level.inner = level.inner.max(closed);
                }
                after_operand = true;
                // A closing bracket adds no depth: what it closed was counted already.
                continue;
            }
            // What separates operands: `,`, `:`, `&&` and `||`.
            sep @ (b',' | b':' | b'&' | b'|')
                if matches!(sep, b',' | b':') || next == Some(sep) =>
            {
                i += if matches!(sep, b'&' | b'|') { 2 } else { 1 };
                current(&mut levels).end_operand();
                after_operand = false;
                continue;
            }
            b'?' => {
                i += 1;
                current(&mut levels).conditionals += 1;
                after_operand = false;
                "conditional"
            }
            b'.' => {
                i += 1;
                current(&mut levels).ops += 1;
                after_operand = false;
                "field selection"
            }
            b'!' | b'-' if !after_operand && next != Some(b'=') => {
                i += 1;
                current(&mut levels).ops += 1;
                "unary operator"
            }
            b'=' | b'!' | b'<' | b'>' | b'+' | b'-' | b'*' | b'/' | b'%' => {
                i += 1;
                if next == Some(b'=') {
                    i += 1;
                }
                current(&mut levels).ops += 1;
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

/// The innermost bracket [`check_nesting`] is in (the expression itself is never popped).
fn current(levels: &mut [Level]) -> &mut Level {
    levels.last_mut().expect("the expression's level")
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

fn headers_val<'v, H: FilterHeader>(headers: &'v [H]) -> Box<dyn Val + 'v> {
    let mut map: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = HashMap::with_capacity(headers.len());
    for h in headers {
        let value: Box<dyn Val + 'v> = match (h.value(), h.base64()) {
            (None, _) => Box::new(CelNull),
            (Some(b64), true) => match base64::engine::general_purpose::STANDARD.decode(b64) {
                Ok(bytes) => Box::new(CelBytes::from(bytes)),
                Err(_) => Box::new(CelNull),
            },
            (Some(text), false) => Box::new(CelString::from(text)),
        };
        // Later headers of a name replace earlier ones.
        let _ = map.insert(CelMapKey::String(CelString::from(h.name())), value);
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
#[path = "filter_tests.rs"]
mod tests;
