//! The daemon as users run it: SIGTERM drains and commits, a restart continues where it left
//! off, and nothing is dispatched twice or missed.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tessel_kafka::cli::dev_dispatcher::Faults;

use super::{
    assert_all_once, create_topic, dispatcher, produce_keyed, spawn_daemon, wait_committed_to_end,
};
use crate::support::{stack, temp_config, unique, wait_for};

async fn terminate(mut child: Child) {
    let pid = child.id().to_string();
    let status = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "daemon exits 0 after SIGTERM, got {status}"
    );
}

#[tokio::test]
async fn sigterm_and_restart_dispatch_every_message_exactly_once() {
    let topic = unique("restart");
    create_topic(&topic, 4).await;
    produce_keyed(&topic, 0, 2000, 100).await;
    let d = dispatcher(Faults {
        latency_ms: (0, 20),
        ..Faults::default()
    })
    .await;
    let group = unique("restart-group");
    let config = temp_config(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
[connections.it]
drain_timeout_ms = 10000
[connections.it.kafka]
"bootstrap.servers" = "{}"
"group.id" = "{group}"
[connections.it.triggers.main]
topics = ["{topic}"]
workflow = "wf"
concurrency = 16
dispatcher = {{ url = "{}" }}
"#,
        stack().bootstrap,
        d.url()
    ));
    let daemon = spawn_daemon(&config, Stdio::inherit());
    wait_for("300 runs before SIGTERM", Duration::from_secs(90), || {
        (d.accepted() >= 300).then_some(())
    })
    .await;
    terminate(daemon).await;
    let at_stop = d.accepted();
    assert!(
        at_stop < 2000,
        "the test wants runs in flight at SIGTERM; all {at_stop} were done"
    );
    produce_keyed(&topic, 2000, 2500, 100).await;
    let daemon = spawn_daemon(&config, Stdio::inherit());
    wait_for("2500 runs", Duration::from_secs(120), || {
        (d.accepted() >= 2500).then_some(())
    })
    .await;
    let _hwm = wait_committed_to_end(&group, &topic, 4).await;
    terminate(daemon).await;
    assert_eq!(d.accepted(), 2500, "every message once");
    assert_all_once(&d, 2500);
}
