//! The handover wedge (issue 27): a key parked by a failing dispatcher while later records of
//! its partition run fills the gap bound, the partition pauses, and the member hands the
//! partition over in an orderly stop. The next owner loads the handled offsets from the
//! commit metadata, so its gap is full before it has started anything: it must still start
//! the record at the gap, and then drain the rest, each record once.

use std::time::Duration;

use tessel_kafka::cli::dev_dispatcher::Faults;
use tessel_kafka::core::offsets::MAX_TRACKED_ABOVE;

use super::{
    assert_all_once, committed_with_metadata, create_topic, dispatcher, produce_keyed,
    wait_committed_to_end,
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
    let parked = format!("kafka:{group}:{topic}:0:0");
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
            (c[0].0 == 0 && c[0].1.starts_with("tk1:0:")).then_some(())
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
