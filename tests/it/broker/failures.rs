//! Failure handling: dispatcher statuses, dead-letter records, malformed floods, outages.

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use serde_json::{json, Value};
use tessel_kafka::cli::dev_dispatcher::Faults;
use tessel_kafka::codec::headers::raw_headers;

use super::produce_keyed;
use super::sasl_ssl_kafka_table;
use super::{
    committed, connection_toml, create_topic, dispatcher, high_watermarks, reference_produce,
    spawn_daemon, wait_committed_to_end, Connector, DeadLetterSetup,
};
use crate::support::{stack, temp_config, unique, wait_for};

/// A record read back from a dead-letter topic.
#[derive(Debug)]
pub struct DeadLetter {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// By name (names and values read lossily as UTF-8; the last of duplicates).
    pub headers: BTreeMap<String, String>,
    /// Every header as bytes, in order.
    pub raw_headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// The record's timestamp (ms), if any.
    pub timestamp: Option<i64>,
}

/// Reads `count` records of `topic` from the beginning (read_committed), or panics.
pub async fn read_topic(topic: &str, count: usize) -> Vec<DeadLetter> {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &stack().bootstrap)
            .set("group.id", unique("dlq-reader"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        consumer.subscribe(&[&topic]).expect("subscribe");
        let mut out = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while out.len() < count {
            assert!(
                std::time::Instant::now() < deadline,
                "read {} of {count} records of {topic}",
                out.len()
            );
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    // Read as bytes: rust-rdkafka's header API panics on a name that is not
                    // UTF-8, and dead letters keep such names.
                    let m = m.detach();
                    let raw_headers: Vec<(Vec<u8>, Option<Vec<u8>>)> = raw_headers(&m)
                        .map(|h| (h.name.to_vec(), h.value.map(<[u8]>::to_vec)))
                        .collect();
                    let headers = raw_headers
                        .iter()
                        .map(|(k, v)| {
                            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                            (text(k), v.as_deref().map(text).unwrap_or_default())
                        })
                        .collect();
                    out.push(DeadLetter {
                        key: m.key().map(<[u8]>::to_vec),
                        value: m.payload().map(<[u8]>::to_vec),
                        headers,
                        raw_headers,
                        timestamp: m.timestamp().to_millis(),
                    });
                }
                Some(Err(e)) => panic!("reading {topic}: {e}"),
                None => {}
            }
        }
        out
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn each_dispatcher_status_leads_to_its_documented_outcome() {
    let setup = DeadLetterSetup::create("statuses", 1, 1).await;
    let DeadLetterSetup { topic, dlq, group } = &setup;
    produce_keyed(topic, 0, 9, 9).await;
    let key = |o: i64| setup.id(0, o);
    let script: HashMap<String, Vec<u16>> = [
        (0, vec![400]),
        (1, vec![404]),
        (2, vec![410]),
        (3, vec![422]),
        (4, vec![500, 502]),
        (5, vec![429]),
        (6, vec![503; 10]),
        (7, vec![401; 100]),
        (8, vec![500, 500, 500]),
    ]
    .into_iter()
    .map(|(o, s)| (key(o), s))
    .collect();
    let d = dispatcher(Faults {
        scripted: script,
        retry_after_secs: Some(2),
        ..Faults::default()
    })
    .await;
    let extra = "concurrency = 9\nordering = \"unordered\"\n";
    let toml = setup.toml(&d.url(), extra).replace(
        "retry = { initial_backoff_ms = 50, max_backoff_ms = 500 }",
        "retry = { initial_backoff_ms = 100, max_backoff_ms = 200, max_attempts = 4 }",
    );
    let connector = Connector::start(&toml);
    wait_for(
        "offsets 4, 5 and 8 accepted",
        Duration::from_secs(60),
        || (d.accepted() == 3).then_some(()),
    )
    .await;
    let dead = read_topic(dlq, 5).await;
    wait_for(
        "commit held at the 401 message",
        Duration::from_secs(30),
        || (committed(group, topic, 1) == [7]).then_some(()),
    )
    .await;
    connector.stop().await;

    let accepted: Vec<i64> = {
        let mut v: Vec<i64> = d
            .runs()
            .iter()
            .map(|r| r.event["offset"].as_i64().unwrap())
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(
        accepted,
        vec![4, 5, 8],
        "5xx and 429 are retried until accepted"
    );
    let by_offset: BTreeMap<String, &BTreeMap<String, String>> = dead
        .iter()
        .map(|r| (r.headers["__connect.errors.offset"].clone(), &r.headers))
        .collect();
    assert_eq!(
        by_offset.keys().cloned().collect::<Vec<_>>(),
        vec!["0", "1", "2", "3", "6"],
        "401 is never dead-lettered"
    );
    for (offset, status, class) in [
        ("0", "400", "dispatch_rejected"),
        ("1", "404", "dispatch_rejected"),
        ("2", "410", "dispatch_rejected"),
        ("3", "422", "dispatch_rejected"),
        ("6", "503", "retries_exhausted"),
    ] {
        let h = by_offset[offset];
        assert_eq!(h["tessel.http.status"], status, "offset {offset}");
        assert_eq!(h["tessel.error.class"], class, "offset {offset}");
        assert_eq!(&h["__connect.errors.topic"], topic);
        assert_eq!(h["__connect.errors.partition"], "0");
        assert_eq!(h["__connect.errors.stage"], "DISPATCH");
        assert_eq!(
            h["__connect.errors.exception.class.name"],
            format!("tessel.{class}")
        );
        assert_eq!(h["tessel.idempotency.key"], key(offset.parse().unwrap()));
        assert_eq!(h["tessel.trigger"], "main");
    }
    assert_eq!(by_offset["6"]["tessel.attempts"], "4");
    // The original record is kept.
    let r0 = dead
        .iter()
        .find(|r| r.headers["__connect.errors.offset"] == "0")
        .unwrap();
    assert_eq!(r0.key.as_deref(), Some(&b"k0"[..]));
    assert_eq!(
        serde_json::from_slice::<Value>(r0.value.as_deref().unwrap()).unwrap(),
        json!({"i": 0})
    );

    // 429 with Retry-After: 2 waits at least 2 s before the next attempt.
    let a5 = d.attempts_for(&key(5));
    assert_eq!(a5.iter().map(|a| a.1).collect::<Vec<_>>(), vec![429, 202]);
    let waited = a5[1].0 - a5[0].0;
    assert!(
        waited >= Duration::from_millis(1950),
        "Retry-After 2 s honoured, waited {waited:?}"
    );
    // 401 stops the trigger's message without dead-lettering or committing it.
    assert!(d.attempts_for(&key(7)).iter().all(|a| a.1 == 401));
}

#[tokio::test]
async fn backoff_grows_and_stops_at_its_cap() {
    let topic = unique("backoff");
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 1, 1).await;
    let group = unique("backoff-group");
    let key = super::record_key(&group, &topic, 0, 0);
    let d = dispatcher(Faults {
        scripted: HashMap::from([(key.clone(), vec![500; 5])]),
        ..Faults::default()
    })
    .await;
    let toml = connection_toml(&group, &topic, &d.url(), "").replace(
        "retry = { initial_backoff_ms = 50, max_backoff_ms = 500 }",
        "retry = { initial_backoff_ms = 100, max_backoff_ms = 400 }",
    );
    let connector = Connector::start(&toml);
    wait_for("accepted after 5 failures", Duration::from_secs(30), || {
        (d.accepted() == 1).then_some(())
    })
    .await;
    connector.stop().await;
    let attempts = d.attempts_for(&key);
    assert_eq!(attempts.len(), 6);
    let gaps: Vec<Duration> = attempts.windows(2).map(|w| w[1].0 - w[0].0).collect();
    eprintln!("backoff gaps: {gaps:?}");
    // Ceilings 100, 200, 400, 400, 400 ms; each delay is in the upper half of its ceiling.
    let ms = |d: &Duration| d.as_millis() as u64;
    assert!((45..200).contains(&ms(&gaps[0])), "{gaps:?}");
    assert!((95..300).contains(&ms(&gaps[1])), "{gaps:?}");
    for g in &gaps[2..] {
        assert!((195..550).contains(&ms(g)), "capped at 400 ms: {gaps:?}");
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn latest_id(subject: &str) -> u32 {
    let v: Value = reqwest::get(format!(
        "{}/subjects/{subject}/versions/latest",
        stack().registry_url
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    v["id"].as_u64().expect("schema id") as u32
}

const PING_AVRO: &str = r#"{"type":"record","name":"Ping","namespace":"flood","fields":[{"name":"n","type":"long"},{"name":"note","type":"string"}]}"#;
const PING_PROTO: &str = "syntax = \"proto3\";\npackage flood;\nmessage Pong { int64 n = 1; }\n";

#[tokio::test]
async fn a_flood_of_malformed_payloads_is_dead_lettered_and_the_rest_dispatched() {
    let topic = unique("flood");
    let aux = unique("flood-proto");
    let dlq = unique("flood-dlq");
    for t in [&topic, &dlq] {
        create_topic(t, 4).await;
    }
    create_topic(&aux, 1).await;
    // Register the schemas the bad payloads point at.
    let avro_spec = json!({"format": "avro", "schema": PING_AVRO});
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "registry": stack().registry_url, "topic": topic,
        "key": {"format": "string"}, "value": avro_spec,
        "steps": [{"txn": null, "records": [{"key": "good-first", "value": {"n": -1, "note": "first"}}]}]
    }))
    .await;
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "registry": stack().registry_url, "topic": aux,
        "key": {"format": "string"}, "value": {"format": "protobuf", "message": "flood.Pong", "proto_files": {"pong.proto": PING_PROTO}},
        "steps": [{"txn": null, "records": [{"key": "p", "value": {"n": "1"}}]}]
    }))
    .await;
    let avro_id = latest_id(&format!("{topic}-value")).await;
    let proto_id = latest_id(&format!("{aux}-value")).await;
    let frame = |id: u32, body: &[u8]| -> Vec<u8> {
        let mut v = vec![0u8];
        v.extend_from_slice(&id.to_be_bytes());
        v.extend_from_slice(body);
        v
    };
    let mut records = Vec::new();
    let mut expected_class = BTreeMap::new();
    for i in 0..1000u32 {
        records.push(json!({"key": format!("good-{i}"), "value": {"n": i, "note": "ok"}}));
        let mut random: Vec<u8> = (0..(1 + rand::random::<u8>() % 40))
            .map(|_| rand::random())
            .collect();
        random[0] = random[0].max(2);
        records.push(json!({"key": format!("random-{i}"), "raw_value_b64": b64(&random)}));
        records.push(json!({"key": format!("unknown-{i}"), "raw_value_b64": b64(&frame(0x7fff_0000 + i, b"\x02xx"))}));
        // A long of 300 then a string whose length says 20 bytes, with 2 present.
        records.push(json!({"key": format!("truncated-{i}"), "raw_value_b64": b64(&frame(avro_id, &[0xd8, 0x04, 0x28, b'a', b'b']))}));
        // Message-index array pointing at message 10 of a file with one message.
        records.push(json!({"key": format!("badindex-{i}"), "raw_value_b64": b64(&frame(proto_id, &[0x02, 0x14, 0x08, 0x01]))}));
    }
    for (kind, class) in [
        ("random", "tessel.wire_format"),
        ("unknown", "tessel.schema_not_found"),
        ("truncated", "tessel.payload"),
        ("badindex", "tessel.payload"),
    ] {
        let _ = expected_class.insert(kind.to_owned(), class.to_owned());
    }
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "registry": stack().registry_url, "topic": topic,
        "key": {"format": "string"}, "value": avro_spec,
        "steps": [{"txn": null, "records": records}]
    }))
    .await;
    let d = dispatcher(Faults::default()).await;
    let group = unique("flood-group");
    let extra = format!(
        "on_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\nconcurrency = 64\nvalue_format = \"schema_registry\"\nkey_format = \"string\"\n"
    );
    let toml = connection_toml(&group, &topic, &d.url(), &extra).replace(
        "retry = { initial_backoff_ms = 50, max_backoff_ms = 500 }",
        "retry = { initial_backoff_ms = 50, max_backoff_ms = 200, schema_not_found_ms = 300 }",
    );
    let connector = Connector::start(&toml);
    wait_for("1001 good runs", Duration::from_secs(180), || {
        (d.accepted() >= 1001).then_some(())
    })
    .await;
    let dead = read_topic(&dlq, 4000).await;
    wait_committed_to_end(&group, &topic, 4).await;
    connector.stop().await;
    assert_eq!(d.accepted(), 1001);
    assert!(d
        .runs()
        .iter()
        .all(|r| r.event["key"].as_str().unwrap().starts_with("good")));
    let mut per_kind: BTreeMap<String, usize> = BTreeMap::new();
    for r in &dead {
        let key = String::from_utf8(r.key.clone().unwrap()).unwrap();
        let kind = key.split('-').next().unwrap().to_owned();
        assert_eq!(
            r.headers["__connect.errors.exception.class.name"], expected_class[&kind],
            "{key}: {:?}",
            r.headers
        );
        assert_eq!(r.headers["__connect.errors.stage"], "VALUE_DESERIALIZE");
        assert_eq!(r.headers["__connect.errors.topic"], topic);
        assert!(!r.headers["__connect.errors.exception.message"].is_empty());
        *per_kind.entry(kind).or_default() += 1;
    }
    assert_eq!(
        per_kind.values().copied().collect::<Vec<_>>(),
        vec![1000; 4],
        "{per_kind:?}"
    );
    assert_eq!(dead.len(), 4000, "each bad record exactly once");
}

#[tokio::test]
async fn a_dispatcher_down_for_60_seconds_loses_nothing_and_keeps_the_group() {
    let topic = unique("dispatcher-down");
    let dlq = unique("dispatcher-down-dlq");
    create_topic(&topic, 2).await;
    create_topic(&dlq, 1).await;
    let d = dispatcher(Faults {
        fail_all: Some(503),
        ..Faults::default()
    })
    .await;
    let admin_port = crate::support::free_port();
    let group = unique("dispatcher-down-group");
    // The default policy, with a dead-letter topic available to prove nothing is sent there;
    // a short poll interval would evict a consumer that stopped polling while it waits.
    let toml = connection_toml(&group, &topic, &d.url(), &format!("on_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n"))
        .replace("\"auto.offset.reset\" = \"earliest\"\n", "\"auto.offset.reset\" = \"earliest\"\n\"max.poll.interval.ms\" = \"25000\"\n\"session.timeout.ms\" = \"6000\"\n")
        .replace("retry = { initial_backoff_ms = 50, max_backoff_ms = 500 }", "retry = { initial_backoff_ms = 200, max_backoff_ms = 5000 }");
    let config = temp_config(&format!(
        "[server]\nlisten = \"127.0.0.1:{admin_port}\"\n{toml}"
    ));
    let mut daemon = spawn_daemon(&config, Stdio::null());
    produce_keyed(&topic, 0, 200, 200).await;
    wait_for("dispatch attempts failing", Duration::from_secs(30), || {
        (d.attempts() > 50).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await; // the outage itself, not a synchronisation
    d.faults(|f| f.fail_all = None);
    wait_for(
        "all 200 runs after recovery",
        Duration::from_secs(60),
        || (d.accepted() == 200).then_some(()),
    )
    .await;
    wait_committed_to_end(&group, &topic, 2).await;
    let metrics = reqwest::get(format!("http://127.0.0.1:{admin_port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    daemon.kill().unwrap();
    let _ = daemon.wait();
    assert_eq!(d.repeats(), 0);
    assert_eq!(high_watermarks(&dlq, 1), vec![0], "nothing dead-lettered");
    let rebalances: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("tessel_kafka_rebalances_total"))
        .collect();
    assert_eq!(
        rebalances.len(),
        1,
        "one assignment and no revoke or loss: {rebalances:?}"
    );
    assert!(
        rebalances[0].contains("kind=\"assign\"") && rebalances[0].ends_with(" 1"),
        "{rebalances:?}"
    );
}

#[tokio::test]
async fn a_dead_letter_write_refused_by_an_acl_is_not_committed_and_says_why() {
    let s = stack();
    let topic = unique(&format!("{}dlq-acl", s.acl_prefix));
    let forbidden = unique("forbidden-dlq");
    create_topic(&topic, 1).await;
    create_topic(&forbidden, 1).await;
    produce_keyed(&topic, 0, 3, 3).await;
    let d = dispatcher(Faults {
        fail_all: Some(422),
        ..Faults::default()
    })
    .await;
    let group = unique(&format!("{}dlq-acl-group", s.acl_prefix));
    let kafka = sasl_ssl_kafka_table(&s.limited_user, &s.limited_password, &group);
    let config = temp_config(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
{kafka}[connections.it.triggers.main]
topics = ["{topic}"]
workflow = "wf"
on_error = "dead_letter"
dead_letter_topic = "{forbidden}"
retry = {{ initial_backoff_ms = 200, max_backoff_ms = 1000 }}
dispatcher = {{ url = "{}" }}
"#,
        d.url()
    ));
    let log = std::env::temp_dir().join(format!("{}.log", unique("dlq-acl")));
    let mut daemon = spawn_daemon(&config, std::fs::File::create(&log).unwrap().into());
    let line = wait_for(
        "the refused dead-letter write in the log",
        Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(&log).ok()?;
            text.lines()
                .find(|l| l.contains("cannot write to the dead-letter topic"))
                .map(str::to_owned)
        },
    )
    .await;
    // Let it retry a while: the offset must stay uncommitted throughout.
    wait_for("several refused writes", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&log).ok()?;
        (text
            .matches("cannot write to the dead-letter topic")
            .count()
            >= 6)
            .then_some(())
    })
    .await;
    let committed_now = committed(&group, &topic, 1);
    daemon.kill().unwrap();
    let _ = daemon.wait();
    assert!(
        line.contains("authoriz") || line.contains("Authoriz"),
        "the error says why: {line}"
    );
    assert!(line.contains(&forbidden), "{line}");
    // The commit may record offset 0 (start again at the first message), never past it.
    assert!(
        committed_now[0] <= 0,
        "committed past the unhandled message: {committed_now:?}"
    );
    assert_eq!(high_watermarks(&forbidden, 1), vec![0]);
}

/// A dispatcher failing one key stalls its partition: `/health` and the metrics say so (with
/// the reason, and the parked record's age as the lag in seconds) until it moves again, while
/// the probes stay up: a tenant's dispatcher trouble neither restarts the pod nor takes it out
/// of its Service.
#[tokio::test]
async fn a_stalled_partition_is_reported_with_its_reason_until_it_moves_again() {
    let topic = unique("stall");
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 5, 5).await;
    let group = unique("stall-group");
    let stuck = super::record_key(&group, &topic, 0, 2);
    let d = dispatcher(Faults {
        fail_keys: std::collections::HashSet::from([stuck]),
        fail_status: 500,
        ..Faults::default()
    })
    .await;
    let admin_port = crate::support::free_port();
    let toml = connection_toml(&group, &topic, &d.url(), "").replace(
        "drain_timeout_ms = 10000\n",
        "drain_timeout_ms = 10000\nstall_after_ms = 1500\n",
    );
    let config = temp_config(&format!(
        "[server]\nlisten = \"127.0.0.1:{admin_port}\"\n{toml}"
    ));
    let mut daemon = spawn_daemon(&config, Stdio::null());
    let get = |path: &'static str| async move {
        let resp = reqwest::get(format!("http://127.0.0.1:{admin_port}{path}"))
            .await
            .ok()?;
        let status = resp.status().as_u16();
        Some((status, resp.json::<Value>().await.ok()?))
    };
    let mut body = Value::Null;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        // Degraded at start-up too (no broker report yet): wait for the stall itself.
        if let Some((503, b)) = get("/health").await {
            let stalled = b["connections"]["it"]["stalled_partitions"]
                .as_object()
                .is_some_and(|m| !m.is_empty());
            body = b;
            if stalled {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let reason = body["connections"]["it"]["stalled_partitions"][format!("{topic}[0]")]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reason.contains("key parked") && reason.contains("HTTP 500"),
        "/health says why: {body}"
    );
    assert_eq!(
        get("/readyz").await,
        Some((200, json!({"status": "ready"}))),
        "ready while a partition is stalled"
    );
    assert_eq!(
        get("/livez").await,
        Some((200, json!({"status": "ok"}))),
        "alive while a partition is stalled"
    );
    let metric = |text: &str, series: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    };
    let metrics_text = || super::metrics_text(admin_port);
    let lag_seconds = format!(
        "tessel_kafka_consumer_lag_seconds{{connection=\"it\",topic=\"{topic}\",partition=\"0\"}}"
    );
    // The parked record (offset 2) waits since the stall began at least 1.5 s ago: it is the
    // partition's oldest record not handled.
    let metrics = wait_for_async_deadline(Duration::from_secs(10), || async {
        let text = metrics_text().await?;
        (metric(&text, &lag_seconds)? >= 1.5).then_some(text)
    })
    .await
    .unwrap_or_else(|| panic!("no {lag_seconds} of at least 1.5"));
    assert_eq!(
        metric(
            &metrics,
            "tessel_kafka_stalled_partitions{connection=\"it\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    d.faults(|f| f.fail_keys.clear());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut recovered = false;
    while !recovered && std::time::Instant::now() < deadline {
        recovered = matches!(get("/health").await, Some((200, _)));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(recovered, "healthy again once the partition moves");
    // Everything handled: nothing waits, and the lag in seconds is 0.
    let caught_up = wait_for_async_deadline(Duration::from_secs(10), || async {
        let text = metrics_text().await?;
        (metric(&text, &lag_seconds)? == 0.0).then_some(())
    })
    .await;
    daemon.kill().unwrap();
    let _ = daemon.wait();
    assert_eq!(caught_up, Some(()), "{lag_seconds} back to 0");
    assert_eq!(d.accepted(), 5);
}

/// Polls `f` until it answers or `within` passes.
async fn wait_for_async_deadline<T, F, Fut>(within: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The broker refuses a partition's commit whose metadata is longer than its
/// `offset.metadata.max.bytes` (4096 by default; `commit_metadata_max_bytes` may say up to
/// 8192 for brokers set higher): `/health` reports the partition stalled because its commits
/// are refused, not for the keys parked below the records handled. (What follows a refusal,
/// the hold on new runs for at most `COMMIT_HOLD_LIMIT` and a map that shrinks once the gap
/// closes, is the core's and the shell simulation's to show; run here it would take minutes.)
///
/// One partition: 32 keys parked at offsets 0-31 (answered 500), then 9,000 times two records
/// of the parked keys, which wait, and one of another key, which runs: the handled offsets
/// are every third one above the gap, a map of 27,000 offsets, over 4,096 characters.
#[tokio::test]
async fn a_partition_whose_commits_the_broker_refuses_is_reported_stalled_for_that() {
    let topic = unique("refused-commit");
    let group = unique("refused-commit-group");
    create_topic(&topic, 1).await;
    let (parked, triples) = (32usize, 9000usize);
    let mut records: Vec<Value> = (0..parked)
        .map(|h| json!({"key": format!("hot{h}"), "value": {"i": h}}))
        .collect();
    for j in 0..triples {
        for (n, key) in [
            format!("hot{}", (2 * j) % parked),
            format!("hot{}", (2 * j + 1) % parked),
            format!("k{}", j % 50),
        ]
        .into_iter()
        .enumerate()
        {
            records.push(json!({"key": key, "value": {"i": parked + 3 * j + n}}));
        }
    }
    let total = records.len();
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"},
        "value": {"format": "json"}, "kafka": {"linger.ms": 20, "batch.num.messages": 10000},
        "steps": [{"txn": null, "records": records}]
    }))
    .await;
    let d = dispatcher(Faults {
        fail_keys: (0..parked as i64)
            .map(|o| super::record_key(&group, &topic, 0, o))
            .collect(),
        fail_status: 500,
        ..Faults::default()
    })
    .await;
    let toml = connection_toml(&group, &topic, &d.url(), "concurrency = 32\n").replace(
        "drain_timeout_ms = 10000\n",
        "drain_timeout_ms = 10000\nstall_after_ms = 1000\nmax_buffered_per_partition = 30000\n\
         commit_metadata_max_bytes = 8192\n",
    );
    let started = std::time::Instant::now();
    let daemon = super::LoggedDaemon::start("refused-commit", &toml);
    // Stalled for the refusal: the map outgrows the broker's limit while the other keys run.
    let reason = daemon
        .stall_reason(&format!("{topic}[0]"), "refuses", Duration::from_secs(120))
        .await;
    let stalled_after = started.elapsed();
    assert!(
        reason.contains("the broker refuses the commit of offset 0"),
        "/health says why: {reason}"
    );
    // What the broker kept: the gap's offset, with the last map it took.
    let (offset, metadata) = super::committed_with_metadata(&group, &topic, 1)[0].clone();
    assert_eq!(offset, 0, "the commit stands at the gap");
    assert!(
        metadata.starts_with("tk3:") && metadata.len() <= 4096,
        "the last map the broker took: {} characters",
        metadata.len()
    );
    let ran_before = d.accepted();
    eprintln!(
        "refused commits: stalled for that {:.1} s after start ({reason}); {ran_before} of \
         {total} records ran by then, the broker kept a map of {} characters",
        stalled_after.as_secs_f64(),
        metadata.len(),
    );
}

/// A topic deleted (and not created again) under a partition with a backlog: librdkafka's
/// fetch answers that the topic is unknown, a hint that it may have been deleted or created
/// again, so the partition runs and commits nothing until its topic's id is read; the topic
/// is gone, so that id is not read, and `/health` reports the partition stalled for that, not
/// for the parked key it waited behind, until librdkafka treats the topic as gone (after
/// `topic.metadata.propagation.max.ms`, 30 s) and the partition is revoked.
///
/// One partition, below its buffer limit, so still fetched: key k0 at offsets 0-4, its first
/// record answered 500 (parked), the four others waiting behind it.
#[tokio::test]
async fn a_partition_whose_topic_is_deleted_is_reported_stalled_awaiting_its_topic_id() {
    let topic = unique("deleted-topic-stall");
    let group = unique("deleted-topic-stall-group");
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 5, 1).await;
    let d = dispatcher(Faults {
        fail_keys: [super::record_key(&group, &topic, 0, 0)].into(),
        fail_status: 500,
        ..Faults::default()
    })
    .await;
    let toml = connection_toml(&group, &topic, &d.url(), "").replace(
        "drain_timeout_ms = 10000\n",
        "drain_timeout_ms = 10000\nstall_after_ms = 1000\n",
    );
    let daemon = super::LoggedDaemon::start("deleted-topic-stall", &toml);
    let partition = format!("{topic}[0]");
    // First stalled for the parked key: the daemon reads the partition and holds its backlog.
    let parked = daemon
        .stall_reason(&partition, "key parked", Duration::from_secs(60))
        .await;
    super::resets::delete_topic(&topic).await;
    let deleted = std::time::Instant::now();
    let awaiting = daemon
        .stall_reason(
            &partition,
            "until its topic's id is read",
            Duration::from_secs(60),
        )
        .await;
    let after = deleted.elapsed();
    assert!(
        awaiting.starts_with("holding its runs and commits until its topic's id is read"),
        "/health says why: {awaiting}"
    );
    assert_eq!(
        d.accepted(),
        0,
        "nothing of k0 ran behind its parked record"
    );
    eprintln!(
        "deleted topic: stalled awaiting its topic id {:.1} s after the deletion ({awaiting}); \
         before it, stalled for the parked key ({parked})",
        after.as_secs_f64(),
    );
}
