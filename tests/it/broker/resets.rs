//! What librdkafka and Kafka do outside the core's ideal model (issue 34): a topic deleted and
//! created again under the same name is a new log whose every record runs, whether the new
//! log is shorter than the old position (librdkafka's fetch is out of range and resets) or
//! longer (nothing but the topic's id tells them apart), also while the partition waits
//! behind a parked key and is not fetched (the probe of paused partitions' log ends sees it);
//! and a partition whose records wait behind a parked key never holds the connection's byte
//! budget against the others.

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use tessel_kafka::cli::dev_dispatcher::{DevDispatcher, Faults};

use super::{committed, connection_toml, create_topic, dispatcher, produce_keyed, Connector};
use crate::support::{stack, unique, wait_for, wait_for_async};

/// Deletes `topic`. Here it is created again at once ([`create_again`]), as an operator's
/// script would: within librdkafka's metadata refresh, so the consumer keeps its assignment
/// and reads the new log at its old position (`failures` deletes one for good).
pub(super) async fn delete_topic(topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &stack().bootstrap)
        .create()
        .expect("admin client");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin.delete_topics(&[topic], &opts).await.expect("delete") {
        r.unwrap_or_else(|(t, e)| panic!("cannot delete {t}: {e}"));
    }
}

/// Creates `topic` with one partition once the broker finished deleting it (until then it
/// answers that the topic exists).
async fn create_again(topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &stack().bootstrap)
        .create()
        .expect("admin client");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let new =
            rdkafka::admin::NewTopic::new(topic, 1, rdkafka::admin::TopicReplication::Fixed(1));
        let res = admin.create_topics(&[new], &opts).await.expect("create");
        match res.into_iter().next().expect("one result") {
            Ok(_) => return,
            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists))
                if std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err((t, e)) => panic!("cannot create {t} again: {e}"),
        }
    }
}

/// Whether the broker is fetched by topic id (Kafka 3.1 and later, Fetch v13).
fn fetches_by_topic_id() -> bool {
    let mut v = stack()
        .kafka_version
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    (major, minor) >= (3, 1)
}

/// The values `i` the dispatcher accepted, with how many runs each had.
fn accepted_values(d: &DevDispatcher) -> Vec<i64> {
    d.runs()
        .iter()
        .filter_map(|r| r.event["value"]["i"].as_i64())
        .collect()
}

/// Waits (at most `secs`) until every value of `want` was accepted by the dispatcher.
async fn wait_all_ran(d: &DevDispatcher, want: &BTreeSet<i64>, what: &str, secs: u64) {
    wait_for(what, Duration::from_secs(secs), || {
        let ran: BTreeSet<i64> = accepted_values(d).into_iter().collect();
        want.is_subset(&ran).then_some(())
    })
    .await;
}

/// A topic of one partition, its group, the dispatcher and the connector running, after
/// [`run_then_create_again`].
struct Recreated {
    topic: String,
    group: String,
    d: DevDispatcher,
    connector: Connector,
}

/// One partition, `old` records (`keys` keys) run and committed; then the topic is deleted and
/// created again, empty, while the connector keeps running.
async fn run_then_create_again(prefix: &str, old: usize, keys: usize) -> Recreated {
    let topic = unique(prefix);
    let group = unique(&format!("{prefix}-group"));
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, old, keys).await;
    let d = dispatcher(Faults::default()).await;
    let connector = Connector::start(&connection_toml(&group, &topic, &d.url(), ""));
    wait_for(
        "the old records run and are committed",
        Duration::from_secs(60),
        || (d.accepted() >= old && committed(&group, &topic, 1) == vec![old as i64]).then_some(()),
    )
    .await;
    delete_topic(&topic).await;
    create_again(&topic).await;
    Recreated {
        topic,
        group,
        d,
        connector,
    }
}

/// One partition, `old` records run and committed; the topic is deleted and created again,
/// and `new` records are written: every one of them runs, and the group's commit reaches the
/// new log's end.
async fn recreated_topic_runs_every_new_record(prefix: &str, old: usize, new: usize) {
    let Recreated {
        topic,
        group,
        d,
        connector,
    } = run_then_create_again(prefix, old, 10).await;
    produce_keyed(&topic, old, old + new, 10).await;
    let want: BTreeSet<i64> = (old as i64..(old + new) as i64).collect();
    wait_all_ran(
        &d,
        &want,
        "every record of the topic created again runs",
        120,
    )
    .await;
    wait_for(
        "the commit at the new log's end",
        Duration::from_secs(60),
        || (committed(&group, &topic, 1) == vec![new as i64]).then_some(()),
    )
    .await;
    connector.stop().await;
    let values = accepted_values(&d);
    let ran_new = values.iter().filter(|v| want.contains(v)).count();
    eprintln!(
        "recreated topic ({old} old, {new} new records): {} of {new} new records ran, {} runs of them",
        want.len(),
        ran_new
    );
    let old_runs = values.iter().filter(|v| **v < old as i64).count();
    assert_eq!(old_runs, old, "the old records ran once each");
    // From Kafka 3.1 librdkafka fetches by topic id: its first fetch after the recreation
    // fails, it reads the new id (and says so in a debug line the connector reads) before any
    // record of the new log arrives, so none runs under the old topic's key: each runs once.
    // Older brokers are fetched by name, and the new log is noticed when the deletion is.
    if fetches_by_topic_id() {
        assert_eq!(ran_new, new, "each new record ran once");
    }
}

#[tokio::test]
async fn a_topic_created_again_with_fewer_records_runs_every_new_one() {
    // The new log ends below the old position: librdkafka's fetch is out of range and it
    // resets the position to the beginning, within the same assignment.
    recreated_topic_runs_every_new_record("recreated-short", 1000, 500).await;
}

#[tokio::test]
async fn a_topic_created_again_with_more_records_runs_every_new_one() {
    // The new log is longer than the old position: the fetch goes on in range, and only the
    // topic's id tells the new log from the old.
    recreated_topic_runs_every_new_record("recreated-long", 300, 600).await;
}

/// A topic created again whose new log holds only an aborted transaction: no record of it
/// runs, and the group's commit still reaches the new log's end. librdkafka moves the
/// position past the aborted records and the marker without returning a message, and the
/// core trusts a position of the new log only after the none its seek leaves (found by
/// simulator seeds 106396, 149379, 154353 and 218392: the poll task now reads the positions
/// right after a seek, before a later poll can move them).
#[tokio::test]
async fn a_topic_created_again_with_only_an_aborted_transaction_is_committed_to_its_end() {
    let Recreated {
        topic,
        group,
        d,
        connector,
    } = run_then_create_again("recreated-aborted", 3, 3).await;
    let aborted: Vec<serde_json::Value> = (0..5)
        .map(|i| serde_json::json!({"key": format!("a{i}"), "value": {"i": 100 + i}}))
        .collect();
    let _ = super::reference_produce(serde_json::json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"},
        "value": {"format": "json"}, "steps": [{"txn": "abort", "records": aborted}]
    }))
    .await;
    // Five aborted records and the abort marker.
    let end = super::high_watermarks(&topic, 1);
    assert_eq!(end, vec![6]);
    wait_for(
        "the commit at the new log's end",
        Duration::from_secs(90),
        || (committed(&group, &topic, 1) == end).then_some(()),
    )
    .await;
    connector.stop().await;
    assert!(
        accepted_values(&d).iter().all(|v| *v < 3),
        "no aborted record ran: {:?}",
        accepted_values(&d)
    );
}

/// A partition holding the byte budget behind a parked key pauses alone: the other partition
/// drains completely, in bursts of small records with few keys (some of which wait for
/// their key), while the parked one holds more than half the budget.
#[tokio::test]
async fn a_parked_partition_does_not_hold_the_budget_against_the_others() {
    let topic = unique("budget");
    let group = unique("budget-group");
    create_topic(&topic, 2).await;
    // Partition 0: key "hot", answered 500 until told otherwise, with 3 KB records of the
    // same key waiting behind the first. The dispatcher fails every key of the hot records.
    let big = "x".repeat(3000);
    let hot: Vec<serde_json::Value> = (0..600)
        .map(|i| serde_json::json!({"key": "hot", "value": {"i": 100_000 + i, "pad": big}, "partition": 0}))
        .collect();
    let _ = super::reference_produce(serde_json::json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"}, "value": {"format": "json"},
        "steps": [{"txn": null, "records": hot}]
    }))
    .await;
    // Every record of the hot key is answered 500 until told otherwise (on_error = "block").
    let d = dispatcher(Faults {
        fail_keys: (0..600)
            .map(|o| super::record_key(&group, &topic, 0, o))
            .collect(),
        fail_status: 500,
        ..Faults::default()
    })
    .await;
    let extra = "concurrency = 8\n";
    let toml = connection_toml(&group, &topic, &d.url(), extra).replace(
        "drain_timeout_ms = 10000",
        "drain_timeout_ms = 10000\nmax_buffered_bytes = 1048576",
    );
    let connector = Connector::start(&toml);
    // Partition 1: bursts of small records with few keys.
    let mut sent = 0usize;
    for burst in 0..6 {
        let records: Vec<serde_json::Value> = (0..500)
            .map(|j| {
                let i = burst * 500 + j;
                serde_json::json!({"key": format!("k{}", i % 3), "value": {"i": i}, "partition": 1})
            })
            .collect();
        sent += records.len();
        let _ = super::reference_produce(serde_json::json!({
            "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"}, "value": {"format": "json"},
            "steps": [{"txn": null, "records": records}]
        }))
        .await;
    }
    wait_for(
        "every record of partition 1 runs while partition 0's key is parked",
        Duration::from_secs(60),
        || {
            let ran: BTreeSet<i64> = accepted_values(&d)
                .into_iter()
                .filter(|i| *i < 100_000)
                .collect();
            (ran.len() == sent).then_some(())
        },
    )
    .await;
    let parked_ran = accepted_values(&d)
        .iter()
        .filter(|i| **i >= 100_000)
        .count();
    assert_eq!(parked_ran, 0, "the parked key's records did not run");
    wait_for(
        "partition 1 committed to its end",
        Duration::from_secs(30),
        || (committed(&group, &topic, 2)[1] == sent as i64).then_some(()),
    )
    .await;
    eprintln!("budget: {sent} of {sent} partition-1 records ran while partition 0 was parked");
    connector.stop().await;
}

/// Commits `offset` of `topic`/0 for `group` with `metadata` as raw bytes, as a client that
/// is not Java can (rust-rdkafka writes only UTF-8 text).
#[allow(unsafe_code)]
fn commit_raw_metadata(group: &str, topic: &str, offset: i64, metadata: &[u8]) {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &stack().bootstrap)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Offset(offset))
        .expect("offset");
    // SAFETY: the list owns its one element; librdkafka frees the metadata with the list,
    // so it is allocated with the C allocator.
    unsafe {
        let list = &mut *tpl.ptr();
        let elem = &mut *list.elems;
        let buf = libc::malloc(metadata.len()).cast::<u8>();
        std::ptr::copy_nonoverlapping(metadata.as_ptr(), buf, metadata.len());
        elem.metadata = buf.cast();
        elem.metadata_size = metadata.len();
    }
    consumer.commit(&tpl, CommitMode::Sync).expect("commit");
}

/// Commit metadata that is not UTF-8 (whatever another client of the group wrote) is foreign:
/// ignored, and the partition runs from the committed offset. rust-rdkafka panics reading it
/// as text, in the assignment's callback, which used to end the poll task silently.
#[tokio::test]
async fn commit_metadata_that_is_not_utf8_is_ignored_and_the_partition_runs() {
    let topic = unique("non-utf8");
    let group = unique("non-utf8-group");
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 20, 4).await;
    commit_raw_metadata(&group, &topic, 5, &[0xff, 0xfe, b't', b'k', b'1', 0xc3]);
    let d = dispatcher(Faults::default()).await;
    let connector = Connector::start(&connection_toml(&group, &topic, &d.url(), ""));
    wait_for("records 5 to 19 run", Duration::from_secs(60), || {
        let ran: BTreeSet<i64> = accepted_values(&d).into_iter().collect();
        (ran == (5..20).collect()).then_some(())
    })
    .await;
    wait_for("the commit at the end", Duration::from_secs(30), || {
        (committed(&group, &topic, 1) == vec![20]).then_some(())
    })
    .await;
    connector.stop().await;
}

/// The topic's id, as the connector reads it (Kafka's text of it).
fn topic_id(topic: &str) -> String {
    let consumer: rdkafka::consumer::BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &stack().bootstrap)
        .create()
        .expect("consumer");
    let ids = tessel_kafka::consumer::topic_ids(
        rdkafka::consumer::Consumer::client(&consumer),
        &[topic.to_owned()],
        Duration::from_secs(10),
    )
    .expect("topic ids");
    ids.get(topic)
        .cloned()
        .flatten()
        .unwrap_or_else(|| panic!("the cluster gives {topic} no id: {ids:?}"))
}

/// 20 records, and the group's commit at 10 with `tk3` metadata naming `id` (the topic's own,
/// or an older topic's of the same name, as a commit decided for a topic before it was
/// deleted and created again would have). Returns the values run once the commit reached the
/// end, and the metadata it was committed with.
async fn commit_under_topic_id(prefix: &str, older: bool) -> (String, BTreeSet<i64>, String) {
    let topic = unique(prefix);
    let group = unique(&format!("{prefix}-group"));
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 20, 4).await;
    let own = topic_id(&topic);
    // Another 16-byte id in Kafka's text (URL-safe Base64, unpadded).
    let other = if own == "AAAAAAAAAAAAAAAAAAAAAQ" {
        "AAAAAAAAAAAAAAAAAAAAAg"
    } else {
        "AAAAAAAAAAAAAAAAAAAAAQ"
    };
    let named = if older { other.to_owned() } else { own.clone() };
    commit_raw_metadata(&group, &topic, 10, format!("tk3:{named}:10:").as_bytes());
    let d = dispatcher(Faults::default()).await;
    let connector = Connector::start(&connection_toml(&group, &topic, &d.url(), ""));
    let want: BTreeSet<i64> = (if older { 0 } else { 10 }..20).collect();
    wait_all_ran(&d, &want, "the records run", 60).await;
    let metadata = wait_for("the commit at the end", Duration::from_secs(30), || {
        let c = super::committed_with_metadata(&group, &topic, 1);
        (c[0].0 == 20).then(|| c[0].1.clone())
    })
    .await;
    connector.stop().await;
    let ran = accepted_values(&d).into_iter().collect();
    (own, ran, metadata)
}

/// A group commit whose metadata names another topic id than the topic's was made under an
/// older topic of the same name (deleted and created again; Kafka keeps a group's offsets by
/// name): its offset says nothing of this log, and every record of it runs, from where
/// `auto.offset.reset` says (the beginning). The connector's own commit then names the
/// topic's id.
#[tokio::test]
async fn a_commit_made_under_an_older_topic_id_runs_every_record_of_the_topic() {
    let (own, ran, metadata) = commit_under_topic_id("older-id", true).await;
    assert_eq!(ran, (0..20).collect::<BTreeSet<i64>>());
    assert_eq!(metadata, format!("tk3:{own}:20:"));
}

/// The converse: a commit naming the topic's own id is the topic's, and the records below
/// it do not run.
#[tokio::test]
async fn a_commit_made_under_the_topics_own_id_starts_at_the_committed_offset() {
    let (own, ran, metadata) = commit_under_topic_id("own-id", false).await;
    assert_eq!(ran, (10..20).collect::<BTreeSet<i64>>());
    assert_eq!(metadata, format!("tk3:{own}:20:"));
}

/// What reset a paused partition whose topic was deleted and created again.
enum PausedReset {
    /// The probe of paused partitions' log ends (reason `moved_back`), this long after the
    /// topic was created again.
    Probe(Duration),
    /// The topic-id check (reason `topic_recreated`), with no reset by the probe before it,
    /// this long after.
    IdCheck(Duration),
}

/// One partition: 10 records run and are committed, then the key "hot" is parked (the
/// dispatcher answers 500 for its first record, at offset 10) with 29 more of its records
/// behind it, which fill the partition's buffer of 4 and pause it. The topic is deleted and
/// created again, empty, while the partition waits; returns what reset the partition, and
/// with [`PausedReset::Probe`] writes 100 records to the new log (past the old position, 40),
/// releases the key and checks that every new record runs and the group's commit reaches the
/// new log's end.
async fn recreate_while_paused() -> PausedReset {
    let started = std::time::Instant::now();
    let topic = unique("recreated-paused");
    let group = unique("recreated-paused-group");
    create_topic(&topic, 1).await;
    let (ok, hot) = (10usize, 30usize);
    let records: Vec<serde_json::Value> = (0..ok + hot)
        .map(|i| {
            let key = if i < ok {
                format!("k{i}")
            } else {
                "hot".to_owned()
            };
            serde_json::json!({"key": key, "value": {"i": i}})
        })
        .collect();
    let _ = super::reference_produce(serde_json::json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"},
        "value": {"format": "json"}, "steps": [{"txn": null, "records": records}]
    }))
    .await;
    let parked = super::record_key(&group, &topic, 0, ok as i64);
    let d = dispatcher(Faults {
        fail_keys: [parked.clone()].into(),
        fail_status: 500,
        ..Faults::default()
    })
    .await;
    let toml = connection_toml(&group, &topic, &d.url(), "").replace(
        "drain_timeout_ms = 10000\n",
        "drain_timeout_ms = 10000\nmax_buffered_per_partition = 4\n",
    );
    // The daemon in a process of its own, for its metrics (the first connector of a test
    // process to serve them holds the process's recorder), its log kept for a failure.
    let daemon = super::LoggedDaemon::start("recreated-paused", &toml);
    let admin_port = daemon.admin_port;
    let log = daemon.log.display();
    wait_for(
        "the records before the parked key run and are committed",
        Duration::from_secs(60),
        || {
            let ran: BTreeSet<i64> = accepted_values(&d).into_iter().collect();
            (ran == (0..ok as i64).collect() && committed(&group, &topic, 1) == vec![ok as i64])
                .then_some(())
        },
    )
    .await;
    // The partition paused, and the key tried several times: librdkafka's fetch in flight
    // when the pause came has been answered (a fetch of the deleted topic would tell
    // librdkafka, and so the connector's topic-id check, before the probe could).
    let paused = wait_for_async(
        "the partition paused behind the parked key",
        Duration::from_secs(60),
        || async {
            let text = super::metrics_text(admin_port).await?;
            let paused = super::metric_sum(
                &text,
                "tessel_kafka_paused_partitions",
                &["connection=\"it\""],
            );
            (paused == 1.0 && d.attempts_for(&parked).len() >= 6).then_some(paused)
        },
    )
    .await;
    assert!(
        accepted_values(&d).iter().all(|i| *i < ok as i64),
        "no record of the parked key ran"
    );
    delete_topic(&topic).await;
    create_again(&topic).await;
    let recreated = std::time::Instant::now();
    let topic_label = format!("topic=\"{topic}\"");
    let resets = |text: &str, reason: &str| {
        super::metric_sum(
            text,
            "tessel_kafka_position_resets_total",
            &[&topic_label, &format!("reason=\"{reason}\"")],
        )
    };
    // The probe runs every 5 s; the topic-id check every 30 s from the assignment.
    let by = wait_for_async(
        &format!("a reset of the paused partition (log {log})"),
        Duration::from_secs(60),
        || async {
            let text = super::metrics_text(admin_port).await?;
            let after = recreated.elapsed();
            if resets(&text, "moved_back") >= 1.0 {
                Some(PausedReset::Probe(after))
            } else if resets(&text, "topic_recreated") >= 1.0 {
                Some(PausedReset::IdCheck(after))
            } else {
                None
            }
        },
    )
    .await;
    let PausedReset::Probe(after) = by else {
        return by;
    };
    // More records than the old log had: the old position (40) lies inside the new log,
    // where a fetch from it would go on in range past the new log's first 40 records.
    let new = 100usize;
    let records: Vec<serde_json::Value> = (0..new)
        .map(|i| serde_json::json!({"key": format!("k{}", i % 10), "value": {"i": 1000 + i}}))
        .collect();
    let _ = super::reference_produce(serde_json::json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"},
        "value": {"format": "json"}, "steps": [{"txn": null, "records": records}]
    }))
    .await;
    d.faults(|f| f.fail_keys.clear());
    let want: BTreeSet<i64> = (1000..1000 + new as i64).collect();
    wait_all_ran(
        &d,
        &want,
        &format!("every record of the new log runs (log {log})"),
        120,
    )
    .await;
    wait_for(
        &format!("the commit at the new log's end, {new} (log {log})"),
        Duration::from_secs(60),
        || (committed(&group, &topic, 1) == vec![new as i64]).then_some(()),
    )
    .await;
    let values = accepted_values(&d);
    let ran_new: BTreeSet<i64> = values
        .iter()
        .copied()
        .filter(|v| want.contains(v))
        .collect();
    eprintln!(
        "recreated while paused ({paused} partition paused, {} attempts of the parked key): \
         the probe reset the partition {:.1} s after the topic was created again; \
         {} of {new} new records ran ({} runs), commit at {new}; {:.1} s",
        d.attempts_for(&parked).len(),
        after.as_secs_f64(),
        ran_new.len(),
        values.iter().filter(|v| want.contains(v)).count(),
        started.elapsed().as_secs_f64()
    );
    PausedReset::Probe(after)
}

/// A topic deleted and created again while its partition waits behind a parked key. A
/// paused partition is not fetched, so librdkafka does not see the new log; the monitor's
/// probe of paused partitions' log ends (every 5 s) finds its end below what the partition
/// read, and the partition's bookkeeping starts again (an ERROR, reason `moved_back`),
/// within seconds, where the topic-id check would take up to 30 s. Every record of the new
/// log, written past the old position, runs, and the group's commit reaches its end.
///
/// Should the topic-id check see the new topic first (librdkafka learnt of the deletion
/// some other way before the probe ran, as it does from a fetch of the deleted topic), the
/// test says so and runs again on a new topic, up to three times. Without the probe's reset
/// (`Core::on_log_end` doing nothing) every attempt is reset by the topic-id check, 29-30 s
/// after the topic was created again, and the test fails. (The new records would still all
/// run then: on a cluster with topic ids, the id check catches a topic created again on its
/// own. Only the probe sees a log cut under the same id, after an unclean leader election,
/// which a one-broker stack cannot make.)
#[tokio::test]
async fn a_topic_created_again_while_its_partition_waits_behind_a_parked_key_runs_every_new_record()
{
    let mut id_checks = Vec::new();
    for _ in 0..3 {
        match recreate_while_paused().await {
            PausedReset::Probe(_) => return,
            PausedReset::IdCheck(after) => {
                eprintln!(
                    "recreated while paused: the topic-id check reset the partition {:.1} s \
                     after the topic was created again, and the probe had not; again",
                    after.as_secs_f64()
                );
                id_checks.push(after);
            }
        }
    }
    panic!(
        "the probe of paused partitions' ends never reset the partition of a topic created \
         again: the topic-id check did, {id_checks:?} after the topic was created again"
    );
}
