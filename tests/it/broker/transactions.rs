//! read_committed: aborted transactions never start a run, and control records and aborted
//! ranges do not stop the committed offset from reaching the end of each partition.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use super::{
    committed, connection_toml, create_topic, dispatcher, reference_produce, wait_committed_to_end,
    Connector,
};
use crate::support::{stack, unique, wait_for};

fn rec(value: &str, partition: i32) -> Value {
    json!({"key": format!("key-{value}"), "value": {"v": value}, "partition": partition})
}

#[tokio::test]
async fn only_committed_messages_start_runs_and_commits_reach_the_end() {
    let topic = unique("txn");
    create_topic(&topic, 2).await;
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "topic": topic,
        "key": {"format": "string"}, "value": {"format": "json"},
        "steps": [
            {"txn": "commit", "records": [rec("c1", 0), rec("c2", 0)]},
            {"txn": "abort", "records": [rec("a1", 0), rec("a2", 0)]},
            {"txn": "commit", "records": [rec("c3", 0)]},
            {"txn": null, "records": [rec("n1", 0), rec("n2", 1)]},
            {"txn": "commit", "records": [rec("c4", 0), rec("c5", 1)]},
            {"txn": "abort", "records": [rec("a3", 0), rec("a4", 1)]},
            {"txn": null, "records": [rec("n3", 1)]},
            {"txn": "abort", "records": [rec("a5", 1)]}
        ]
    }))
    .await;
    let d = dispatcher(Default::default()).await;
    let group = unique("txn-group");
    let connector = Connector::start(&connection_toml(&group, &topic, &d.url(), ""));
    let expected: BTreeSet<String> = ["c1", "c2", "c3", "n1", "n2", "c4", "c5", "n3"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    wait_for(
        "8 committed or plain messages dispatched",
        Duration::from_secs(60),
        || (d.accepted() >= expected.len()).then_some(()),
    )
    .await;
    let hwm = wait_committed_to_end(&group, &topic, 2).await;
    connector.stop().await;
    let got: BTreeSet<String> = d
        .runs()
        .iter()
        .map(|r| r.event["value"]["v"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, expected, "aborted records must never start a run");
    assert_eq!(d.accepted(), expected.len());
    assert_eq!(committed(&group, &topic, 2), hwm);
}

/// Issue 13: a fresh assignment whose committed offset is followed only by an aborted
/// transaction and its marker still commits to the end of the partition (lag 0), though no
/// message of the assignment ever arrives.
#[tokio::test]
async fn a_commit_followed_only_by_an_aborted_transaction_reaches_the_end_after_a_restart() {
    let topic = unique("txn-tail");
    create_topic(&topic, 1).await;
    let produce = |steps: Value| {
        let topic = topic.clone();
        async move {
            let _ = reference_produce(json!({
                "bootstrap": stack().bootstrap, "topic": topic,
                "key": {"format": "string"}, "value": {"format": "json"},
                "steps": steps
            }))
            .await;
        }
    };
    produce(json!([{"txn": "commit", "records": [rec("c1", 0), rec("c2", 0)]}])).await;
    let d = dispatcher(Default::default()).await;
    let group = unique("txn-tail-group");
    let toml = connection_toml(&group, &topic, &d.url(), "");
    let first = Connector::start(&toml);
    let after_commit = wait_committed_to_end(&group, &topic, 1).await;
    first.stop().await;
    // Only an aborted transaction follows the group's commit.
    produce(json!([{"txn": "abort", "records": [rec("a1", 0), rec("a2", 0)]}])).await;
    let second = Connector::start(&toml);
    let end = wait_committed_to_end(&group, &topic, 1).await;
    second.stop().await;
    assert!(
        end[0] > after_commit[0],
        "the end moved past the aborted records: {end:?}"
    );
    assert_eq!(d.accepted(), 2, "the aborted records started no run");
}
