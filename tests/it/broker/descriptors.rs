//! Descriptors bounded by work (issue 36): a daemon whose open-files limit cannot hold a
//! socket per run in flight says so and waits for the sockets it has, rather than retrying
//! into "Too many open files".

use std::process::Stdio;
use std::time::Duration;

use tessel_kafka::cli::dev_dispatcher::Faults;

use super::{connection_toml, create_topic, daemon_config, dispatcher, produce_keyed};
use crate::support::{free_port, unique, wait_for, wait_for_async};

/// The daemon runs under a hard limit of 48 descriptors (about 26 held by one idle
/// connection), with 64 runs wanted in flight against a slow dispatcher: the dispatcher pool
/// shrinks to the sockets it could open, every record is dispatched once, and the attempts
/// that failed for lack of descriptors stay far below a retry storm (before the pool shrank
/// to what it held, it shrank one slot per failure and 944 attempts failed).
#[tokio::test]
async fn short_of_descriptors_the_daemon_waits_for_sockets_instead_of_retrying() {
    let topic = unique("fds");
    create_topic(&topic, 1).await;
    produce_keyed(&topic, 0, 192, 192).await;
    let d = dispatcher(Faults {
        latency_ms: (200, 300),
        ..Faults::default()
    })
    .await;
    let group = unique("fds-group");
    let port = free_port();
    // Four idle connections kept once the drain is over, so the admin server has descriptors
    // left to answer the scrape below.
    let config = daemon_config(
        port,
        &format!(
            "[dispatch]\nmax_idle_per_origin = 4\n{}",
            connection_toml(
                &group,
                &topic,
                &d.url(),
                "concurrency = 64\nordering = \"unordered\"",
            )
        ),
    );
    let mut daemon = std::process::Command::new("prlimit")
        .arg("--nofile=48:48")
        .arg("--")
        .arg(crate::support::binary())
        .args(["run", "--config"])
        .arg(&config)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(config.with_extension("log")).expect("log"),
        ))
        .spawn()
        .expect("prlimit (util-linux) runs the daemon");
    wait_for("every record dispatched", Duration::from_secs(120), || {
        (d.accepted() >= 192).then_some(())
    })
    .await;
    let metrics = wait_for_async("the metrics", Duration::from_secs(10), || {
        super::metrics_text(port)
    })
    .await;
    let _ = daemon.kill();
    let _ = daemon.wait();
    eprintln!("daemon log: {}", config.with_extension("log").display());
    assert_eq!(
        super::metric_sum(&metrics, "tessel_kafka_open_fds_limit", &[]),
        48.0
    );
    let exhausted = super::metric_sum(&metrics, "tessel_kafka_fds_exhausted_total", &[]);
    let failed = super::metric_sum(
        &metrics,
        "tessel_kafka_dispatch_attempts_total",
        &["outcome=\"retryable\""],
    );
    eprintln!(
        "48 descriptors, 64 runs wanted in flight: {exhausted} connections could not be \
         opened, {failed} attempts retried, {} records dispatched once",
        d.accepted()
    );
    assert!(exhausted >= 1.0, "the limit was reached:\n{metrics}");
    // The pool shrinks at the first failure and grows back a slot a second: a few failures,
    // where a storm is hundreds.
    assert!(failed <= 16.0, "{failed} attempts failed");
    assert_eq!(d.repeats(), 0);
}
