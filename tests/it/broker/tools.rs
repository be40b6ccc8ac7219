//! Operator tools on the real broker: offsets show, offsets reset (refused while the group is
//! active, a dry run by default, one partition chosen), and dead-letter replay with the
//! original idempotency keys (a batch trigger's in batches, over every partition, retried).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};
use tessel_kafka::cli::dev_dispatcher::Faults;

use super::{
    committed, connection_toml, create_topic, dispatcher, high_watermarks, produce_keyed,
    reference_produce, wait_committed_to_end, Connector, DeadLetterSetup,
};
use crate::support::{binary, stack, temp_config, unique, wait_for};

async fn cli(args: &[&str], config: &std::path::Path) -> Output {
    let mut cmd = Command::new(binary());
    cmd.args(args).arg("--config").arg(config);
    tokio::task::spawn_blocking(move || cmd.output().expect("run tessel-kafka"))
        .await
        .unwrap()
}

/// [`cli`], which must succeed.
async fn cli_ok(args: &[&str], config: &std::path::Path) -> Output {
    let out = cli(args, config).await;
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[tokio::test]
async fn offsets_show_reset_and_dead_letter_replay_work_and_reset_waits_for_an_idle_group() {
    let setup = DeadLetterSetup::create("tools", 1, 1).await;
    let DeadLetterSetup { topic, dlq, group } = &setup;
    produce_keyed(topic, 0, 5, 5).await;
    let rejected = setup.id(0, 1);
    let d = dispatcher(Faults {
        scripted: HashMap::from([(rejected.clone(), vec![422])]),
        ..Faults::default()
    })
    .await;
    let toml = setup.toml(&d.url(), "");
    let config = temp_config(&toml);
    let connector = Connector::start(&toml);
    wait_for("4 runs and 1 dead letter", Duration::from_secs(60), || {
        (d.accepted() == 4 && high_watermarks(dlq, 1) == [1]).then_some(())
    })
    .await;
    wait_for("commit at the end", Duration::from_secs(30), || {
        (committed(group, topic, 1) == [5]).then_some(())
    })
    .await;

    let shown = cli_ok(&["offsets", "show", "--json"], &config).await;
    let rows: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(
        rows,
        json!([{"topic": topic, "partition": 0, "committed": 5, "low_watermark": 0, "high_watermark": 5, "lag": 0}])
    );

    let refused = cli(
        &["offsets", "reset", "--to", "earliest", "--execute"],
        &config,
    )
    .await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "reset must be refused while the connector runs"
    );
    assert!(stderr.contains("active member"), "{stderr}");
    assert_eq!(committed(group, topic, 1), vec![5]);

    connector.stop().await;
    let reset = wait_for_cli_success(
        &["offsets", "reset", "--to", "offset:2", "--execute"],
        &config,
    )
    .await;
    let stdout = String::from_utf8_lossy(&reset.stdout);
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["topic", "partition", "current", "planned"],
            vec![topic.as_str(), "0", "5", "2"]
        ]
    );
    assert_eq!(committed(group, topic, 1), vec![2]);

    let replay = cli_ok(&["dlq", "replay", "--trigger", "main"], &config).await;
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert_eq!(
        stdout.trim(),
        format!("0\t0\t{rejected}\taccepted\t{rejected}")
    );
    // The same replay, as JSON (the dispatcher accepts the key again: it is idempotent).
    let replay = cli_ok(&["dlq", "replay", "--trigger", "main", "--json"], &config).await;
    let replayed: Value = serde_json::from_slice(&replay.stdout).unwrap();
    assert_eq!(
        replayed,
        json!([{
            "dead_letter_partition": 0, "dead_letter_offset": 0, "idempotency_key": rejected,
            "request_key": rejected, "attempts": 1, "outcome": "accepted"
        }])
    );
    let run = d
        .runs()
        .into_iter()
        .find(|r| r.idempotency_key == rejected)
        .expect("the replayed run");
    assert_eq!(run.event["offset"], 1);
    assert_eq!(run.event["topic"], topic.as_str());
    assert_eq!(run.event["value"], json!({"i": 1}));
    assert_eq!(
        run.event["headers"],
        json!([]),
        "the dead-letter headers are not passed on"
    );
}

/// The group leaves the Stable state a moment after its last member closed.
async fn wait_for_cli_success(args: &[&str], config: &std::path::Path) -> Output {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = cli(args, config).await;
        if out.status.success() || std::time::Instant::now() > deadline {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return out;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// With the KIP-848 protocol the group's members are not visible to the classic group
/// description; a reset must still be refused while a daemon consumes, and work once it
/// stopped.
#[tokio::test]
async fn offsets_reset_is_refused_while_a_kip_848_group_consumes() {
    if !super::kip_848_available() {
        return;
    }
    let topic = unique("tools-848");
    create_topic(&topic, 2).await;
    produce_keyed(&topic, 0, 10, 5).await;
    let group = unique("tools-848-group");
    let d = dispatcher(Faults::default()).await;
    let toml = connection_toml(&group, &topic, &d.url(), "").replace(
        "\"auto.offset.reset\" = \"earliest\"\n",
        "\"auto.offset.reset\" = \"earliest\"\n\"group.protocol\" = \"consumer\"\n",
    );
    let config = temp_config(&toml);
    let connector = Connector::start(&toml);
    wait_for("10 runs committed", Duration::from_secs(60), || {
        (d.accepted() == 10 && committed(&group, &topic, 2).iter().sum::<i64>() == 10).then_some(())
    })
    .await;
    let before = committed(&group, &topic, 2);
    let refused = cli(
        &["offsets", "reset", "--to", "earliest", "--execute"],
        &config,
    )
    .await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "reset must be refused while the connector runs: {}{stderr}",
        String::from_utf8_lossy(&refused.stdout)
    );
    assert!(stderr.contains("active member"), "{stderr}");
    assert_eq!(committed(&group, &topic, 2), before, "nothing was reset");

    connector.stop().await;
    let _ = wait_for_cli_success(
        &["offsets", "reset", "--to", "earliest", "--execute"],
        &config,
    )
    .await;
    assert_eq!(committed(&group, &topic, 2), vec![0, 0]);
}

/// Commits `offsets` (one per partition, from 0) for `group` on `topic`, from outside the
/// group, as a consumer that stopped would have.
fn commit_offsets(group: &str, topic: &str, offsets: &[i64]) {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &crate::support::stack().bootstrap)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (p, o) in offsets.iter().enumerate() {
        tpl.add_partition_offset(topic, p as i32, rdkafka::Offset::Offset(*o))
            .unwrap();
    }
    consumer.commit(&tpl, CommitMode::Sync).expect("commit");
}

#[tokio::test]
async fn offsets_reset_dry_runs_by_default_and_executes_on_the_chosen_partition_only() {
    let topic = unique("tools-reset");
    create_topic(&topic, 3).await;
    produce_keyed(&topic, 0, 30, 30).await;
    let ends = high_watermarks(&topic, 3);
    assert!(
        ends.iter().all(|&e| e > 0),
        "every partition has records: {ends:?}"
    );
    let group = unique("tools-reset-group");
    commit_offsets(&group, &topic, &ends);
    let d = dispatcher(Faults::default()).await;
    let config = temp_config(&connection_toml(&group, &topic, &d.url(), ""));

    // A dry run of every partition: the plan, and nothing written.
    let dry = cli_ok(&["offsets", "reset", "--to", "earliest"], &config).await;
    let stdout = String::from_utf8_lossy(&dry.stdout);
    let stderr = String::from_utf8_lossy(&dry.stderr);
    let rows: Vec<Vec<String>> = stdout
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect();
    let mut expected = vec![vec![
        "topic".to_owned(),
        "partition".to_owned(),
        "current".to_owned(),
        "planned".to_owned(),
    ]];
    for (p, end) in ends.iter().enumerate() {
        expected.push(vec![
            topic.clone(),
            p.to_string(),
            end.to_string(),
            "0".to_owned(),
        ]);
    }
    assert_eq!(rows, expected);
    assert!(stderr.contains("dry run: nothing was written"), "{stderr}");
    assert_eq!(committed(&group, &topic, 3), ends);

    // The same for one partition, as JSON.
    let args = [
        "offsets",
        "reset",
        "--to",
        "earliest",
        "--topic",
        &topic,
        "--partition",
        "1",
        "--json",
    ];
    let dry = cli_ok(&args, &config).await;
    let plan: Value = serde_json::from_slice(&dry.stdout).unwrap();
    let one = json!([{
        "topic": topic, "partition": 1, "current": ends[1], "planned": 0,
        "low_watermark": 0, "high_watermark": ends[1]
    }]);
    assert_eq!(
        plan,
        json!({"connection": "it", "group": group, "executed": false, "active_members": 0, "partitions": one})
    );
    assert_eq!(committed(&group, &topic, 3), ends);

    // Executed: only partition 1 moves.
    let executed = cli_ok(&[&args[..], &["--execute"]].concat(), &config).await;
    let result: Value = serde_json::from_slice(&executed.stdout).unwrap();
    assert_eq!(result["executed"], true);
    assert_eq!(result["partitions"], one);
    assert_eq!(committed(&group, &topic, 3), vec![ends[0], 0, ends[2]]);

    // A partition the topic does not have, and --partition without --topic, are refused.
    let missing = cli(
        &[
            "offsets",
            "reset",
            "--to",
            "earliest",
            "--topic",
            &topic,
            "--partition",
            "7",
            "--execute",
        ],
        &config,
    )
    .await;
    assert!(!missing.status.success());
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr).trim(),
        format!("error: topic {topic} has no partition 7 (it has 3 partitions, from 0)")
    );
    let untopical = cli(
        &["offsets", "reset", "--to", "earliest", "--partition", "1"],
        &config,
    )
    .await;
    assert!(!untopical.status.success());
    assert!(
        String::from_utf8_lossy(&untopical.stderr).contains("--topic"),
        "{}",
        String::from_utf8_lossy(&untopical.stderr)
    );
    assert_eq!(committed(&group, &topic, 3), vec![ends[0], 0, ends[2]]);
}

/// A batch trigger's dead letters spread over the three partitions of its dead-letter topic:
/// a dry run (of every partition, then of one) sends nothing and names the batches; the
/// replay sends each partition's dead letters as one batch body, the dispatcher's 503 to one
/// of them is retried, and every dead letter ends accepted once. Against a dispatcher that
/// names an event failed and refuses another, the replay answers as the daemon's batches do.
#[tokio::test]
async fn dlq_replay_of_a_batch_trigger_sends_batches_from_every_partition_and_retries() {
    let setup = DeadLetterSetup::create("tools-replay", 3, 3).await;
    let DeadLetterSetup { topic, dlq, group } = &setup;
    // Partitioned by key as the connector's producer partitions dead letters (murmur2), so
    // a record's dead letter lands in the partition of the same number.
    let records: Vec<Value> = (0..30)
        .map(|i| json!({"key": format!("k{i}"), "value": {"i": i}}))
        .collect();
    let produced = reference_produce(json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"},
        "value": {"format": "json"}, "kafka": {"partitioner": "murmur2_random"},
        "steps": [{"txn": null, "records": records}]
    }))
    .await;
    let placed: Vec<(i32, i64)> = produced["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| {
            (
                r["partition"].as_i64().unwrap() as i32,
                r["offset"].as_i64().unwrap(),
            )
        })
        .collect();
    let id = |(p, o): (i32, i64)| setup.id(p, o);
    // The first two records of each partition are refused: six dead letters, two each.
    let mut refused: BTreeMap<i32, Vec<(i64, i64)>> = BTreeMap::new();
    for (i, &(p, o)) in placed.iter().enumerate() {
        let of_p = refused.entry(p).or_default();
        if of_p.len() < 2 {
            of_p.push((i as i64, o));
        }
    }
    assert!(
        (0..3).all(|p| refused.get(&p).is_some_and(|r| r.len() == 2)),
        "two records in each partition: {placed:?}"
    );
    let refused_ids: HashSet<String> = refused
        .iter()
        .flat_map(|(&p, rs)| rs.iter().map(move |&(_, o)| (p, o)))
        .map(id)
        .collect();
    let d = dispatcher(Faults {
        reject_events: refused_ids.clone(),
        ..Faults::default()
    })
    .await;
    let batch = "batch = { max_records = 10, max_wait_ms = 200 }\n";
    let connector = Connector::start(&setup.toml(&d.url(), batch));
    let _ = wait_committed_to_end(group, topic, 3).await;
    wait_for(
        "two dead letters per partition",
        Duration::from_secs(30),
        || (high_watermarks(dlq, 3) == [2, 2, 2]).then_some(()),
    )
    .await;
    connector.stop().await;
    assert_eq!(d.accepted(), 24);

    // Replayed against a dispatcher of its own, which answers 503 to partition 1's batch once.
    let batch_key = |p: i32| {
        let rs = &refused[&p];
        super::batch_key(group, topic, p, rs[0].1, rs[1].1, 2)
    };
    let replay = dispatcher(Faults {
        scripted: HashMap::from([(batch_key(1), vec![503])]),
        ..Faults::default()
    })
    .await;
    let config = temp_config(&setup.toml(&replay.url(), batch));
    let expected = |outcome: &str, attempts: u32| -> BTreeSet<String> {
        refused
            .iter()
            .flat_map(|(&p, rs)| {
                rs.iter().enumerate().map(move |(n, &(_, o))| {
                    json!({
                        "dead_letter_partition": p, "dead_letter_offset": n,
                        "idempotency_key": id((p, o)), "request_key": batch_key(p),
                        "attempts": if p == 1 { attempts * 2 } else { attempts },
                        "outcome": outcome
                    })
                    .to_string()
                })
            })
            .collect()
    };

    // A dry run of every partition: each record and the batch it would go in; nothing sent.
    let dry = cli_ok(
        &["dlq", "replay", "--trigger", "main", "--dry-run", "--json"],
        &config,
    )
    .await;
    let stderr = String::from_utf8_lossy(&dry.stderr);
    let planned: Vec<Value> = serde_json::from_slice(&dry.stdout).unwrap();
    let planned: BTreeSet<String> = planned.iter().map(Value::to_string).collect();
    assert_eq!(planned, expected("dry_run", 0));
    assert!(
        stderr.contains("dry run: nothing was sent; 6 record(s) would go in 3 request(s)"),
        "{stderr}"
    );
    // The same for partition 2 only, as lines.
    let dry = cli_ok(
        &[
            "dlq",
            "replay",
            "--trigger",
            "main",
            "--dry-run",
            "--partition",
            "2",
        ],
        &config,
    )
    .await;
    let lines: Vec<String> = String::from_utf8_lossy(&dry.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    let two: Vec<String> = refused[&2]
        .iter()
        .enumerate()
        .map(|(n, &(_, o))| format!("2\t{n}\t{}\tdry_run\t{}", id((2, o)), batch_key(2)))
        .collect();
    assert_eq!(lines, two);
    assert_eq!(replay.attempts(), 0, "a dry run sends nothing");

    // The replay: one batch body per partition, partition 1's after a retry.
    let done = cli_ok(&["dlq", "replay", "--trigger", "main", "--json"], &config).await;
    let replayed: Vec<Value> = serde_json::from_slice(&done.stdout).unwrap();
    let replayed: BTreeSet<String> = replayed.iter().map(Value::to_string).collect();
    assert_eq!(replayed, expected("accepted", 1));
    let answered: Vec<u16> = replay
        .attempts_for(&batch_key(1))
        .iter()
        .map(|a| a.1)
        .collect();
    assert_eq!(
        answered,
        [503, 202],
        "partition 1's batch retried after the 503"
    );
    let mut batches: Vec<(String, Vec<String>, u16)> = replay
        .batches()
        .into_iter()
        .map(|b| (b.idempotency_key, b.ids, b.status))
        .collect();
    batches.sort();
    let want: Vec<(String, Vec<String>, u16)> = (0..3)
        .map(|p| {
            let ids = refused[&p].iter().map(|&(_, o)| id((p, o))).collect();
            (batch_key(p), ids, 202)
        })
        .collect();
    assert_eq!(batches, want);
    assert_eq!(replay.repeats(), 0);
    let mut values: Vec<i64> = replay
        .runs()
        .iter()
        .map(|r| {
            assert_eq!(r.event["trigger"], "main");
            r.event["value"]["i"].as_i64().unwrap()
        })
        .collect();
    values.sort_unstable();
    let mut refused_values: Vec<i64> = refused.values().flatten().map(|&(i, _)| i).collect();
    refused_values.sort_unstable();
    assert_eq!(values, refused_values);

    // Against a dispatcher that answers partition 0's first event failed once and refuses
    // partition 2's first: the failed one goes again alone, the refused batch is halved, its
    // refused record is reported and the replay fails; the others are accepted.
    let (failed, refusing) = (id((0, refused[&0][0].1)), id((2, refused[&2][0].1)));
    let picky = dispatcher(Faults {
        fail_events: HashMap::from([(failed, 1)]),
        reject_events: HashSet::from([refusing]),
        ..Faults::default()
    })
    .await;
    let config = temp_config(&setup.toml(&picky.url(), batch));
    let out = cli(&["dlq", "replay", "--trigger", "main", "--json"], &config).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("error: 1 record(s) were not accepted"),
        "{stderr}"
    );
    let alone = |p: i32, n: usize| {
        let o = refused[&p][n].1;
        super::batch_key(group, topic, p, o, o, 1)
    };
    let row = |p: i32, n: usize, request: &str, attempts: u32, outcome: &str| {
        json!({
            "dead_letter_partition": p, "dead_letter_offset": n,
            "idempotency_key": id((p, refused[&p][n].1)), "request_key": request,
            "attempts": attempts, "outcome": outcome
        })
    };
    let got: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        got,
        [
            row(0, 0, &alone(0, 0), 2, "accepted"),
            row(0, 1, &batch_key(0), 1, "accepted"),
            row(1, 0, &batch_key(1), 1, "accepted"),
            row(1, 1, &batch_key(1), 1, "accepted"),
            row(2, 0, &alone(2, 0), 2, "rejected"),
            row(2, 1, &alone(2, 1), 2, "accepted"),
        ]
    );
    let requests: Vec<(String, u16)> = picky
        .batches()
        .into_iter()
        .map(|b| (b.idempotency_key, b.status))
        .collect();
    assert_eq!(
        requests,
        [
            (batch_key(0), 202),
            (alone(0, 0), 202),
            (batch_key(1), 202),
            (batch_key(2), 422),
            (alone(2, 0), 422),
            (alone(2, 1), 202),
        ]
    );
}
