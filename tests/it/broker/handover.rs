//! The handover wedge (issue 27): a key parked by a failing dispatcher while later records of
//! its partition run fills the gap bound, the partition pauses, and the member hands the
//! partition over in an orderly stop. The next owner loads the handled offsets from the
//! commit metadata, so its gap is full before it has started anything: it must still start
//! the record at the gap, and then drain the rest, each record once.

use std::time::Duration;

use tessel_kafka::cli::dev_dispatcher::Faults;
use tessel_kafka::core::offsets::{parse_metadata, MAX_TRACKED_ABOVE};

use super::{
    assert_all_once, committed_with_metadata, create_topic, dispatcher, high_watermarks,
    produce_keyed, wait_committed_to_end,
};
use crate::config_builder::TestConfig;
use crate::support::{stack, unique, wait_for, Connector};

#[tokio::test(flavor = "multi_thread")]
async fn a_new_owner_of_a_full_gap_drains_the_partition_once_the_dispatcher_recovers() {
    let topic = unique("handover");
    let group = unique("handover-g");
    create_topic(&topic, 1).await;
    let total = MAX_TRACKED_ABOVE + 2_000;
    // Every record its own key: offset 0 is the one the dispatcher refuses.
    produce_keyed(&topic, 0, total, total).await;
    let parked = super::record_key(&group, &topic, 0, 0);
    let d = dispatcher(Faults {
        fail_keys: [parked.clone()].into(),
        fail_status: 500,
        ..Faults::default()
    })
    .await;
    // The default `on_error = "block"` with unlimited retries.
    let toml = TestConfig::new(&stack().bootstrap, &group, &topic, &d.url())
        .trigger("concurrency", "64")
        .toml();

    let first = Connector::start(&toml);
    wait_for(
        "the gap bound reached behind the parked key",
        Duration::from_secs(120),
        || (d.accepted() >= MAX_TRACKED_ABOVE).then_some(()),
    )
    .await;
    // The gap's handled offsets travel in the commit metadata.
    wait_for(
        "the handled offsets committed as metadata",
        Duration::from_secs(30),
        || {
            let c = committed_with_metadata(&group, &topic, 1);
            // `tk3:<topic id>:0:<runs>` (`tk2:0:<runs>` on a cluster without topic ids).
            (c[0].0 == 0 && !parse_metadata(0, &c[0].1).is_empty()).then_some(())
        },
    )
    .await;
    first.stop().await;
    let accepted_before = d.accepted();
    assert!(
        accepted_before < total,
        "the partition paused at the gap bound: {accepted_before} of {total} ran"
    );
    assert_eq!(committed_with_metadata(&group, &topic, 1)[0].0, 0);

    // The dispatcher recovers; the next owner takes the partition with the full gap.
    d.faults(|f| f.fail_keys.clear());
    let second = Connector::start(&toml);
    wait_for(
        "every record accepted by the next owner",
        Duration::from_secs(90),
        || (d.accepted() >= total).then_some(()),
    )
    .await;
    let ends = wait_committed_to_end(&group, &topic, 1).await;
    second.stop().await;
    assert_eq!(ends, vec![total as i64]);
    assert_all_once(&d, total);
}

/// Issue 34, defect 3: a topic written one record per transaction (each commit marker takes
/// an offset), a record parked at offset 0, the 4,000 records after it accepted, then an
/// orderly stop and a new owner. The markers count as handled in the commit metadata, so the
/// map stays a few bytes and the new owner repeats none of the 4,000: at most the runs in
/// flight at the stop, and the only one then was the parked record's, never accepted. (The
/// `tk1` map of `eae395c` was full at 2,048 bytes: its new owner ran 3,481 of them again.)
#[tokio::test(flavor = "multi_thread")]
async fn an_orderly_handover_on_a_topic_of_one_record_per_transaction_repeats_nothing_accepted() {
    const LATER: usize = 4_000;
    let topic = unique("txn-handover");
    let group = unique("txn-handover-g");
    create_topic(&topic, 1).await;
    // Offset 0 is the parked record, in a transaction of its own; then 4,000 transactions of
    // one record each, from 32 producers at once (each commit takes an offset of its own).
    let started = std::time::Instant::now();
    produce_one_per_transaction(&topic, 0..1, 1).await;
    produce_one_per_transaction(&topic, 1..LATER + 1, 32).await;
    eprintln!(
        "one record per transaction: written in {:?}",
        started.elapsed()
    );
    let end = high_watermarks(&topic, 1)[0];
    assert!(
        end >= 2 * (LATER as i64 + 1),
        "a marker after each record: end {end}"
    );
    let parked = super::record_key(&group, &topic, 0, 0);
    let d = dispatcher(Faults {
        fail_keys: [parked].into(),
        fail_status: 500,
        ..Faults::default()
    })
    .await;
    // The default `on_error = "block"` with unlimited retries; a short drain, since the
    // parked record's run only ends by it.
    let toml = TestConfig::new(&stack().bootstrap, &group, &topic, &d.url())
        .trigger("concurrency", "64")
        .connection("drain_timeout_ms", "2000")
        .toml();

    let first = Connector::start(&toml);
    wait_for(
        "the 4,000 records after the parked one accepted",
        Duration::from_secs(120),
        || (d.accepted() >= LATER).then_some(()),
    )
    .await;
    // The group's commit stays at the parked record, its metadata naming every record
    // accepted above it.
    let (offset, metadata) = wait_for(
        "the accepted records committed as metadata",
        Duration::from_secs(30),
        || {
            let (offset, metadata) = committed_with_metadata(&group, &topic, 1).remove(0);
            let map = parse_metadata(offset, &metadata);
            let covered = d.runs().iter().all(|r| {
                let o = r.event["offset"].as_i64().expect("offset");
                o < offset || map.contains(o)
            });
            (offset == 0 && covered).then_some((offset, metadata))
        },
    )
    .await;
    eprintln!(
        "one record per transaction: accepted and committed at {:?}",
        started.elapsed()
    );
    // What the stop may repeat: the runs in flight then (only the parked record's).
    let in_flight = d.in_flight();
    first.stop().await;
    assert_eq!(d.repeats(), 0);
    eprintln!(
        "one record per transaction: {LATER} records accepted above offset {offset}, commit \
         metadata {} characters ({metadata:?}); {in_flight} requests in flight at the stop",
        metadata.len()
    );
    assert!(metadata.len() < 64, "{metadata}");

    // The dispatcher recovers; the next owner runs the parked record, and nothing again.
    d.faults(|f| f.fail_keys.clear());
    let second = Connector::start(&toml);
    wait_for(
        "the parked record accepted by the next owner",
        Duration::from_secs(60),
        || (d.accepted() > LATER).then_some(()),
    )
    .await;
    let ends = wait_committed_to_end(&group, &topic, 1).await;
    second.stop().await;
    eprintln!(
        "one record per transaction: done at {:?}",
        started.elapsed()
    );
    assert_eq!(ends, vec![end]);
    eprintln!(
        "one record per transaction: the next owner repeated {} of the {LATER} accepted runs",
        d.repeats()
    );
    assert_all_once(&d, LATER + 1);
}

/// Writes records `{"i": i}` for `values` to partition 0 of `topic`, each in a transaction of
/// its own, from `producers` transactional producers at once (value i from producer
/// i mod `producers`).
async fn produce_one_per_transaction(
    topic: &str,
    values: std::ops::Range<usize>,
    producers: usize,
) {
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        std::thread::scope(|s| {
            for p in 0..producers {
                let (topic, values) = (&topic, values.clone());
                let _ = s.spawn(move || {
                    let producer: BaseProducer = ClientConfig::new()
                        .set("bootstrap.servers", &stack().bootstrap)
                        .set("transactional.id", format!("{topic}-{}-{p}", values.start))
                        .set("linger.ms", "0")
                        .create()
                        .expect("transactional producer");
                    let timeout = Duration::from_secs(30);
                    producer
                        .init_transactions(timeout)
                        .expect("init_transactions");
                    for i in values.skip(p).step_by(producers) {
                        producer.begin_transaction().expect("begin_transaction");
                        let (key, value) = (format!("k{i}"), format!("{{\"i\":{i}}}"));
                        producer
                            .send(BaseRecord::to(topic).partition(0).key(&key).payload(&value))
                            .map_err(|(e, _)| e)
                            .expect("send");
                        producer
                            .commit_transaction(timeout)
                            .expect("commit_transaction");
                    }
                });
            }
        });
    })
    .await
    .expect("producers");
}
