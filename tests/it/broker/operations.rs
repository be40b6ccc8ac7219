//! Operations: metrics an operator can trust, and logs that carry the message's coordinates
//! and no secret.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tessel_kafka::dev_dispatcher::Faults;

use super::sasl_ssl_kafka_table;
use super::{connection_toml, create_topic, dispatcher, produce_keyed, spawn_daemon};
use crate::support::{stack, temp_config, unique, wait_for, wait_for_async};

/// Sum of the samples of `name` whose labels contain every `labels` pair.
fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.starts_with(name)
                && (l.len() > name.len())
                && matches!(&l[name.len()..name.len() + 1], "{" | " ")
        })
        .filter(|l| labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn scrape(port: u16) -> Option<String> {
    reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()
}

#[tokio::test]
async fn metrics_show_lag_rising_and_draining_and_count_every_dispatch() {
    let topic = unique("metrics");
    create_topic(&topic, 2).await;
    let d = dispatcher(Faults {
        latency_ms: (5, 15),
        ..Faults::default()
    })
    .await;
    let port = crate::support::free_port();
    let toml = connection_toml(
        &unique("metrics-group"),
        &topic,
        &d.url(),
        "concurrency = 4",
    )
    .replace(
        "\"auto.offset.reset\" = \"earliest\"\n",
        "\"auto.offset.reset\" = \"earliest\"\n\"statistics.interval.ms\" = \"500\"\n",
    );
    let config = temp_config(&format!("[server]\nlisten = \"127.0.0.1:{port}\"\n{toml}"));
    let mut daemon = spawn_daemon(&config, Stdio::null());
    produce_keyed(&topic, 0, 3000, 50).await;
    let lag = |text: &str| {
        metric_sum(
            text,
            "tessel_kafka_consumer_lag_messages",
            &[&format!("topic=\"{topic}\"")],
        )
    };
    let peak = wait_for_async(
        "lag to rise with the backlog",
        Duration::from_secs(60),
        || async {
            let text = scrape(port).await?;
            let l = lag(&text);
            (l >= 500.0).then_some(l)
        },
    )
    .await;
    wait_for("3000 runs", Duration::from_secs(120), || {
        (d.accepted() == 3000).then_some(())
    })
    .await;
    let text = wait_for_async("lag back to 0", Duration::from_secs(60), || async {
        let text = scrape(port).await?;
        (lag(&text) == 0.0 && text.contains("tessel_kafka_consumer_lag_messages")).then_some(text)
    })
    .await;
    daemon.kill().unwrap();
    let _ = daemon.wait();
    eprintln!("peak lag observed: {peak}");
    let accepted = metric_sum(
        &text,
        "tessel_kafka_dispatch_attempts_total",
        &["outcome=\"accepted\""],
    );
    let attempts = metric_sum(&text, "tessel_kafka_dispatch_attempts_total", &[]);
    assert_eq!(
        accepted as u64,
        d.accepted() as u64,
        "accepted dispatches match the dispatcher's count"
    );
    assert_eq!(attempts as u64, d.attempts(), "every attempt counted");
    assert_eq!(
        metric_sum(
            &text,
            "tessel_kafka_messages_handled_total",
            &["outcome=\"accepted\""]
        ) as usize,
        3000
    );
    assert_eq!(
        metric_sum(&text, "tessel_kafka_messages_consumed_total", &[]) as usize,
        3000
    );
    for name in [
        "tessel_kafka_dispatch_duration_seconds_count",
        "tessel_kafka_end_to_end_latency_seconds_count",
        "tessel_kafka_offset_commits_total",
        "tessel_kafka_rebalances_total",
        "tessel_kafka_assigned_partitions",
        "tessel_kafka_brokers_up",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    assert!(!text.contains("offset=\""), "no offset label");
}

#[tokio::test]
async fn logs_carry_message_coordinates_and_no_secret() {
    let s = stack();
    let topic = unique("logs");
    create_topic(&topic, 1).await;
    let d = dispatcher(Faults {
        scripted: Default::default(),
        ..Faults::default()
    })
    .await;
    let token = format!("tok-{}", unique("secret"));
    let group = unique("logs-group");
    let kafka = sasl_ssl_kafka_table(&s.admin_user, &s.admin_password, &group);
    let config = temp_config(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
[log]
format = "json"
level = "info,tessel_kafka=debug"
{kafka}[connections.it.triggers.main]
topics = ["{topic}"]
workflow = "wf"
dispatcher = {{ url = "{}", token = "{token}" }}
"#,
        d.url()
    ));
    let log = std::env::temp_dir().join(format!("{}.log", unique("logs")));
    let mut daemon = spawn_daemon(&config, std::fs::File::create(&log).unwrap().into());
    produce_keyed(&topic, 0, 3, 3).await;
    wait_for("3 runs", Duration::from_secs(60), || {
        (d.accepted() == 3).then_some(())
    })
    .await;
    assert_eq!(
        d.runs()[0].authorization.as_deref(),
        Some(format!("Bearer {token}").as_str())
    );
    daemon.kill().unwrap();
    let _ = daemon.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    for secret in [s.admin_password.as_str(), token.as_str()] {
        assert!(!text.contains(secret), "a secret reached the log");
    }
    let accepted: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == "run accepted")
        .collect();
    assert_eq!(accepted.len(), 3, "{text}");
    for line in accepted {
        assert_eq!(line["connection"], "it");
        assert_eq!(line["topic"], topic.as_str());
        assert_eq!(line["partition"], 0);
        assert!(line["offset"].is_i64(), "{line}");
    }
}
