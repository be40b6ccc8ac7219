//! The vector selectors of a PromQL expression (metric name and label matchers), enough to
//! check the shipped queries: alert rules, dashboard panels and KEDA triggers.

/// A label matcher: `label op "value"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    pub label: String,
    pub op: String,
    pub value: String,
}

/// A vector selector: `metric{matchers}` (the metric empty for `{__name__=...}` forms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub metric: String,
    pub matchers: Vec<Matcher>,
}

impl Selector {
    /// The value `label` is matched against with `op`.
    pub fn matched(&self, label: &str, op: &str) -> Option<&str> {
        self.matchers
            .iter()
            .find(|m| m.label == label && m.op == op)
            .map(|m| m.value.as_str())
    }
}

/// Keywords that are followed by a list of label names in parentheses.
const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Keywords that are neither functions nor metric names.
const KEYWORDS: [&str; 6] = ["and", "or", "unless", "bool", "offset", "atan2"];
/// Aggregation operators: their grouping (`by`, `without`) may come before their arguments.
const AGGREGATIONS: [&str; 12] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];

/// Every vector selector of `expr`, in order.
pub fn selectors(expr: &str) -> Vec<Selector> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let skip_ws = |mut j: usize| {
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        j
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = end_of_string(&chars, i);
        } else if c == '[' {
            // A range or a subquery's duration.
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // A number, or a duration such as 5m after `offset`.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c == '{' {
            let (matchers, next) = parse_matchers(&chars, i);
            out.push(Selector {
                metric: String::new(),
                matchers,
            });
            i = next;
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | ':'))
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = skip_ws(i);
            if GROUPING.contains(&word.as_str()) {
                if chars.get(next) == Some(&'(') {
                    i = next;
                    while i < chars.len() && chars[i] != ')' {
                        i += 1;
                    }
                    i += 1;
                }
            } else if KEYWORDS.contains(&word.as_str())
                || chars.get(next) == Some(&'(')
                || AGGREGATIONS.contains(&word.as_str())
            {
                // An operator, or a function or aggregation: its arguments follow.
            } else if chars.get(next) == Some(&'{') {
                let (matchers, after) = parse_matchers(&chars, next);
                out.push(Selector {
                    metric: word,
                    matchers,
                });
                i = after;
            } else {
                out.push(Selector {
                    metric: word,
                    matchers: Vec::new(),
                });
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The index after the string literal starting at `start`.
fn end_of_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        if chars[i] == '\\' && quote != '`' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// The matchers of the `{...}` at `open`, and the index after its `}`.
fn parse_matchers(chars: &[char], open: usize) -> (Vec<Matcher>, usize) {
    let mut i = open + 1;
    let mut out = Vec::new();
    loop {
        while i < chars.len() && (chars[i].is_whitespace() || chars[i] == ',') {
            i += 1;
        }
        if i >= chars.len() || chars[i] == '}' {
            return (out, i + 1);
        }
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        let label: String = chars[start..i].iter().collect();
        while chars[i].is_whitespace() {
            i += 1;
        }
        let op_start = i;
        while matches!(chars[i], '=' | '!' | '~') {
            i += 1;
        }
        let op: String = chars[op_start..i].iter().collect();
        while chars[i].is_whitespace() {
            i += 1;
        }
        let end = end_of_string(chars, i);
        let value: String = chars[i + 1..end - 1].iter().collect();
        out.push(Matcher { label, op, value });
        i = end;
    }
}

#[test]
fn selectors_are_found_with_their_matchers() {
    let s = selectors(
        r#"sum by (namespace, region) (rate(tessel_kafka_x_total{outcome=~"a|b", namespace="n"}[5m] offset 1h)) / on (namespace) group_left (region) up{job="tessel-kafka"} > 0.1 and absent(y) or histogram_quantile(0.99, sum by (le) (rate(z_bucket[$__rate_interval])))"#,
    );
    let names: Vec<&str> = s.iter().map(|s| s.metric.as_str()).collect();
    assert_eq!(names, ["tessel_kafka_x_total", "up", "y", "z_bucket"]);
    assert_eq!(s[0].matched("outcome", "=~"), Some("a|b"));
    assert_eq!(s[0].matched("namespace", "="), Some("n"));
    assert_eq!(s[1].matched("job", "="), Some("tessel-kafka"));
    assert!(s[2].matchers.is_empty());
    let dashboard =
        selectors(r#"max(last_over_time(m{namespace=~"$namespace", region=~"$region"}[2m]))"#);
    assert_eq!(dashboard[0].matched("region", "=~"), Some("$region"));
    assert_eq!(
        selectors(r#"{__name__="q"} == 0"#)[0].matched("__name__", "="),
        Some("q")
    );
}
