//! The configuration's documentation checked against its code: `config/example.toml`
//! documents every field, and `docs/configuration.md`'s reference lists every key of the
//! example and only real fields.

use super::*;

/// Names of every field under `value`, skipping the names of free-form map entries
/// (connections, triggers, tokens, Kafka properties, headers) but walking their values.
fn field_names(value: &toml::Value, in_map: bool, out: &mut std::collections::BTreeSet<String>) {
    if let toml::Value::Table(t) = value {
        for (k, v) in t {
            if !in_map {
                let _ = out.insert(k.clone());
            }
            let map = !in_map
                && matches!(
                    k.as_str(),
                    "connections" | "triggers" | "tokens" | "kafka" | "headers"
                );
            field_names(v, map, out);
        }
    }
}

/// MINIMAL with every optional section and field set: its serialization names every field.
fn full_config() -> Config {
    let full = format!(
        r#"{MINIMAL}
[otlp]
endpoint = "http://collector:4318"
headers = {{ "x-key" = "k" }}
[produce.tokens.wf]
token = "0123456789abcdef"
connections = ["orders"]
topics = ["out"]
[api]
listen = "127.0.0.1:9465"
[api.tokens.oncall]
token = "fedcba9876543210"
access = "act"
connections = ["orders"]
triggers = ["fraud"]
[connections.orders.schema_registry]
url = "http://registry:8081"
username = "u"
password = "p"
ca_location = "/ca.pem"
certificate_location = "/client.pem"
key_location = "/client.key"
[connections.orders.producer]
transactional_id_prefix = "tx"
kafka = {{ "linger.ms" = "5" }}
[connections.orders.triggers.fraud.retry]
max_attempts = 3
[region]
replica_id = "tk-0"
advertise_url = "http://tk-0:9464"
peers = ["http://tk-1:9464"]
[region.kafka]
"bootstrap.servers" = "region:9092"
[region.placement]
group_id = "tessel-region-g"
topic = "tessel-region-t"
[region.control]
topic = "tessel-region-c"
"#
    )
    .replace(
        "[connections.orders.kafka]",
        "[connections.orders]\nproduce_topics = [\"audit\"]\n[connections.orders.kafka]",
    )
    .replace(
        "workflow = \"fraud-check\"",
        "workflow = \"fraud-check\"\ndead_letter_topic = \"dlq\"\non_error = \"dead_letter\"\nfilter = 'value.n > 1'\nmax_record_age_ms = 60000\non_expired = \"dead_letter\"\nbatch = { max_records = 500, max_bytes = 1048576, max_wait_ms = 1000 }",
    )
    .replace(
        "dispatcher = { url = \"http://127.0.0.1:8080/runs\" }",
        "dispatcher = { url = \"https://127.0.0.1:8080/runs\", token = \"t\", headers = { \"X\" = \"y\" }, envelope = \"cloudevents\", ca_location = \"/ca.pem\", certificate_location = \"/c.pem\", key_location = \"/c.key\", proxy = \"http://proxy:3128\" }",
    );
    load(&full).unwrap()
}

#[test]
fn example_config_documents_every_field() {
    let config = full_config();
    let value = toml::Value::try_from(&config).unwrap();
    let mut names = std::collections::BTreeSet::new();
    field_names(&value, false, &mut names);
    for expected in [
        "export_interval_ms",
        "stall_after_ms",
        "ack_timeout_ms",
        "max_attempts",
        "produce_topics",
        "key_location",
        "max_wait_ms",
        "proxy",
    ] {
        assert!(names.contains(expected), "{expected} not walked: {names:?}");
    }
    let example = include_str!("../../config/example.toml");
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| {
            !(example.contains(&format!("{n} ="))
                || example.contains(&format!(".{n}]"))
                || example.contains(&format!("[{n}]"))
                || example.contains(&format!(".{n}.")))
        })
        .collect();
    assert!(missing.is_empty(), "config/example.toml lacks {missing:?}");
}

/// `config/example.toml` with its commented-out settings (`# key = value`, `# [table]`) made
/// active; prose lines stay comments.
fn example_uncommented() -> String {
    let example = include_str!("../../config/example.toml");
    let setting = |l: &str| {
        if l.starts_with('[') && l.ends_with(']') {
            return true;
        }
        let Some((key, value)) = l.split_once(" = ") else {
            return false;
        };
        !key.is_empty()
            && !value.trim().is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.\"".contains(c))
    };
    example
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest) if setting(rest.split(" #").next().unwrap_or(rest).trim_end()) => rest,
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every key path of `value` (tables included) into `all`, and those of values into
/// `leaves`; the names of connections, triggers and produce tokens become `<c>`, `<t>` and
/// `<name>` (produce and API tokens), and free-form maps (Kafka properties, headers) and secret sources
/// (`{ env = … }`, `{ file = … }`) are values.
fn key_paths(
    value: &toml::Value,
    path: &str,
    all: &mut BTreeSet<String>,
    leaves: &mut BTreeSet<String>,
) {
    let toml::Value::Table(table) = value else {
        return;
    };
    for (k, v) in table {
        let name = if path == "connections" {
            "<c>"
        } else if path.ends_with(".triggers") {
            "<t>"
        } else if path == "produce.tokens" || path == "api.tokens" {
            "<name>"
        } else {
            k.as_str()
        };
        let p = if path.is_empty() {
            name.to_owned()
        } else {
            format!("{path}.{name}")
        };
        let _ = all.insert(p.clone());
        let secret = v
            .as_table()
            .is_some_and(|t| !t.is_empty() && t.keys().all(|k| k == "env" || k == "file"));
        if v.is_table() && !secret && !matches!(name, "kafka" | "headers") {
            key_paths(v, &p, all, leaves);
        } else {
            let _ = leaves.insert(p);
        }
    }
}

/// The key paths (as [`key_paths`] names them) of the configuration structs, and those of
/// values: those of [`full_config`] and of a connection with the settings it cannot have at
/// once (MSK IAM credentials, a registry bearer token), as they serialize.
fn field_paths() -> (BTreeSet<String>, BTreeSet<String>) {
    let other = load(
        r#"
[connections.msk.kafka]
"bootstrap.servers" = "b-1.msk:9098"
"group.id" = "g"
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "AWS_MSK_IAM"
[connections.msk.aws]
region = "eu-west-1"
access_key_id = "AKIA0000"
secret_access_key = "s"
session_token = "t"
profile = "p"
[connections.msk.schema_registry]
url = "https://registry:8081"
bearer_token = "b"
[connections.msk.triggers.t]
topics = ["t"]
workflow = "w"
dispatcher = { url = "http://127.0.0.1:8080/runs" }
"#,
    )
    .unwrap();
    let (mut paths, mut values) = (BTreeSet::new(), BTreeSet::new());
    for config in [full_config(), other] {
        let value = toml::Value::try_from(config).unwrap();
        key_paths(&value, "", &mut paths, &mut values);
    }
    (paths, values)
}

/// The keys of the reference table of docs/configuration.md, as [`key_paths`] names them.
/// A row's first cell is a key (`server.listen`), a key and its siblings
/// (`log.format`, `log.level`; `…triggers.<t>.concurrency`, `ordering`), or a table and some
/// of its keys (`` `[otlp]` `endpoint`, … ``; `` `connections.<c>.aws` `region`, … ``); `…`
/// stands for `connections.<c>.`.
fn reference_keys(doc: &str) -> BTreeSet<String> {
    let reference = doc
        .split("\n## Reference\n")
        .nth(1)
        .expect("docs/configuration.md has a Reference section");
    let reference = reference.split("\n## ").next().unwrap_or(reference);
    let mut keys = BTreeSet::new();
    for row in reference.lines().filter(|l| l.starts_with("| `")) {
        let cell = row.split('|').nth(1).unwrap_or_default();
        let parts: Vec<&str> = cell.split('`').collect();
        let tokens: Vec<String> = parts
            .iter()
            .skip(1)
            .step_by(2)
            .map(|t| t.replace('…', "connections.<c>."))
            .collect();
        let first = &tokens[0];
        let parent = |k: &str| {
            k.rsplit_once('.')
                .map_or(String::new(), |(p, _)| p.to_owned())
        };
        let prefix = if let Some(table) = first.strip_prefix('[').and_then(|t| t.strip_suffix(']'))
        {
            table.to_owned()
        } else if tokens.len() > 1 && !parts[2].contains(',') {
            let _ = keys.insert(first.clone());
            first.clone()
        } else {
            let _ = keys.insert(first.clone());
            parent(first)
        };
        for t in &tokens[1..] {
            let _ = keys.insert(if t.contains('.') {
                t.clone()
            } else {
                format!("{prefix}.{t}")
            });
        }
    }
    keys
}

/// docs/configuration.md's reference, config/example.toml and the configuration structs
/// agree: the example, with its commented-out settings made active, still parses and holds
/// only fields of the configuration; each of its keys is in the reference; each key of the
/// reference is a field of the structs, and each field of theirs is in the reference.
#[test]
fn the_configuration_reference_lists_every_key_of_the_example_and_only_real_fields() {
    // Each row shape is read.
    let reference = reference_keys(include_str!("../../docs/configuration.md"));
    let read = [
        "server.listen",
        "log.level",
        "otlp.endpoint",
        "produce.tokens.<name>.topics",
        "connections.<c>.max_buffered_bytes",
        "connections.<c>.aws.profile",
        "connections.<c>.kafka",
        "connections.<c>.triggers.<t>.ordering",
        "connections.<c>.triggers.<t>.batch.max_wait_ms",
        "connections.<c>.triggers.<t>.retry.max_retry_after_ms",
    ];
    let unread: Vec<&str> = read
        .into_iter()
        .filter(|k| !reference.contains(*k))
        .collect();
    assert!(
        unread.is_empty(),
        "{unread:?} not read from the reference: {reference:?}"
    );
    let (fields, field_values) = field_paths();

    let example: toml::Value = toml::from_str(&example_uncommented())
        .unwrap_or_else(|e| panic!("config/example.toml, uncommented, is not TOML: {e}"));
    let mut example_keys = BTreeSet::new();
    key_paths(&example, "", &mut BTreeSet::new(), &mut example_keys);
    // Commented-out settings and values that are tables are read.
    let read = [
        "otlp.sample_ratio",
        "connections.<c>.aws.region",
        "connections.<c>.triggers.<t>.dispatcher.proxy",
        "connections.<c>.producer.kafka",
    ];
    let unread: Vec<&str> = read
        .into_iter()
        .filter(|k| !example_keys.contains(*k))
        .collect();
    assert!(
        unread.is_empty(),
        "{unread:?} not read from the example: {example_keys:?}"
    );
    let unknown: Vec<&String> = example_keys.difference(&fields).collect();
    assert!(
        unknown.is_empty(),
        "config/example.toml has keys that are no configuration field: {unknown:?}"
    );
    let missing: Vec<&String> = example_keys.difference(&reference).collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md's reference lacks these keys of config/example.toml: {missing:?}"
    );
    let unknown: Vec<&String> = reference.difference(&fields).collect();
    assert!(
        unknown.is_empty(),
        "docs/configuration.md's reference lists keys that are no configuration field: {unknown:?}"
    );
    let missing: Vec<&String> = field_values.difference(&reference).collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md's reference lacks these configuration fields: {missing:?}"
    );
}
