//! Batch triggers against the real broker: each bound closes a batch, key order holds across
//! batches, a batch is committed only once accepted, a partial failure sends again only what
//! failed (and the later records of its keys), a poison record is isolated by bisection and
//! dead-lettered, SIGKILL during batches loses nothing, and CloudEvents triggers send
//! structured batches a CloudEvents SDK reads.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use tessel_kafka::cli::dev_dispatcher::{DevDispatcher, Faults};

use super::failures::read_topic;
use super::{
    assert_all_once, assert_none_lost, committed, committed_with_metadata, connection_toml,
    create_topic, daemon_config, dispatcher, high_watermarks, produce_keyed, reference_produce,
    run_reference, spawn_daemon, wait_committed_to_end, Daemon, DeadLetterSetup,
};
use crate::support::{stack, unique, wait_for};

/// The idempotency key of the record at `partition`/`offset` (its event's `id`).
fn event_id(group: &str, topic: &str, partition: i32, offset: i64) -> String {
    super::record_key(group, topic, partition, offset)
}

/// Every accepted event's value `i`, per (partition, key), in acceptance order.
fn accepted_by_key(d: &DevDispatcher) -> HashMap<(i64, String), Vec<i64>> {
    let mut out: HashMap<(i64, String), Vec<i64>> = HashMap::new();
    for r in d.runs() {
        let partition = r.event["partition"].as_i64().expect("partition");
        let key = r.event["key"].as_str().expect("key").to_owned();
        out.entry((partition, key))
            .or_default()
            .push(r.event["offset"].as_i64().expect("offset"));
    }
    out
}

#[tokio::test]
async fn a_batch_closes_at_max_records_at_max_bytes_and_after_max_wait() {
    let by_records = unique("batch-records");
    let by_bytes = unique("batch-bytes");
    let by_wait = unique("batch-wait");
    for t in [&by_records, &by_bytes, &by_wait] {
        create_topic(t, 1).await;
    }
    // 500 JSON records; 200 string records of exactly 100 key and value bytes; 7 records.
    produce_keyed(&by_records, 0, 500, 10).await;
    let padded: Vec<Value> = (0..200)
        .map(|i| json!({"key": format!("k{}", i % 10), "value": format!("r{i:05}-{}", "x".repeat(91))}))
        .collect();
    assert!(padded
        .iter()
        .all(|r| r["key"].as_str().unwrap().len() + r["value"].as_str().unwrap().len() == 100));
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "topic": by_bytes, "key": {"format": "string"},
        "value": {"format": "string"}, "steps": [{"txn": null, "records": padded}]
    }))
    .await;
    produce_keyed(&by_wait, 0, 7, 3).await;

    let d = dispatcher(Faults::default()).await;
    let group = unique("batch-bounds-group");
    // max_wait_ms of a minute: only the bound under test can close the first two triggers'
    // batches.
    let mut toml = connection_toml(
        &group,
        &by_records,
        &d.url(),
        "batch = { max_records = 50, max_bytes = 1048576, max_wait_ms = 60000 }\n",
    );
    toml.push_str(&format!(
        "[connections.it.triggers.bytes]\ntopics = [\"{by_bytes}\"]\nworkflow = \"wf-bytes\"\nvalue_format = \"string\"\n\
         dispatcher = {{ url = \"{url}\" }}\nbatch = {{ max_records = 500, max_bytes = 1000, max_wait_ms = 60000 }}\n\
         [connections.it.triggers.wait]\ntopics = [\"{by_wait}\"]\nworkflow = \"wf-wait\"\n\
         dispatcher = {{ url = \"{url}\" }}\nbatch = {{ max_records = 500, max_bytes = 1048576, max_wait_ms = 1500 }}\n",
        url = d.url()
    ));
    let daemon = Daemon::start(&toml);
    wait_committed_to_end(&group, &by_records, 1).await;
    wait_committed_to_end(&group, &by_bytes, 1).await;
    wait_committed_to_end(&group, &by_wait, 1).await;
    drop(daemon);

    let batches = d.batches();
    let sizes = |topic: &str| -> Vec<usize> {
        batches
            .iter()
            .filter(|b| {
                let named = crate::support::key_topic(&stack().bootstrap, topic);
                b.idempotency_key.contains(&format!(":{named}:"))
            })
            .map(|b| b.ids.len())
            .collect()
    };
    assert_eq!(sizes(&by_records), vec![50; 10], "max_records = 50");
    // 100 bytes a record, max_bytes = 1000: ten records a batch.
    assert_eq!(sizes(&by_bytes), vec![10; 20], "max_bytes = 1000");
    // Seven records, far below the other bounds: one batch, closed by max_wait_ms.
    assert_eq!(sizes(&by_wait), vec![7], "max_wait_ms");
    for b in &batches {
        // One partition per batch, offsets in order, the key from the first and last.
        let offsets: Vec<i64> = b.offsets.iter().map(|(_, o)| *o).collect();
        assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
        assert!(b.idempotency_key.ends_with(&format!(
            ":{}-{}:{}",
            offsets[0],
            offsets[offsets.len() - 1],
            offsets.len()
        )));
    }
    assert_eq!(d.repeats(), 0);
    assert_eq!(d.accepted(), 500 + 200 + 7);
}

#[tokio::test]
async fn key_order_holds_across_batches_with_failures_and_partial_failures() {
    const N: usize = 3000;
    let topic = unique("batch-order");
    create_topic(&topic, 3).await;
    produce_keyed(&topic, 0, N, 20).await;
    let group = unique("batch-order-group");
    // One event in 41 of every partition fails once inside an accepted batch; a fifth of the
    // requests fail as a whole.
    let fail_events: HashMap<String, u32> = (0..3)
        .flat_map(|p| {
            let (topic, group) = (topic.clone(), group.clone());
            (0..N as i64 / 3)
                .step_by(41)
                .map(move |o| (event_id(&group, &topic, p, o), 1))
        })
        .collect();
    let d = dispatcher(Faults {
        fail_ratio: 0.2,
        fail_status: 503,
        fail_events,
        latency_ms: (0, 5),
        ..Faults::default()
    })
    .await;
    let toml = connection_toml(
        &group,
        &topic,
        &d.url(),
        "concurrency = 3\nbatch = { max_records = 40, max_wait_ms = 100 }\n",
    );
    let daemon = Daemon::start(&toml);
    wait_for("every run", Duration::from_secs(120), || {
        (d.accepted() >= N).then_some(())
    })
    .await;
    wait_committed_to_end(&group, &topic, 3).await;
    drop(daemon);

    assert_all_once(&d, N);
    for ((partition, key), offsets) in accepted_by_key(&d) {
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "partition {partition} key {key} out of order: {offsets:?}"
        );
    }
    assert!(d.batches().iter().all(|b| b.ids.len() <= 40));
}

#[tokio::test]
async fn a_failing_batch_keeps_the_committed_offset_below_it() {
    let topic = unique("batch-commit");
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 100, 7).await;
    let group = unique("batch-commit-group");
    // Batches of ten: the third (offsets 20 to 29) fails until the fault is lifted.
    let third = super::batch_key(&group, &topic, 0, 20, 29, 10);
    let d = dispatcher(Faults {
        fail_keys: HashSet::from([third.clone()]),
        fail_status: 503,
        ..Faults::default()
    })
    .await;
    let toml = connection_toml(
        &group,
        &topic,
        &d.url(),
        "batch = { max_records = 10, max_wait_ms = 60000 }\n",
    );
    let daemon = Daemon::start(&toml);
    wait_for(
        "the first two batches committed",
        Duration::from_secs(60),
        || (committed(&group, &topic, 1) == vec![20]).then_some(()),
    )
    .await;
    wait_for(
        "the third batch failing six times",
        Duration::from_secs(60),
        || (d.attempts_for(&third).len() >= 6).then_some(()),
    )
    .await;
    // Still below the failing batch, and nothing of it or after it ran.
    assert_eq!(committed(&group, &topic, 1), vec![20]);
    let ran: BTreeSet<i64> = d
        .runs()
        .iter()
        .map(|r| r.event["value"]["i"].as_i64().unwrap())
        .collect();
    assert_eq!(ran, (0..20).collect::<BTreeSet<i64>>());
    d.faults(|f| f.fail_keys.clear());
    wait_committed_to_end(&group, &topic, 1).await;
    drop(daemon);
    assert_all_once(&d, 100);
}

#[tokio::test]
async fn a_partial_failure_sends_again_only_the_failed_events_and_later_ones_of_their_keys() {
    let topic = unique("batch-partial");
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 100, 10).await;
    let group = unique("batch-partial-group");
    let (x, y) = (13i64, 47i64);
    let d = dispatcher(Faults {
        fail_events: HashMap::from([
            (event_id(&group, &topic, 0, x), 1),
            (event_id(&group, &topic, 0, y), 1),
        ]),
        ..Faults::default()
    })
    .await;
    let toml = connection_toml(
        &group,
        &topic,
        &d.url(),
        "batch = { max_records = 100, max_wait_ms = 2000 }\n",
    );
    let daemon = Daemon::start(&toml);
    wait_committed_to_end(&group, &topic, 1).await;
    drop(daemon);

    assert_all_once(&d, 100);
    // Offset o holds value o, key k{o % 10}.
    let batches = d.batches();
    for failed in [x, y] {
        let first = batches
            .iter()
            .position(|b| b.offsets.iter().any(|(_, o)| *o == failed))
            .expect("a batch with the failed record");
        let sent: Vec<i64> = batches[first].offsets.iter().map(|(_, o)| *o).collect();
        // What the next request must hold: each failed event of that batch and the later
        // records of its key in it, nothing else.
        let failed_here: Vec<i64> = [x, y].into_iter().filter(|f| sent.contains(f)).collect();
        let expected: Vec<i64> = sent
            .iter()
            .copied()
            .filter(|o| {
                failed_here
                    .iter()
                    .any(|f| o == f || (o > f && o % 10 == f % 10))
            })
            .collect();
        let again: Vec<i64> = batches[first + 1].offsets.iter().map(|(_, o)| *o).collect();
        assert_eq!(again, expected, "the retry of the batch {sent:?}");
    }
    for ((_, key), offsets) in accepted_by_key(&d) {
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "{key}: {offsets:?}"
        );
    }
}

/// A 409 to a batch says its Idempotency-Key was seen (say a crashed owner sent the same
/// bounds and got a partial failure), not that every event was accepted: the batch goes again
/// under a key of its own, and only that answer commits the events.
#[tokio::test]
async fn a_409_to_a_batch_commits_nothing_until_the_batch_is_answered_under_its_own_key() {
    let topic = unique("batch-409");
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 10, 3).await;
    let group = unique("batch-409-group");
    let seen = super::batch_key(&group, &topic, 0, 0, 9, 10);
    let d = dispatcher(Faults {
        scripted: HashMap::from([(seen.clone(), vec![409])]),
        ..Faults::default()
    })
    .await;
    let toml = connection_toml(
        &group,
        &topic,
        &d.url(),
        "batch = { max_records = 10, max_wait_ms = 2000 }\n",
    );
    let connector = super::Connector::start(&toml);
    wait_committed_to_end(&group, &topic, 1).await;
    connector.stop().await;

    assert_all_once(&d, 10);
    let answered: Vec<u16> = d.attempts_for(&seen).iter().map(|a| a.1).collect();
    assert_eq!(answered, vec![409]);
    // Batches the dispatcher took in (an injected answer records none).
    let batches: Vec<(String, u16, usize)> = d
        .batches()
        .into_iter()
        .map(|b| (b.idempotency_key, b.status, b.offsets.len()))
        .collect();
    assert_eq!(batches.len(), 1, "{batches:?}");
    assert!(
        batches[0].0.starts_with(&format!("{seen}:r")) && batches[0].1 / 100 == 2,
        "{batches:?}"
    );
    assert_eq!(batches[0].2, 10);
}

#[tokio::test]
async fn a_poison_record_in_a_batch_of_500_is_bisected_out_and_dead_lettered() {
    let setup = DeadLetterSetup::create("batch-poison", 1, 1).await;
    let DeadLetterSetup { topic, dlq, group } = &setup;
    produce_keyed(topic, 0, 500, 10).await;
    let poison = 321i64;
    let d = dispatcher(Faults {
        reject_events: HashSet::from([setup.id(0, poison)]),
        ..Faults::default()
    })
    .await;
    let toml = setup.toml(
        &d.url(),
        "batch = { max_records = 500, max_wait_ms = 20000 }\n",
    );
    let daemon = Daemon::start(&toml);
    wait_committed_to_end(group, topic, 1).await;
    drop(daemon);

    let batches = d.batches();
    assert_eq!(batches[0].ids.len(), 500, "one batch of 500 first");
    let rejected: Vec<usize> = batches
        .iter()
        .filter(|b| b.status == 422)
        .map(|b| b.ids.len())
        .collect();
    // Each rejected batch is halved until the poison record is alone: 500, 250, … 1.
    assert_eq!(rejected.first(), Some(&500));
    assert_eq!(rejected.last(), Some(&1));
    assert!(rejected
        .windows(2)
        .all(|w| w[1] == w[0].div_ceil(2) || w[1] == w[0] / 2));
    assert!(rejected.len() <= 10, "{rejected:?}");
    // The other 499 accepted exactly once.
    assert_eq!(d.repeats(), 0, "{:?}", d.repeated_keys());
    let accepted: Vec<i64> = {
        let mut v: Vec<i64> = d
            .runs()
            .iter()
            .map(|r| r.event["value"]["i"].as_i64().unwrap())
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(
        accepted,
        (0..500).filter(|i| *i != poison).collect::<Vec<_>>()
    );
    // The poison record alone is in the dead-letter topic, with where it came from.
    assert_eq!(high_watermarks(dlq, 1), vec![1]);
    let dead = read_topic(dlq, 1).await;
    assert_eq!(
        dead[0].headers["__connect.errors.offset"],
        poison.to_string()
    );
    assert_eq!(dead[0].headers["tessel.error.class"], "dispatch_rejected");
    assert_eq!(
        dead[0].headers["tessel.idempotency.key"],
        setup.id(0, poison)
    );
}

#[tokio::test]
async fn sigkill_during_batches_loses_nothing_and_commits_only_accepted_records() {
    const N: usize = 3000;
    let topic = unique("batch-sigkill");
    create_topic(&topic, 4).await;
    produce_keyed(&topic, 0, N, 100).await;
    let d = dispatcher(Faults {
        latency_ms: (20, 60),
        ..Faults::default()
    })
    .await;
    let group = unique("batch-sigkill-group");
    let toml = connection_toml(
        &group,
        &topic,
        &d.url(),
        "concurrency = 4\nbatch = { max_records = 25, max_wait_ms = 200 }\n",
    )
    .replace(
        "\"auto.offset.reset\" = \"earliest\"\n",
        "\"auto.offset.reset\" = \"earliest\"\n\"session.timeout.ms\" = \"6000\"\n",
    );
    let config = daemon_config(0, &toml);
    let spawn = || spawn_daemon(&config, Stdio::null());
    let mut daemon = spawn();
    wait_for("500 runs", Duration::from_secs(90), || {
        (d.accepted() >= 500).then_some(())
    })
    .await;
    daemon.kill().expect("SIGKILL");
    let _ = daemon.wait();
    wait_for(
        "the dispatcher to finish the killed daemon's requests",
        Duration::from_secs(10),
        || (d.in_flight() == 0).then_some(()),
    )
    .await;
    assert!(d.accepted() < N, "the kill came during the batches");
    // Whatever the group's commits cover (below the offset, and in the metadata) was accepted.
    let assert_commits_accepted = |when: &str| {
        let commits = committed_with_metadata(&group, &topic, 4);
        let accepted: HashSet<(i64, i64)> = d
            .runs()
            .iter()
            .map(|r| {
                (
                    r.event["partition"].as_i64().unwrap(),
                    r.event["offset"].as_i64().unwrap(),
                )
            })
            .collect();
        for (p, (offset, metadata)) in commits.iter().enumerate() {
            let p = p as i64;
            for o in 0..(*offset).max(0) {
                assert!(
                    accepted.contains(&(p, o)),
                    "{when}: {p}/{o} committed, never accepted"
                );
            }
            for o in tessel_kafka::core::offsets::parse_metadata(*offset, metadata).iter() {
                assert!(
                    accepted.contains(&(p, o)),
                    "{when}: {p}/{o} in the metadata, never accepted"
                );
            }
        }
    };
    assert_commits_accepted("after the kill");
    let uncovered =
        super::measured::accepted_not_covered(&d, &committed_with_metadata(&group, &topic, 4));
    let mut daemon = spawn();
    wait_for("every run", Duration::from_secs(120), || {
        (d.accepted() >= N).then_some(())
    })
    .await;
    wait_committed_to_end(&group, &topic, 4).await;
    daemon.kill().expect("kill");
    let _ = daemon.wait();
    assert_commits_accepted("at the end");
    for key in d.repeated_keys() {
        assert!(
            uncovered.contains_key(&key),
            "{key} was offered again although a commit covered it at the kill"
        );
    }
    assert_none_lost(&d, N);
}

#[tokio::test]
async fn a_cloudevents_trigger_sends_structured_batches_an_sdk_reads() {
    let topic = unique("batch-ce");
    create_topic(&topic, 2).await;
    let ts = 1_700_000_000_123i64;
    let records: Vec<Value> = (0..12)
        .map(|i| {
            json!({"key": format!("k{}", i % 3), "partition": i % 2, "timestamp_ms": ts + i as i64,
                   "value": {"order_id": format!("o-{i}"), "amount": 10.5 * i as f64, "tags": ["a"]}})
        })
        .collect();
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "registry": stack().registry_url, "topic": topic,
        "key": {"format": "string"}, "value": {"format": "avro", "schema": super::triggers::ORDER_AVRO},
        "steps": [{"txn": null, "records": records}]
    }))
    .await;
    let (url, seen) = super::triggers::recording_sink().await;
    let group = unique("batch-ce-group");
    let toml = connection_toml(
        &group,
        &topic,
        &url,
        "batch = { max_records = 4, max_wait_ms = 300 }\n",
    )
    .replace(
        "dispatcher = { url = ",
        "dispatcher = { envelope = \"cloudevents\", cloudevents_type = \"com.example.order\", url = ",
    )
    .replace(
        "[connections.it.triggers.main]",
        "[connections.it.triggers.main]\nvalue_format = \"schema_registry\"\nkey_format = \"string\"",
    );
    let connector = super::Connector::start(&toml);
    wait_committed_to_end(&group, &topic, 2).await;
    connector.stop().await;

    let requests = super::triggers::distinct_requests(&seen);
    assert!(
        requests.len() >= 4,
        "batches of at most 4 of 6 records per partition"
    );
    for (headers, _) in &requests {
        assert_eq!(
            headers["content-type"],
            "application/cloudevents-batch+json"
        );
    }
    let parsed = run_reference(
        "ceparse.py",
        json!({"requests": requests.iter().map(|(h, b)| json!({
            "headers": h, "body_b64": base64::engine::general_purpose::STANDARD.encode(b)
        })).collect::<Vec<_>>()}),
    )
    .await;
    let events = parsed["events"].as_array().expect("events");
    assert_eq!(events.len(), 12, "every record once");
    let first_server = stack().bootstrap.split(',').next().unwrap().to_owned();
    let mut per_request: BTreeMap<u64, Vec<(i64, i64)>> = BTreeMap::new();
    for e in events {
        let a = &e["attributes"];
        let partition: i64 = a["kafkapartition"].as_str().unwrap().parse().unwrap();
        let offset: i64 = a["kafkaoffset"].as_str().unwrap().parse().unwrap();
        let i: usize = e["data"]["order_id"].as_str().unwrap()[2..]
            .parse()
            .unwrap();
        per_request
            .entry(e["request"].as_u64().unwrap())
            .or_default()
            .push((partition, offset));
        assert_eq!(partition, (i % 2) as i64);
        assert_eq!(a["specversion"], "1.0");
        assert_eq!(
            a["id"],
            json!(event_id(&group, &topic, partition as i32, offset))
        );
        assert_eq!(
            a["source"],
            json!(format!("kafka://{first_server}/{topic}"))
        );
        assert_eq!(a["type"], "com.example.order");
        assert_eq!(a["subject"], format!("k{}", i % 3));
        assert_eq!(a["partitionkey"], format!("k{}", i % 3));
        assert_eq!(a["kafkatopic"], json!(topic));
        assert_eq!(a["datacontenttype"], "application/json");
        let time = chrono::DateTime::parse_from_rfc3339(a["time"].as_str().unwrap()).unwrap();
        assert_eq!(time.timestamp_millis(), ts + i as i64);
        assert_eq!(e["data"]["order_id"], format!("o-{i}"));
    }
    for (request, events) in per_request {
        assert!(events.len() <= 4, "request {request}: {events:?}");
        assert!(
            events
                .windows(2)
                .all(|w| w[0].0 == w[1].0 && w[0].1 < w[1].1),
            "request {request}: one partition, offset order: {events:?}"
        );
        let (first, last) = (events[0], events[events.len() - 1]);
        assert_eq!(
            requests[request as usize].0["idempotency-key"],
            super::batch_key(
                &group,
                &topic,
                first.0 as i32,
                first.1,
                last.1,
                events.len()
            )
        );
    }
}

#[tokio::test]
async fn a_batch_body_is_the_documented_json() {
    let topic = unique("batch-schema");
    create_topic(&topic, 1).await;
    let records: Vec<Value> = (0..6)
        .map(|i| {
            json!({"key": format!("k{}", i % 2), "value": {"i": i, "name": format!("n{i}")},
                   "headers": [["source", "checkout"]]})
        })
        .collect();
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"},
        "value": {"format": "json"}, "steps": [{"txn": null, "records": records}]
    }))
    .await;
    let (url, seen) = super::triggers::recording_sink().await;
    let group = unique("batch-schema-group");
    let toml = connection_toml(
        &group,
        &topic,
        &url,
        "batch = { max_records = 4, max_wait_ms = 300 }\n",
    );
    let connector = super::Connector::start(&toml);
    wait_committed_to_end(&group, &topic, 1).await;
    connector.stop().await;

    let validator = super::pipeline::event_validator();
    let requests = super::triggers::distinct_requests(&seen);
    let mut offsets = Vec::new();
    for (headers, body) in &requests {
        assert_eq!(headers["content-type"], "application/json");
        let batch: Value = serde_json::from_slice(body).expect("JSON");
        super::pipeline::assert_valid_event(&validator, &batch);
        assert_eq!(headers["idempotency-key"], batch["id"].as_str().unwrap());
        let events = batch["events"].as_array().expect("events");
        assert!(events.len() <= 4);
        assert_eq!(batch["count"], events.len());
        assert_eq!(batch["first_offset"], events[0]["offset"]);
        assert_eq!(batch["last_offset"], events[events.len() - 1]["offset"]);
        for e in events {
            // Each event validates on its own too, with the record's own id.
            super::pipeline::assert_valid_event(&validator, e);
            let offset = e["offset"].as_i64().unwrap();
            assert_eq!(e["id"], json!(event_id(&group, &topic, 0, offset)));
            assert_eq!(e["value"]["i"], offset);
            offsets.push(offset);
        }
    }
    assert_eq!(
        offsets,
        (0..6).collect::<Vec<i64>>(),
        "every record once, in order"
    );
}

/// Produces 25 records `{"i": i}` into each of `partitions` partitions of `topic`.
async fn produce_25_per_partition(topic: &str, partitions: i32) {
    let records: Vec<Value> = (0..partitions)
        .flat_map(|p| {
            (0..25).map(move |o| json!({"key": format!("k{}", o % 4), "partition": p, "value": {"i": p * 25 + o}}))
        })
        .collect();
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"},
        "value": {"format": "json"}, "kafka": {"linger.ms": 50},
        "steps": [{"txn": null, "records": records}]
    }))
    .await;
}

/// A connector that has sent the first batch of 20 of each of `partitions` partitions of a new
/// topic (25 records each): the 5 after it wait in a batch that would wait a minute for more.
struct FiveWaiting {
    topic: String,
    group: String,
    d: DevDispatcher,
    toml: String,
    connector: super::Connector,
}

async fn five_waiting_per_partition(name: &str, partitions: i32) -> FiveWaiting {
    let topic = unique(&format!("batch-{name}"));
    create_topic(&topic, partitions).await;
    produce_25_per_partition(&topic, partitions).await;
    let d = dispatcher(Faults::default()).await;
    let group = unique(&format!("batch-{name}-group"));
    let toml = connection_toml(
        &group,
        &topic,
        &d.url(),
        "batch = { max_records = 20, max_wait_ms = 60000 }\n",
    );
    let connector = super::Connector::start(&toml);
    let first_batches = vec![20; usize::try_from(partitions).unwrap()];
    wait_for(
        "the first batches committed",
        Duration::from_secs(60),
        || (committed(&group, &topic, partitions) == first_batches).then_some(()),
    )
    .await;
    FiveWaiting {
        topic,
        group,
        d,
        toml,
        connector,
    }
}

#[tokio::test]
async fn a_waiting_batch_goes_out_when_the_connector_stops_and_is_committed() {
    let FiveWaiting {
        topic,
        group,
        d,
        connector,
        ..
    } = five_waiting_per_partition("stop", 1).await;
    connector.stop().await;
    // The stop sent the waiting five at once, and committed them once accepted.
    assert_eq!(committed(&group, &topic, 1), vec![25]);
    assert_all_once(&d, 25);
    let sizes: Vec<usize> = d.batches().iter().map(|b| b.ids.len()).collect();
    assert_eq!(sizes, vec![20, 5]);
}

#[tokio::test]
async fn a_waiting_batch_goes_out_when_its_partition_is_revoked_and_is_committed() {
    let FiveWaiting {
        topic,
        group,
        d,
        toml,
        connector: first,
    } = five_waiting_per_partition("revoke", 2).await;
    // A second member joins: the first revokes its partitions (eager assignment), sending
    // each partition's waiting five at once. Without that, they would wait max_wait_ms (a
    // minute) at the next owner, longer than this waits.
    let second = super::Connector::start(&toml);
    wait_for("every record committed", Duration::from_secs(30), || {
        (committed(&group, &topic, 2) == vec![25, 25]).then_some(())
    })
    .await;
    second.stop().await;
    first.stop().await;
    assert_all_once(&d, 50);
}
