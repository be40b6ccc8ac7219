//! Hostile input against the real daemon, broker and registry: records built to crash, stall
//! or slip through (a recursive Avro payload nested 200,000 deep, a truncated Avro record, a
//! JSON Schema payload its schema refuses, an absurd `Retry-After`, a `traceparent` HTTP cannot
//! carry, a named decimal used twice, a header name that is not UTF-8), each followed by a
//! good record of the same key, with credentials in the dispatcher's and the registry's URLs.

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use tessel_kafka::cli::dev_dispatcher::{DevDispatcher, Faults};

use super::failures::read_topic;
use super::produce::register_schema;
use super::{
    committed, create_topic, dispatcher, reference_produce, spawn_daemon, DeadLetterSetup,
};
use crate::support::{binary, free_port, stack, temp_config, unique, wait_for, wait_for_async};

const DISPATCHER_SECRET: &str = "disp-s3cr3t";
const TOKEN_SECRET: &str = "t0ken-s3cr3t";
const REGISTRY_SECRET: &str = "reg-s3cr3t";

const NODE_AVRO: &str = r#"{"type":"record","name":"Node","namespace":"hostile","fields":[
  {"name":"v","type":"int"},{"name":"next","type":["null","Node"]}]}"#;
const NOTE_AVRO: &str = r#"{"type":"record","name":"Note","namespace":"hostile","fields":[
  {"name":"id","type":"long"},{"name":"note","type":["null","string"]}]}"#;
const ORDER_AVRO: &str = r#"{"type":"record","name":"Order","namespace":"hostile","fields":[
  {"name":"price","type":{"type":"fixed","name":"Money","size":4,"logicalType":"decimal","precision":9,"scale":2}},
  {"name":"discount","type":"Money"}]}"#;
const ID_JSON_SCHEMA: &str = r#"{"$schema":"http://json-schema.org/draft-07/schema#","title":"Ided",
  "type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}"#;

/// A `traceparent` of 55 bytes whose last byte is a newline.
const BAD_TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\n";

fn frame(id: u32, body: &[u8]) -> String {
    let mut v = vec![0u8];
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(body);
    base64::engine::general_purpose::STANDARD.encode(v)
}

/// `Node` nested `depth` deep (v = 1 at every level).
fn nested_nodes(depth: usize) -> Vec<u8> {
    let mut b = Vec::with_capacity(2 * depth + 2);
    for _ in 0..depth {
        b.extend([0x02, 0x02]); // v = 1, next = branch 1 (Node)
    }
    b.extend([0x02, 0x00]); // v = 1, next = null
    b
}

struct Hostile {
    /// key -> raw record spec (JSON for the reference producer).
    records: Vec<(String, Value)>,
}

/// The hostile records, keyed by what they are, in the order they are produced.
async fn hostile_records(prefix: &str) -> Hostile {
    let node = register_schema(&format!("{prefix}-node"), "AVRO", NODE_AVRO).await;
    let note = register_schema(&format!("{prefix}-note"), "AVRO", NOTE_AVRO).await;
    let order = register_schema(&format!("{prefix}-order"), "AVRO", ORDER_AVRO).await;
    let ided = register_schema(&format!("{prefix}-ided"), "JSON", ID_JSON_SCHEMA).await;
    let records = vec![
        (
            "deep".to_owned(),
            json!({"raw_value_b64": frame(node, &nested_nodes(200_000))}),
        ),
        // id = 42, then the record ends where the union index of `note` should be.
        (
            "cut".to_owned(),
            json!({"raw_value_b64": frame(note, &[0x54])}),
        ),
        (
            "jsonschema".to_owned(),
            json!({"raw_value_b64": frame(ided, br#"{"id": "x"}"#)}),
        ),
        ("throttled".to_owned(), json!({"value": {"v": "throttled"}})),
        (
            "traceparent".to_owned(),
            json!({"value": {"v": "traceparent"}, "headers": [["traceparent", BAD_TRACEPARENT]]}),
        ),
        (
            "money".to_owned(),
            json!({"raw_value_b64": frame(order, &[0, 0, 0x30, 0x39, 0, 0, 0, 0x7b])}),
        ),
    ];
    Hostile { records }
}

/// Produces each hostile record followed by a good record `{"after": key}` of the same key, on
/// `partition`, then `others` good records of other keys on every partition of `partitions`.
async fn produce(topic: &str, hostile: &Hostile, partitions: i32, others: usize) {
    let mut records = Vec::new();
    for (key, spec) in &hostile.records {
        let mut r = spec.clone();
        r["key"] = json!(key);
        r["partition"] = json!(0);
        records.push(r);
        records.push(json!({"key": key, "value": {"after": key}, "partition": 0}));
    }
    for i in 0..others {
        for p in 0..partitions {
            records.push(
                json!({"key": format!("other-{p}-{i}"), "value": {"other": i}, "partition": p}),
            );
        }
    }
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "topic": topic,
        "key": {"format": "string"}, "value": {"format": "json"},
        "steps": [{"txn": null, "records": records}]
    }))
    .await;
}

/// A daemon config with credentials in the dispatcher's and the registry's URLs.
fn config(admin_port: u16, group: &str, topic: &str, d: &DevDispatcher, trigger: &str) -> String {
    let dispatcher_url =
        d.url()
            .replacen("http://", &format!("http://tessel:{DISPATCHER_SECRET}@"), 1)
            + &format!("?token={TOKEN_SECRET}&tenant=acme");
    let registry_url =
        stack()
            .registry_url
            .replacen("http://", &format!("http://reg-user:{REGISTRY_SECRET}@"), 1);
    format!(
        r#"
[server]
listen = "127.0.0.1:{admin_port}"
[log]
level = "debug"
[connections.it]
drain_timeout_ms = 5000
stall_after_ms = 1500
[connections.it.kafka]
"bootstrap.servers" = "{bootstrap}"
"group.id" = "{group}"
"auto.offset.reset" = "earliest"
[connections.it.schema_registry]
url = "{registry_url}"
[connections.it.triggers.main]
topics = ["{topic}"]
workflow = "wf-hostile"
key_format = "string"
concurrency = 8
dispatcher = {{ url = "{dispatcher_url}", timeout_ms = 5000 }}
retry = {{ initial_backoff_ms = 50, max_backoff_ms = 300, max_attempts = 3, max_retry_after_ms = 1000 }}
{trigger}
"#,
        bootstrap = stack().bootstrap,
    )
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in [DISPATCHER_SECRET, TOKEN_SECRET, REGISTRY_SECRET] {
        assert!(!text.contains(secret), "{what} shows {secret}: {text}");
    }
}

async fn get_text(url: String) -> Option<(u16, String)> {
    let resp = reqwest::get(url).await.ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.text().await.ok()?))
}

/// The value of the sample of `name` whose labels contain `labels`, from a scrape.
fn sample(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test]
async fn hostile_records_are_dead_lettered_and_the_next_record_of_their_key_goes_through() {
    let setup = DeadLetterSetup::create("hostile", 1, 1).await;
    let DeadLetterSetup { topic, dlq, group } = &setup;
    let hostile = hostile_records(topic).await;
    produce(topic, &hostile, 1, 0).await;
    let throttled_key = setup.id(0, 6);
    let d = dispatcher(Faults {
        scripted: HashMap::from([(throttled_key.clone(), vec![429; 3])]),
        retry_after_secs: Some(i64::MAX as u64),
        ..Faults::default()
    })
    .await;
    let admin_port = free_port();
    let path = temp_config(&config(admin_port, group, topic, &d, &setup.dead_letter()));
    let log = std::env::temp_dir().join(format!("{}.log", unique("hostile")));
    let mut daemon = spawn_daemon(&path, std::fs::File::create(&log).unwrap().into());

    // 12 records: 4 dead-lettered, 8 accepted (6 followers, the traceparent one, the decimal).
    wait_for("8 runs accepted", Duration::from_secs(90), || {
        (d.accepted() >= 8).then_some(())
    })
    .await;
    let dead = read_topic(dlq, 4).await;
    wait_for("committed to the end", Duration::from_secs(30), || {
        (committed(group, topic, 1) == [12]).then_some(())
    })
    .await;
    let metrics = get_text(format!("http://127.0.0.1:{admin_port}/metrics"))
        .await
        .expect("metrics")
        .1;
    let health = get_text(format!("http://127.0.0.1:{admin_port}/health"))
        .await
        .expect("health")
        .1;
    assert!(
        daemon.try_wait().unwrap().is_none(),
        "the daemon is still running"
    );
    daemon.kill().unwrap();
    let _ = daemon.wait();

    let runs = d.runs();
    let mut accepted: Vec<String> = runs
        .iter()
        .map(|r| {
            let v = &r.event["value"];
            v["after"]
                .as_str()
                .map(|k| format!("after-{k}"))
                .or_else(|| v["v"].as_str().map(str::to_owned))
                .unwrap_or_else(|| v.to_string())
        })
        .collect();
    accepted.sort();
    let mut expected: Vec<String> = hostile
        .records
        .iter()
        .map(|(k, _)| format!("after-{k}"))
        .chain([
            "traceparent".to_owned(),
            r#"{"price":"123.45","discount":"1.23"}"#.to_owned(),
        ])
        .collect();
    expected.sort();
    assert_eq!(accepted, expected, "each key moved on");
    assert_eq!(d.repeats(), 0);
    let tp_run = runs
        .iter()
        .find(|r| r.event["value"]["v"] == "traceparent")
        .unwrap();
    assert_eq!(
        tp_run.traceparent, None,
        "an invalid traceparent is not sent"
    );
    let money = runs
        .iter()
        .find(|r| r.event["value"].get("price").is_some())
        .unwrap();
    assert_eq!(
        money.event["value"],
        json!({"price": "123.45", "discount": "1.23"}),
        "the decimal's scale holds through the named reference"
    );

    let by_key: BTreeMap<String, &BTreeMap<String, String>> = dead
        .iter()
        .map(|r| {
            (
                String::from_utf8(r.key.clone().unwrap()).unwrap(),
                &r.headers,
            )
        })
        .collect();
    for (key, stage, class) in [
        ("deep", "VALUE_DESERIALIZE", "decode_limit"),
        ("cut", "VALUE_DESERIALIZE", "payload"),
        ("jsonschema", "VALUE_DESERIALIZE", "payload"),
        ("throttled", "DISPATCH", "retries_exhausted"),
    ] {
        let h = by_key
            .get(key)
            .unwrap_or_else(|| panic!("{key} dead-lettered: {by_key:?}"));
        assert_eq!(h["tessel.error.class"], class, "{key}: {h:?}");
        assert_eq!(h["__connect.errors.stage"], stage, "{key}: {h:?}");
        for v in h.values() {
            assert_no_secret("a dead-letter header", v);
        }
    }
    assert!(
        by_key["jsonschema"]["__connect.errors.exception.message"].contains("$.id"),
        "{:?}",
        by_key["jsonschema"]
    );
    assert_eq!(by_key["throttled"]["tessel.http.status"], "429");
    // The absurd Retry-After was cut to max_retry_after_ms (1 s): three attempts in seconds.
    let attempts = d.attempts_for(&throttled_key);
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    let waited = attempts[2].0 - attempts[0].0;
    assert!(
        waited >= Duration::from_millis(1900) && waited < Duration::from_secs(10),
        "Retry-After clamped to 1 s: {waited:?}"
    );
    // No hostile record panics a worker (the counter is exported from the start, at 0).
    assert_eq!(
        sample(
            &metrics,
            "tessel_kafka_worker_panics_total",
            "trigger=\"main\""
        ),
        Some(0.0),
        "{metrics}"
    );
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !log_text.contains("panicked") && log_text.contains("traceparent"),
        "{log_text}"
    );
    assert_no_secret("the log", &log_text);
    assert_no_secret("/health", &health);
    assert_no_secret("/metrics", &metrics);
    let check = std::process::Command::new(binary())
        .args(["config", "check", "--config"])
        .arg(&path)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(check.status.success(), "{shown}");
    assert!(shown.contains("tenant=acme"), "{shown}");
    assert_no_secret("config check", &shown);
}

#[tokio::test]
async fn with_on_error_block_hostile_records_park_their_key_and_the_rest_flows() {
    let topic = unique("hostile-block");
    create_topic(&topic, 2).await;
    let mut hostile = hostile_records(&topic).await;
    // Blocking keys: the undecodable ones.
    hostile
        .records
        .retain(|(k, _)| ["deep", "cut", "jsonschema"].contains(&k.as_str()));
    produce(&topic, &hostile, 2, 20).await;
    let group = unique("hostile-block-group");
    let d = dispatcher(Faults::default()).await;
    let admin_port = free_port();
    let path = temp_config(&config(
        admin_port,
        &group,
        &topic,
        &d,
        "on_error = \"block\"",
    ));
    let mut daemon = spawn_daemon(&path, Stdio::null());

    // Partition 1 and the other keys of partition 0 flow: 40 runs.
    wait_for("the 40 other records", Duration::from_secs(90), || {
        (d.accepted() >= 40).then_some(())
    })
    .await;
    let stalled = wait_for_async(
        "/health reports the parked key",
        Duration::from_secs(60),
        || async {
            let (status, body) = get_text(format!("http://127.0.0.1:{admin_port}/health")).await?;
            let v: Value = serde_json::from_str(&body).ok()?;
            let reason = v["connections"]["it"]["stalled_partitions"][format!("{topic}[0]")]
                .as_str()?
                .to_owned();
            (status == 503).then_some((reason, body))
        },
    )
    .await;
    let metrics = wait_for_async("the stall metric", Duration::from_secs(30), || async {
        let (_, m) = get_text(format!("http://127.0.0.1:{admin_port}/metrics")).await?;
        (sample(&m, "tessel_kafka_stalled_partitions", "connection=\"it\"") == Some(1.0))
            .then_some(m)
    })
    .await;
    let accepted_before = d.accepted();
    // More traffic still flows past the parked keys.
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "topic": topic,
        "key": {"format": "string"}, "value": {"format": "json"},
        "steps": [{"txn": null, "records": [
            {"key": "late-0", "value": {"late": 0}, "partition": 0},
            {"key": "late-1", "value": {"late": 1}, "partition": 1}]}]
    }))
    .await;
    wait_for("the late records", Duration::from_secs(30), || {
        (d.accepted() >= accepted_before + 2).then_some(())
    })
    .await;
    // Commits follow acceptance asynchronously: wait for partition 1's end.
    let committed_now = wait_for(
        "partition 1 committed to its end",
        Duration::from_secs(30),
        || {
            let c = committed(&group, &topic, 2);
            (c[1] == 21).then_some(c)
        },
    )
    .await;
    assert!(
        daemon.try_wait().unwrap().is_none(),
        "the daemon is still running"
    );
    daemon.kill().unwrap();
    let _ = daemon.wait();

    let (reason, body) = stalled;
    assert!(
        reason.contains("key parked at offset 0"),
        "the stuck key and its reason: {body}"
    );
    assert_no_secret("/health", &body);
    assert_eq!(
        sample(
            &metrics,
            "tessel_kafka_stalled_partitions",
            "connection=\"it\""
        ),
        Some(1.0)
    );
    let runs = d.runs();
    assert!(
        runs.iter().all(|r| r.event["value"].get("after").is_none()
            && r.event["value"].get("v").is_none()),
        "nothing of a parked key ran"
    );
    assert_eq!(d.accepted(), 42);
    assert_eq!(
        committed_now[0].max(0),
        0,
        "partition 0 waits at the first hostile record"
    );
    assert_eq!(committed_now[1], 21, "partition 1 is committed to its end");
}

/// Produces `records` (key, JSON value, optional header `name=value` as bytes) to partition 0
/// of `topic` with kcat, in order: the reference producer cannot write a header name that is
/// not UTF-8, and Kafka accepts one.
fn kcat_produce(topic: &str, records: &[(&str, &str, Option<&[u8]>)]) {
    use std::io::Write as _;
    use std::os::unix::ffi::OsStrExt as _;
    for (key, value, header) in records {
        let mut cmd = std::process::Command::new("kcat");
        cmd.args([
            "-P",
            "-b",
            &stack().bootstrap,
            "-t",
            topic,
            "-p",
            "0",
            "-k",
            key,
        ]);
        if let Some(h) = header {
            cmd.arg("-H").arg(std::ffi::OsStr::from_bytes(h));
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .spawn()
            .expect("kcat (installed by scripts/deps --test)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{value}\n").as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "kcat produced {key}");
    }
}

/// Kafka does not check header names: one that is not UTF-8 (`ff fe`) once panicked the
/// run in rust-rdkafka's header API, so the record was neither dispatched nor dead-lettered
/// and the next record of its key ran first. Now it is read as bytes: carried in base64 when
/// dispatched, kept as it is in a dead letter, and its key moves on in order.
#[tokio::test]
async fn a_header_name_that_is_not_utf8_is_carried_or_dead_lettered_and_its_key_moves_on() {
    let setup = DeadLetterSetup::create("hdr-name", 1, 1).await;
    let DeadLetterSetup { topic, dlq, group } = &setup;
    let bad: &[u8] = b"\xff\xfe=v";
    kcat_produce(
        topic,
        &[
            ("refused", r#"{"v": "refused"}"#, Some(bad)),
            ("refused", r#"{"after": "refused"}"#, None),
            ("carried", r#"{"v": "carried"}"#, Some(bad)),
            ("carried", r#"{"after": "carried"}"#, None),
        ],
    );
    let refused = setup.id(0, 0);
    // The dispatcher refuses the first record for good, so it is dead-lettered.
    let d = dispatcher(Faults {
        fail_keys: [refused.clone()].into(),
        fail_status: 400,
        ..Faults::default()
    })
    .await;
    let admin_port = free_port();
    let path = temp_config(&config(
        admin_port,
        group,
        topic,
        &d,
        &format!("{}value_format = \"json\"", setup.dead_letter()),
    ));
    let log = std::env::temp_dir().join(format!("{}.log", unique("hdr-name")));
    let mut daemon = spawn_daemon(&path, std::fs::File::create(&log).unwrap().into());
    wait_for("committed to the end", Duration::from_secs(60), || {
        (committed(group, topic, 1) == [4]).then_some(())
    })
    .await;
    let dead = read_topic(dlq, 1).await;
    assert!(daemon.try_wait().unwrap().is_none(), "the daemon runs");
    daemon.kill().unwrap();
    let _ = daemon.wait();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(!log.contains("panicked"), "no panic: {log}");

    // Dead-lettered with its header as it was, and the next record of its key ran after.
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].key.as_deref(), Some(b"refused".as_slice()));
    assert_eq!(
        dead[0].raw_headers[0],
        (b"\xff\xfe".to_vec(), Some(b"v".to_vec())),
        "the original header kept byte for byte"
    );
    assert_eq!(dead[0].headers["tessel.error.class"], "dispatch_rejected");
    let last_refusal = d.attempts_for(&refused).last().expect("attempted").0;
    let runs = d.runs();
    let run = |v: Value| {
        runs.iter()
            .find(|r| r.event["value"] == v)
            .unwrap_or_else(|| panic!("{v} ran: {runs:?}"))
    };
    assert!(run(json!({"after": "refused"})).accepted_at > last_refusal);
    // Dispatched: the name in base64 (ff fe), the value as text.
    let carried = run(json!({"v": "carried"}));
    assert_eq!(
        carried.event["headers"],
        json!([{"name": "//4=", "name_encoding": "base64", "value": "v", "encoding": "utf8"}])
    );
    assert!(run(json!({"after": "carried"})).accepted_at > carried.accepted_at);
    assert_eq!(runs.len(), 3);
    assert_eq!(d.repeats(), 0);
}
