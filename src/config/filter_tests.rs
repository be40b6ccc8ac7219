//! Unit tests of `filter`.
use super::*;
use serde_json::json;

/// A header as a record carries it: a UTF-8 value, or base64 of one that is not.
struct Header {
    name: &'static str,
    value: &'static str,
    base64: bool,
}

impl FilterHeader for Header {
    fn name(&self) -> &str {
        self.name
    }

    fn value(&self) -> Option<&str> {
        Some(self.value)
    }

    fn base64(&self) -> bool {
        self.base64
    }
}

fn input<'a>(key: &'a Json, value: &'a Json, headers: &'a [Header]) -> FilterInput<'a, Header> {
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

fn header(name: &'static str, value: &'static str) -> Header {
    Header {
        name,
        value,
        base64: false,
    }
}

fn eval(expr: &str, value: Json) -> Verdict {
    let headers = [
        header("source", "web"),
        header("source", "checkout"),
        Header {
            name: "bin",
            value: "/w==",
            base64: true,
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
    let e = Filter::compile(&format!("true &&\n  'é' == {}1", "(".repeat(MAX_DEPTH))).unwrap_err();
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
