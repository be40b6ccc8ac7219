//! Operator tools on the real broker: offsets show, offsets reset (refused while the group is
//! active), and dead-letter replay with the original idempotency keys.

use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};
use tessel_kafka::cli::dev_dispatcher::Faults;

use super::{
    committed, connection_toml, create_topic, dispatcher, high_watermarks, produce_keyed, Connector,
};
use crate::support::{binary, temp_config, unique, wait_for};

async fn cli(args: &[&str], config: &std::path::Path) -> Output {
    let mut cmd = Command::new(binary());
    cmd.args(args).arg("--config").arg(config);
    tokio::task::spawn_blocking(move || cmd.output().expect("run tessel-kafka"))
        .await
        .unwrap()
}

#[tokio::test]
async fn offsets_show_reset_and_dead_letter_replay_work_and_reset_waits_for_an_idle_group() {
    let topic = unique("tools");
    let dlq = unique("tools-dlq");
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    produce_keyed(&topic, 0, 5, 5).await;
    let group = unique("tools-group");
    let rejected = format!("kafka:{group}:{topic}:0:1");
    let d = dispatcher(Faults {
        scripted: HashMap::from([(rejected.clone(), vec![422])]),
        ..Faults::default()
    })
    .await;
    let toml = connection_toml(
        &group,
        &topic,
        &d.url(),
        &format!("on_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n"),
    );
    let config = temp_config(&toml);
    let connector = Connector::start(&toml);
    wait_for("4 runs and 1 dead letter", Duration::from_secs(60), || {
        (d.accepted() == 4 && high_watermarks(&dlq, 1) == [1]).then_some(())
    })
    .await;
    wait_for("commit at the end", Duration::from_secs(30), || {
        (committed(&group, &topic, 1) == [5]).then_some(())
    })
    .await;

    let shown = cli(&["offsets", "show", "--json"], &config).await;
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let rows: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(
        rows,
        json!([{"topic": topic, "partition": 0, "committed": 5, "low_watermark": 0, "high_watermark": 5, "lag": 0}])
    );

    let refused = cli(&["offsets", "reset", "--to", "earliest"], &config).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "reset must be refused while the connector runs"
    );
    assert!(stderr.contains("active member"), "{stderr}");
    assert_eq!(committed(&group, &topic, 1), vec![5]);

    connector.stop().await;
    let reset = wait_for_cli_success(&["offsets", "reset", "--to", "offset:2"], &config).await;
    assert_eq!(
        String::from_utf8_lossy(&reset.stdout).trim(),
        format!("{topic}\t0\t2")
    );
    assert_eq!(committed(&group, &topic, 1), vec![2]);

    let replay = cli(&["dlq", "replay", "--trigger", "main"], &config).await;
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert!(
        replay.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    assert_eq!(stdout.trim(), format!("0\t{rejected}\taccepted"));
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
    let refused = cli(&["offsets", "reset", "--to", "earliest"], &config).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "reset must be refused while the connector runs: {}{stderr}",
        String::from_utf8_lossy(&refused.stdout)
    );
    assert!(stderr.contains("active member"), "{stderr}");
    assert_eq!(committed(&group, &topic, 2), before, "nothing was reset");

    connector.stop().await;
    let _ = wait_for_cli_success(&["offsets", "reset", "--to", "earliest"], &config).await;
    assert_eq!(committed(&group, &topic, 2), vec![0, 0]);
}
