//! What a trigger starts runs for, and what the run receives: filters (CEL), record age
//! limits, and the CloudEvents envelope.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use serde_json::{json, Value};

use super::failures::read_topic;
use super::{
    committed, connection_toml, create_topic, dispatcher, high_watermarks, reference_produce,
    run_reference, spawn_daemon, wait_committed_to_end,
};
use crate::support::{free_port, stack, temp_config, unique, wait_for};

/// The `tessel_kafka_messages_handled_total` counts of trigger `trigger`, by outcome, from the
/// daemon's `/metrics`.
async fn handled_by_outcome(admin_port: u16, trigger: &str) -> BTreeMap<String, u64> {
    let text = reqwest::get(format!("http://127.0.0.1:{admin_port}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("tessel_kafka_messages_handled_total{"))
        .filter(|l| l.contains(&format!("trigger=\"{trigger}\"")))
    {
        let outcome = line
            .split("outcome=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .expect("outcome label");
        let n: u64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("a count");
        let _ = out.insert(outcome.to_owned(), n);
    }
    out
}

#[tokio::test]
async fn a_filter_starts_exactly_the_matching_runs_and_commits_to_the_end() {
    const N: usize = 10_000;
    let topic = unique("filter");
    create_topic(&topic, 3).await;
    // One record in ten matches (amount above 1000 from the checkout); one in ten has the
    // amount but another source; one in ten has no amount (the filter cannot be evaluated);
    // the rest are small.
    let records: Vec<Value> = (0..N)
        .map(|i| {
            let (value, source) = match i % 10 {
                3 => (json!({"i": i, "amount": 5000.5}), "checkout"),
                7 => (json!({"i": i, "amount": 5000.5}), "web"),
                5 => (json!({"i": i}), "checkout"),
                _ => (json!({"i": i, "amount": 10.25}), "checkout"),
            };
            json!({"key": format!("k{}", i % 97), "value": value, "headers": [["source", source]]})
        })
        .collect();
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"},
        "value": {"format": "json"}, "kafka": {"linger.ms": 20, "batch.num.messages": 10000},
        "steps": [{"txn": null, "records": records}]
    }))
    .await;
    let d = dispatcher(Default::default()).await;
    let group = unique("filter-group");
    let admin_port = free_port();
    let toml = connection_toml(
        &group,
        &topic,
        &d.url(),
        "concurrency = 64\nfilter = 'value.amount > 1000.0 && headers.source == \"checkout\"'\n",
    );
    let config = temp_config(&format!(
        "[server]\nlisten = \"127.0.0.1:{admin_port}\"\n{toml}"
    ));
    let mut daemon = spawn_daemon(&config, Stdio::null());
    let ends = high_watermarks(&topic, 3);
    wait_for(
        "commits at the end of every partition",
        Duration::from_secs(120),
        || (committed(&group, &topic, 3) == ends).then_some(()),
    )
    .await;
    let counts = handled_by_outcome(admin_port, "main").await;
    daemon.kill().unwrap();
    let _ = daemon.wait();

    assert_eq!(ends.iter().sum::<i64>(), N as i64);
    let expected: BTreeSet<i64> = (0..N as i64).filter(|i| i % 10 == 3).collect();
    let runs = d.runs();
    let started: BTreeSet<i64> = runs
        .iter()
        .map(|r| r.event["value"]["i"].as_i64().expect("value.i"))
        .collect();
    assert_eq!(runs.len(), expected.len(), "one run per matching record");
    assert_eq!(started, expected, "exactly the matching records");
    assert_eq!(d.repeats(), 0);
    for r in &runs {
        let id = super::record_key(
            &group,
            &topic,
            r.event["partition"].as_i64().unwrap() as i32,
            r.event["offset"].as_i64().unwrap(),
        );
        assert_eq!(r.idempotency_key, id);
    }
    assert_eq!(
        counts,
        BTreeMap::from([
            ("accepted".to_owned(), 1_000),
            // Outcomes without a run, and the dead-letter outcomes alerts watch, are exported
            // from the start (at 0 until one happens).
            ("dead_lettered".to_owned(), 0),
            ("expired".to_owned(), 0),
            ("expired_dead_lettered".to_owned(), 0),
            ("filter_error".to_owned(), 1_000),
            ("filtered".to_owned(), 8_000),
            ("skipped".to_owned(), 0),
        ]),
        "handled records by outcome"
    );
}

#[tokio::test]
async fn old_records_are_skipped_or_dead_lettered_with_their_age_and_fresh_ones_run() {
    const HOUR_MS: i64 = 3_600_000;
    let topic = unique("age");
    let other = unique("age-skip");
    let dlq = unique("age-dlq");
    for t in [&topic, &other, &dlq] {
        create_topic(t, 1).await;
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // Even records are two hours old, odd ones fresh.
    let stamped = |i: i64| {
        let old = i % 2 == 0;
        json!({"key": format!("k{i}"), "value": {"i": i, "old": old},
               "timestamp_ms": if old { now_ms - 2 * HOUR_MS } else { now_ms }})
    };
    for t in [&topic, &other] {
        let _ = reference_produce(json!({
            "bootstrap": stack().bootstrap, "topic": t, "key": {"format": "string"},
            "value": {"format": "json"},
            "steps": [{"txn": null, "records": (0..20).map(stamped).collect::<Vec<_>>()}]
        }))
        .await;
    }
    let d = dispatcher(Default::default()).await;
    let group = unique("age-group");
    let admin_port = free_port();
    let mut toml = connection_toml(
        &group,
        &topic,
        &d.url(),
        &format!("max_record_age_ms = {HOUR_MS}\non_expired = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n"),
    );
    toml.push_str(&format!(
        "[connections.it.triggers.skipper]\ntopics = [\"{other}\"]\nworkflow = \"wf-skip\"\ndispatcher = {{ url = \"{}\" }}\nmax_record_age_ms = {HOUR_MS}\n",
        d.url()
    ));
    let config = temp_config(&format!(
        "[server]\nlisten = \"127.0.0.1:{admin_port}\"\n{toml}"
    ));
    let mut daemon = spawn_daemon(&config, Stdio::null());
    wait_committed_to_end(&group, &topic, 1).await;
    wait_committed_to_end(&group, &other, 1).await;
    let dead = handled_by_outcome(admin_port, "main").await;
    let skipped = handled_by_outcome(admin_port, "skipper").await;
    daemon.kill().unwrap();
    let _ = daemon.wait();

    // Fresh records ran, on both triggers; old ones did not.
    let mut ran: Vec<(String, i64)> = d
        .runs()
        .iter()
        .map(|r| {
            assert_eq!(r.event["value"]["old"], json!(false), "{}", r.event);
            (
                r.event["topic"].as_str().unwrap().to_owned(),
                r.event["value"]["i"].as_i64().unwrap(),
            )
        })
        .collect();
    ran.sort();
    let mut expected: Vec<(String, i64)> = [&topic, &other]
        .iter()
        .flat_map(|t| (1..20).step_by(2).map(|i| ((*t).clone(), i)))
        .collect();
    expected.sort();
    assert_eq!(ran, expected);
    // Old records of `main` are in the dead-letter topic, with their age; `skipper` wrote none.
    assert_eq!(high_watermarks(&dlq, 1), vec![10]);
    let letters = read_topic(&dlq, 10).await;
    let mut dead_values = Vec::new();
    for l in &letters {
        let value: Value = serde_json::from_slice(l.value.as_deref().unwrap()).unwrap();
        assert_eq!(value["old"], json!(true));
        dead_values.push(value["i"].as_i64().unwrap());
        let h = &l.headers;
        assert_eq!(h["__connect.errors.stage"], "RECORD_AGE");
        assert_eq!(h["tessel.stage"], "RECORD_AGE");
        assert_eq!(h["tessel.error.class"], "record_expired");
        assert_eq!(h["__connect.errors.topic"], topic);
        let age: i64 = h["tessel.record.age.ms"].parse().expect("age in ms");
        assert!(
            (2 * HOUR_MS..2 * HOUR_MS + 10 * 60_000).contains(&age),
            "age {age} ms"
        );
        // Written with the time of writing (an old stamp could be deleted by the topic's
        // retention at once, or refused), the record's own time kept in a header.
        assert_eq!(
            h["tessel.original.timestamp.ms"],
            (now_ms - 2 * HOUR_MS).to_string()
        );
        let written = l.timestamp.expect("a dead letter has a timestamp");
        assert!(
            written >= now_ms,
            "written at {written}, test began {now_ms}"
        );
    }
    // Different keys are dead-lettered in parallel: in any order.
    dead_values.sort_unstable();
    assert_eq!(dead_values, (0..20).step_by(2).collect::<Vec<i64>>());
    assert_eq!(
        dead,
        BTreeMap::from([
            ("accepted".to_owned(), 10),
            ("dead_lettered".to_owned(), 0),
            ("expired".to_owned(), 0),
            ("expired_dead_lettered".to_owned(), 10),
            ("filter_error".to_owned(), 0),
            ("skipped".to_owned(), 0),
        ])
    );
    assert_eq!(
        skipped,
        BTreeMap::from([
            ("accepted".to_owned(), 10),
            ("dead_lettered".to_owned(), 0),
            ("expired".to_owned(), 10),
            ("expired_dead_lettered".to_owned(), 0),
            ("filter_error".to_owned(), 0),
            ("skipped".to_owned(), 0),
        ])
    );
}

/// Requests as they arrived: lowercase header names and values, and the body.
pub(super) type Recorded = Arc<Mutex<Vec<(BTreeMap<String, String>, Vec<u8>)>>>;

/// An HTTP endpoint that records every request and answers 202.
pub(super) async fn recording_sink() -> (String, Recorded) {
    async fn record(State(seen): State<Recorded>, headers: HeaderMap, body: Bytes) -> StatusCode {
        let headers = headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    v.to_str().expect("ASCII header").to_owned(),
                )
            })
            .collect();
        seen.lock().unwrap().push((headers, body.to_vec()));
        StatusCode::ACCEPTED
    }
    let seen: Recorded = Arc::default();
    let app = axum::Router::new()
        .route("/events", axum::routing::post(record))
        .with_state(Arc::clone(&seen));
    let addr = crate::support::serve_on_own_thread(app);
    (format!("http://{addr}/events"), seen)
}

/// The requests `seen` recorded, each idempotency key once, in the order they first came.
///
/// The connector sends a request again, under the same key, when its answer does not come
/// within the dispatch timeout (a stand-in server slowed by the parallel tests can be late),
/// and a dispatcher dedups by that key: a second copy is one run, not two. Each copy must be
/// the same request.
pub(super) fn distinct_requests(seen: &Recorded) -> Vec<(BTreeMap<String, String>, Vec<u8>)> {
    let all = seen.lock().unwrap().clone();
    let mut first: BTreeMap<String, usize> = BTreeMap::new();
    let mut out: Vec<(BTreeMap<String, String>, Vec<u8>)> = Vec::new();
    for (headers, body) in all {
        let key = headers
            .get("idempotency-key")
            .cloned()
            .unwrap_or_else(|| panic!("a request without an idempotency key: {headers:?}"));
        match first.get(&key) {
            Some(&i) => {
                assert!(
                    out[i].1 == body,
                    "request {key} sent again with another body:\n{}\n{}",
                    String::from_utf8_lossy(&out[i].1),
                    String::from_utf8_lossy(&body)
                );
                eprintln!("request {key} came again (sent after a late answer)");
            }
            None => {
                let _ = first.insert(key, out.len());
                out.push((headers, body));
            }
        }
    }
    out
}

pub(super) const ORDER_AVRO: &str = r#"{"type":"record","name":"Order","namespace":"it.ce","fields":[
 {"name":"order_id","type":"string"},{"name":"amount","type":"double"},
 {"name":"tags","type":{"type":"array","items":"string"}}]}"#;

#[tokio::test]
async fn a_cloudevents_consumer_parses_every_request() {
    let topic = unique("ce");
    create_topic(&topic, 2).await;
    let keys = ["ada", "åse lund", "bo\"b%"];
    let ts = 1_700_000_000_123i64;
    let records: Vec<Value> = (0..12)
        .map(|i| {
            json!({"key": keys[i % keys.len()], "partition": (i % 2) as i32, "timestamp_ms": ts + i as i64,
                   "value": {"order_id": format!("o-{i}"), "amount": 10.5 * i as f64, "tags": ["a", format!("t{i}")]}})
        })
        .collect();
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "registry": stack().registry_url, "topic": topic,
        "key": {"format": "string"}, "value": {"format": "avro", "schema": ORDER_AVRO},
        "steps": [{"txn": null, "records": records}]
    }))
    .await;
    let (url, seen) = recording_sink().await;
    let group = unique("ce-group");
    let toml = connection_toml(&group, &topic, &url, "")
        .replace(
            "dispatcher = { url = ",
            "dispatcher = { envelope = \"cloudevents\", cloudevents_type = \"com.example.order\", url = ",
        )
        .replace(
            "[connections.it.triggers.main]",
            "[connections.it.triggers.main]\nvalue_format = \"schema_registry\"\nkey_format = \"string\"",
        );
    let connector = super::Connector::start(&toml);
    wait_for("12 requests", Duration::from_secs(60), || {
        (seen.lock().unwrap().len() >= 12).then_some(())
    })
    .await;
    wait_committed_to_end(&group, &topic, 2).await;
    connector.stop().await;

    let requests = distinct_requests(&seen);
    assert_eq!(requests.len(), 12, "one request per record");
    let parsed = run_reference(
        "ceparse.py",
        json!({"requests": requests.iter().map(|(h, b)| json!({
            "headers": h, "body_b64": base64::engine::general_purpose::STANDARD.encode(b)
        })).collect::<Vec<_>>()}),
    )
    .await;
    let events = parsed["events"].as_array().expect("events");
    assert_eq!(events.len(), 12);
    let first_server = stack().bootstrap.split(',').next().unwrap().to_owned();
    let mut seen_offsets = BTreeSet::new();
    for ((headers, _), e) in requests.iter().zip(events) {
        let a = &e["attributes"];
        let partition: i64 = a["kafkapartition"].as_str().unwrap().parse().unwrap();
        let offset: i64 = a["kafkaoffset"].as_str().unwrap().parse().unwrap();
        let i = e["data"]["order_id"].as_str().unwrap()[2..]
            .parse::<usize>()
            .unwrap();
        assert!(
            seen_offsets.insert((partition, offset)),
            "one request per record"
        );
        assert_eq!(partition, (i % 2) as i64);
        assert_eq!(a["specversion"], "1.0");
        assert_eq!(
            a["id"],
            json!(super::record_key(&group, &topic, partition as i32, offset))
        );
        assert_eq!(headers["idempotency-key"], a["id"].as_str().unwrap());
        assert_eq!(
            a["source"],
            json!(format!("kafka://{first_server}/{topic}"))
        );
        assert_eq!(a["type"], "com.example.order");
        assert_eq!(a["subject"], keys[i % keys.len()], "percent-decoded key");
        assert_eq!(a["partitionkey"], keys[i % keys.len()]);
        assert_eq!(a["kafkatopic"], json!(topic));
        assert_eq!(a["datacontenttype"], "application/json");
        let time = chrono::DateTime::parse_from_rfc3339(a["time"].as_str().unwrap()).unwrap();
        assert_eq!(time.timestamp_millis(), ts + i as i64);
        // The body is the decoded value, nothing around it.
        assert_eq!(
            e["data"],
            json!({"order_id": format!("o-{i}"), "amount": 10.5 * i as f64, "tags": ["a", format!("t{i}")]})
        );
    }
}
