//! Loading errors: TOML syntax errors with their position, environment values typed by their
//! field, and `log.level` checked (issue 16).

use super::*;

const MINIMAL: &str = r#"
[connections.orders.kafka]
"bootstrap.servers" = "127.0.0.1:9092"
"group.id" = "tessel-orders"
"sasl.password" = "hunter2"

[connections.orders.triggers.fraud]
topics = ["payments"]
workflow = "fraud-check"
dispatcher = { url = "http://127.0.0.1:8080/runs", token = "t" }
"#;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (format!("TESSEL_KAFKA__{k}"), (*v).to_owned()))
        .collect()
}

#[test]
fn a_syntax_error_names_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tessel-kafka.toml");
    // Line 4, column 13: the value is missing its closing quote.
    let text = MINIMAL.replace(
        "\"group.id\" = \"tessel-orders\"",
        "\"group.id\" = \"tessel-orders",
    );
    std::fs::write(&path, &text).unwrap();
    let err = Config::load_with_env(&path, Vec::new())
        .unwrap_err()
        .to_string();
    let at = format!("invalid config: {}:4:", path.display());
    assert!(err.starts_with(&at), "{err}");
    let ConfigError::Syntax { line, column, .. } =
        Config::load_with_env(&path, Vec::new()).unwrap_err()
    else {
        panic!("a syntax error")
    };
    assert_eq!((line, column), (4, 28), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn a_syntax_error_in_text_names_line_and_column() {
    let err = Config::from_toml_with_env("[server]\nlisten = = 1\n", Vec::new())
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("invalid config: 2:10: "), "{err}");
}

#[test]
fn line_and_column_count_characters() {
    assert_eq!(line_and_column("abc", 0), (1, 1));
    assert_eq!(line_and_column("a\nbc", 3), (2, 2));
    assert_eq!(line_and_column("é\néé", 5), (2, 2));
    assert_eq!(line_and_column("ab", 99), (1, 3));
}

#[test]
fn environment_values_stay_strings_where_the_field_is_a_string() {
    let c = Config::from_toml_with_env(
        MINIMAL,
        env(&[
            ("CONNECTIONS__ORDERS__KAFKA__GROUP_ID", "007"),
            ("CONNECTIONS__ORDERS__KAFKA__SASL_PASSWORD", "0123"),
            ("CONNECTIONS__ORDERS__KAFKA__CLIENT_ID", "true"),
            ("CONNECTIONS__ORDERS__TRIGGERS__FRAUD__WORKFLOW", "42"),
            (
                "CONNECTIONS__ORDERS__TRIGGERS__FRAUD__DISPATCHER__TOKEN",
                "123456",
            ),
        ]),
    )
    .unwrap();
    let conn = &c.connections["orders"];
    assert_eq!(conn.kafka["group.id"], "007");
    assert_eq!(conn.kafka["sasl.password"], "0123");
    assert_eq!(conn.kafka["client.id"], "true");
    let trigger = &conn.triggers["fraud"];
    assert_eq!(trigger.workflow, "42");
    assert_eq!(
        trigger.dispatcher.token.as_ref().map(|t| t.expose()),
        Some("123456")
    );
}

#[test]
fn environment_values_are_parsed_where_the_field_is_a_number_or_a_list() {
    let c = Config::from_toml_with_env(
        MINIMAL,
        env(&[
            ("CONNECTIONS__ORDERS__TRIGGERS__FRAUD__CONCURRENCY", "64"),
            ("CONNECTIONS__ORDERS__DRAIN_TIMEOUT_MS", "0012000"),
            (
                "CONNECTIONS__ORDERS__TRIGGERS__FRAUD__TOPICS",
                "[\"a\", \"b\"]",
            ),
        ]),
    );
    // TOML refuses leading zeros in integers: the field's type error names the key.
    let err = c.unwrap_err().to_string();
    assert!(
        err.contains("`connections.orders.drain_timeout_ms`"),
        "{err}"
    );
    let c = Config::from_toml_with_env(
        MINIMAL,
        env(&[
            ("CONNECTIONS__ORDERS__TRIGGERS__FRAUD__CONCURRENCY", "64"),
            ("CONNECTIONS__ORDERS__DRAIN_TIMEOUT_MS", "12000"),
            (
                "CONNECTIONS__ORDERS__TRIGGERS__FRAUD__TOPICS",
                "[\"a\", \"b\"]",
            ),
        ]),
    )
    .unwrap();
    let conn = &c.connections["orders"];
    assert_eq!(conn.triggers["fraud"].concurrency, 64);
    assert_eq!(conn.drain_timeout_ms, 12_000);
    assert_eq!(conn.triggers["fraud"].topics, ["a", "b"]);
}

#[test]
fn a_non_number_for_a_number_names_the_key() {
    let err = Config::from_toml_with_env(
        MINIMAL,
        env(&[("CONNECTIONS__ORDERS__TRIGGERS__FRAUD__CONCURRENCY", "lots")]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("invalid config at `connections.orders.triggers.fraud.concurrency`: "),
        "{err}"
    );
    assert!(err.contains("lots"), "{err}");
}

#[test]
fn an_unknown_log_level_is_refused() {
    for level in ["inof", "tessel_kafka=loud", "info,verbose", ""] {
        let text = format!("[log]\nlevel = \"{level}\"\n{MINIMAL}");
        let err = Config::from_toml_with_env(&text, Vec::new())
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("invalid config at `log.level`: "),
            "{level}: {err}"
        );
    }
    for level in [
        "info",
        "WARN",
        "info,tessel_kafka=debug",
        "librdkafka=off,tessel_kafka::consumer=trace",
    ] {
        let text = format!("[log]\nlevel = \"{level}\"\n{MINIMAL}");
        assert!(
            Config::from_toml_with_env(&text, Vec::new()).is_ok(),
            "{level}"
        );
    }
}
