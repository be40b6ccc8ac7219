//! Topic patterns: a trigger topic starting with `^` subscribes with a regular expression, as
//! librdkafka and Kafka Connect's `topics.regex` do, and consumes every matching topic,
//! including one created while the daemon runs.

use std::time::Duration;

use super::{assert_all_once, create_topic, dispatcher, produce_keyed, wait_committed_to_end};
use crate::config_builder::TestConfig;
use crate::support::{stack, unique, wait_for, Connector};

#[tokio::test(flavor = "multi_thread")]
async fn a_pattern_consumes_every_matching_topic_including_one_created_later() {
    let prefix = unique("pattern");
    let first = format!("{prefix}.orders");
    let unmatched = format!("{prefix}-other");
    create_topic(&first, 2).await;
    create_topic(&unmatched, 1).await;
    let d = dispatcher(Default::default()).await;
    let group = unique("pattern-g");
    let pattern = format!("^{}\\..*", regex::escape(&prefix));
    // New topics are found on librdkafka's metadata refresh: once a second here.
    let toml = TestConfig::new(&stack().bootstrap, &group, &pattern, &d.url())
        .kafka("topic.metadata.refresh.interval.ms", "1000")
        .toml();
    let connector = Connector::start(&toml);
    produce_keyed(&first, 0, 30, 7).await;
    produce_keyed(&unmatched, 1000, 1010, 7).await;
    wait_for(
        "the matching topic's records",
        Duration::from_secs(60),
        || (d.runs().len() >= 30).then_some(()),
    )
    .await;

    let later = format!("{prefix}.refunds");
    create_topic(&later, 3).await;
    produce_keyed(&later, 30, 60, 7).await;
    wait_for("the later topic's records", Duration::from_secs(60), || {
        (d.runs().len() >= 60).then_some(())
    })
    .await;
    let _ = wait_committed_to_end(&group, &first, 2).await;
    let _ = wait_committed_to_end(&group, &later, 3).await;
    connector.stop().await;

    let topics: std::collections::BTreeSet<String> = d
        .runs()
        .iter()
        .map(|r| r.event["topic"].as_str().expect("topic").to_owned())
        .collect();
    assert_eq!(
        topics,
        [first, later].into_iter().collect(),
        "runs only from the topics the pattern matches"
    );
    assert_all_once(&d, 60);
}
