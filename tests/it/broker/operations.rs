//! Operations: metrics an operator can trust, and logs that carry the message's coordinates
//! and no secret.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tessel_kafka::cli::dev_dispatcher::Faults;

use super::sasl_ssl_kafka_table;
use super::{connection_toml, create_topic, dispatcher, produce_keyed, spawn_daemon};
use crate::support::{stack, temp_config, unique, wait_for, wait_for_async};

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
        super::metric_sum(
            text,
            "tessel_kafka_consumer_lag_messages",
            &[&format!("topic=\"{topic}\"")],
        )
    };
    let peak = wait_for_async(
        "lag to rise with the backlog",
        Duration::from_secs(60),
        || async {
            let text = super::metrics_text(port).await?;
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
        let text = super::metrics_text(port).await?;
        (lag(&text) == 0.0 && text.contains("tessel_kafka_consumer_lag_messages")).then_some(text)
    })
    .await;
    daemon.kill().unwrap();
    let _ = daemon.wait();
    eprintln!("peak lag observed: {peak}");
    let accepted = super::metric_sum(
        &text,
        "tessel_kafka_dispatch_attempts_total",
        &["outcome=\"accepted\""],
    );
    let attempts = super::metric_sum(&text, "tessel_kafka_dispatch_attempts_total", &[]);
    assert_eq!(
        accepted as u64,
        d.accepted() as u64,
        "accepted dispatches match the dispatcher's count"
    );
    assert_eq!(attempts as u64, d.attempts(), "every attempt counted");
    assert_eq!(
        super::metric_sum(
            &text,
            "tessel_kafka_messages_handled_total",
            &["outcome=\"accepted\""]
        ) as usize,
        3000
    );
    assert_eq!(
        super::metric_sum(&text, "tessel_kafka_messages_consumed_total", &[]) as usize,
        3000
    );
    // Every attempt is one dispatch latency observation, every acceptance one end-to-end one,
    // each in a bucket (a histogram, not a summary).
    let trigger = ["trigger=\"main\""];
    for (series, want) in [
        ("tessel_kafka_dispatch_duration_seconds_count", attempts),
        ("tessel_kafka_dispatch_duration_seconds_bucket", attempts),
        ("tessel_kafka_end_to_end_latency_seconds_count", 3000.0),
        ("tessel_kafka_end_to_end_latency_seconds_bucket", 3000.0),
    ] {
        let labels: Vec<&str> = if series.ends_with("_bucket") {
            vec![trigger[0], "le=\"+Inf\""]
        } else {
            trigger.to_vec()
        };
        assert_eq!(super::metric_sum(&text, series, &labels), want, "{series}");
    }
    assert!(
        super::metric_sum(
            &text,
            "tessel_kafka_dispatch_duration_seconds_bucket",
            &[trigger[0], "le=\"0.005\""]
        ) < attempts,
        "the dispatcher's 5-15 ms latency is above the lowest bucket"
    );
    assert!(
        super::metric_sum(
            &text,
            "tessel_kafka_offset_commits_total",
            &["result=\"ok\""]
        ) >= 1.0
    );
    assert!(super::metric_sum(&text, "tessel_kafka_rebalances_total", &["kind=\"assign\""]) >= 1.0);
    assert_eq!(
        super::metric_sum(&text, "tessel_kafka_assigned_partitions", &[]),
        2.0
    );
    assert_eq!(
        super::metric_sum(&text, "tessel_kafka_brokers_up", &[]),
        1.0
    );
    assert_eq!(
        super::metric_sum(
            &text,
            "tessel_kafka_build_info",
            &[concat!("version=\"", env!("CARGO_PKG_VERSION"), "\"")]
        ),
        1.0
    );
    assert_eq!(
        super::metric_sum(
            &text,
            "tessel_kafka_registry_cache_lookups_total",
            &["connection=\"it\""]
        ),
        super::metric_sum(&text, "tessel_kafka_registry_cache_lookups_total", &[]),
        "registry metrics name their connection"
    );
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = line.split(' ').nth(2).unwrap_or_default();
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} has no HELP text"
        );
        assert!(!line.ends_with(" summary"), "{line}");
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
    // The dispatcher counts a run when it answers; the daemon logs the acceptance only after
    // it reads that answer, so the log is polled for the three lines before the kill.
    let accepted_lines = |text: &str| -> Vec<Value> {
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["message"] == "run accepted")
            .collect()
    };
    wait_for("3 run-accepted log lines", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (accepted_lines(&text).len() >= 3).then_some(())
    })
    .await;
    daemon.kill().unwrap();
    let _ = daemon.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    for secret in [s.admin_password.as_str(), token.as_str()] {
        assert!(!text.contains(secret), "a secret reached the log");
    }
    let accepted = accepted_lines(&text);
    assert_eq!(accepted.len(), 3, "{text}");
    for line in accepted {
        assert_eq!(line["connection"], "it");
        assert_eq!(line["topic"], topic.as_str());
        assert_eq!(line["partition"], 0);
        assert!(line["offset"].is_i64(), "{line}");
    }
}

/// The lag series of `topic` in a scrape: partition to value.
fn lag_by_partition(text: &str, topic: &str) -> std::collections::BTreeMap<i32, i64> {
    let prefix = "tessel_kafka_consumer_lag_messages{";
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter(|l| l.contains(&format!("topic=\"{topic}\"")))
        .filter_map(|l| {
            let partition = l.split("partition=\"").nth(1)?.split('"').next()?;
            let value = l.rsplit(' ').next()?;
            Some((partition.parse().ok()?, value.parse::<f64>().ok()? as i64))
        })
        .collect()
}

/// A group stuck on its first records (the dispatcher refuses everything, so no run is ever
/// accepted) shows its whole backlog as lag; when a second replica joins, each replica reports
/// only the partition it still owns (the revoked partition's series is gone, not stale).
/// Lag before the group's first commit is covered by `kafka::context`'s unit tests: the
/// connector commits the first received offset within milliseconds, so a live group is
/// hardly ever seen without one.
#[tokio::test]
async fn lag_of_a_stuck_group_is_its_backlog_and_follows_the_assignment() {
    let topic = unique("lag-owner");
    create_topic(&topic, 2).await;
    let d = dispatcher(Faults {
        fail_all: Some(503),
        ..Faults::default()
    })
    .await;
    let group = unique("lag-owner-group");
    let toml = connection_toml(&group, &topic, &d.url(), "concurrency = 2").replace(
        "\"auto.offset.reset\" = \"earliest\"\n",
        "\"auto.offset.reset\" = \"earliest\"\n\"statistics.interval.ms\" = \"500\"\n",
    );
    produce_keyed(&topic, 0, 40, 8).await;
    let ends = super::high_watermarks(&topic, 2);
    let want: std::collections::BTreeMap<i32, i64> =
        (0..2).map(|p| (p, ends[p as usize])).collect();
    let ports = [crate::support::free_port(), crate::support::free_port()];
    let config =
        |port: u16| temp_config(&format!("[server]\nlisten = \"127.0.0.1:{port}\"\n{toml}"));
    let mut first = spawn_daemon(&config(ports[0]), Stdio::null());
    wait_for_async(
        "lag of both partitions, nothing committed",
        Duration::from_secs(60),
        || async {
            let got = lag_by_partition(&super::metrics_text(ports[0]).await?, &topic);
            (got == want).then_some(())
        },
    )
    .await;
    let mut second = spawn_daemon(&config(ports[1]), Stdio::null());
    let (a, b) = wait_for_async(
        "each replica reports the partition it owns",
        Duration::from_secs(90),
        || async {
            let a = lag_by_partition(&super::metrics_text(ports[0]).await?, &topic);
            let b = lag_by_partition(&super::metrics_text(ports[1]).await?, &topic);
            (a.len() == 1 && b.len() == 1).then_some((a, b))
        },
    )
    .await;
    for daemon in [&mut first, &mut second] {
        daemon.kill().unwrap();
        let _ = daemon.wait();
    }
    let mut both = a.clone();
    both.extend(b.clone());
    assert_eq!(both, want, "first {a:?}, second {b:?}");
}

/// A stand-in OpenTelemetry collector: records every OTLP/HTTP JSON trace export.
async fn fake_collector() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::routing::post;
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let sink = std::sync::Arc::clone(&got);
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let sink = std::sync::Arc::clone(&sink);
            async move {
                if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                    sink.lock().unwrap().push(v);
                }
                axum::Json(serde_json::json!({}))
            }
        }),
    );
    let port = crate::support::serve_on_own_thread(app).port();
    (port, got)
}

/// Whether `span` is the step `name` (`consume` spans are named `process <topic>`).
fn span_is(span: &Value, name: &str) -> bool {
    span["name"]
        .as_str()
        .is_some_and(|x| x == name || (name == "consume" && x.starts_with("process ")))
}

/// Every span in the exports received so far.
fn spans(exports: &[Value]) -> Vec<Value> {
    exports
        .iter()
        .flat_map(|e| e["resourceSpans"].as_array().cloned().unwrap_or_default())
        .flat_map(|rs| rs["scopeSpans"].as_array().cloned().unwrap_or_default())
        .flat_map(|ss| ss["spans"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn attribute(span: &Value, key: &str) -> Option<Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| a["value"].clone())
}

/// The traces of the two records [`produce_traced`] writes, and their producer's span.
const TRACE_IDS: [&str; 2] = [
    "0af7651916cd43dd8448eb211c80319c",
    "4bf92f3577b34da6a3ce929d0e0e4736",
];
const PRODUCER_SPAN: &str = "b7ad6b7169203331";

/// Writes two JSON records to `topic` (keys `k0`, `k1`), each with a `traceparent` of one of
/// [`TRACE_IDS`] under [`PRODUCER_SPAN`].
async fn produce_traced(topic: &str) {
    let records: Vec<Value> = TRACE_IDS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            serde_json::json!({"key": format!("k{i}"), "value": {"i": i},
                "headers": [["traceparent", format!("00-{t}-{PRODUCER_SPAN}-01")]]})
        })
        .collect();
    super::reference_produce(serde_json::json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"},
        "value": {"format": "json"}, "steps": [{"txn": null, "records": records}]
    }))
    .await;
}

/// A config file exporting spans as OTLP JSON to the fake collector on `collector`, with
/// `connection` (its TOML).
fn otlp_config(collector: u16, connection: &str) -> std::path::PathBuf {
    temp_config(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[otlp]\nendpoint = \"http://127.0.0.1:{collector}\"\nprotocol = \"http_json\"\nexport_interval_ms = 200\nservice_name = \"tessel-kafka-it\"\n{connection}"
    ))
}

/// With `[otlp]`, each message is a trace continuing its traceparent: `consume` is a child of
/// the producer's span, `decode`, `dispatch` and `commit` are children of `consume`, and the
/// dispatcher receives the `dispatch` span as its traceparent.
#[tokio::test]
async fn traces_continue_the_message_traceparent_over_otlp() {
    let topic = unique("otlp");
    create_topic(&topic, 1).await;
    let d = dispatcher(Faults::default()).await;
    let (collector, exports) = fake_collector().await;
    let group = unique("otlp-group");
    let config = otlp_config(
        collector,
        &connection_toml(&group, &topic, &d.url(), "value_format = \"json\""),
    );
    let (trace_ids, parent) = (TRACE_IDS, PRODUCER_SPAN);
    produce_traced(&topic).await;
    let mut daemon = spawn_daemon(&config, Stdio::null());
    let all = wait_for(
        "consume, decode, dispatch and commit spans of both messages",
        Duration::from_secs(60),
        || {
            let all = spans(&exports.lock().unwrap());
            let complete = trace_ids.iter().all(|t| {
                ["consume", "decode", "dispatch", "commit"]
                    .iter()
                    .all(|n| all.iter().any(|s| s["traceId"] == *t && span_is(s, n)))
            });
            complete.then_some(all)
        },
    )
    .await;
    let _ = daemon.kill();
    let _ = daemon.wait();
    for t in trace_ids {
        let of_trace: Vec<&Value> = all.iter().filter(|s| s["traceId"] == t).collect();
        let consume = of_trace
            .iter()
            .find(|s| s["name"] == format!("process {topic}"))
            .expect("the consume span, named after the topic");
        assert_eq!(
            consume["parentSpanId"], parent,
            "continues the producer's span"
        );
        assert_eq!(
            attribute(consume, "messaging.system"),
            Some(serde_json::json!({"stringValue": "kafka"}))
        );
        assert_eq!(
            attribute(consume, "messaging.destination.name"),
            Some(serde_json::json!({"stringValue": topic}))
        );
        for child in ["decode", "dispatch", "commit"] {
            let s = of_trace.iter().find(|s| s["name"] == child).unwrap();
            assert_eq!(
                s["parentSpanId"], consume["spanId"],
                "{child} under consume"
            );
        }
        let dispatch = of_trace.iter().find(|s| s["name"] == "dispatch").unwrap();
        assert_eq!(
            attribute(dispatch, "tessel.attempt").map(|v| v["intValue"].clone()),
            Some(serde_json::json!("1")),
            "the attempt, an integer"
        );
        let sent = d
            .runs()
            .iter()
            .filter_map(|r| r.traceparent.clone())
            .find(|tp| tp.contains(t))
            .expect("the dispatcher got the trace");
        assert_eq!(
            sent,
            format!("00-{t}-{}-01", dispatch["spanId"].as_str().unwrap()),
            "the run continues the dispatch span"
        );
    }
}

/// An integer attribute, as the OTLP JSON encoding writes it (a number or a string).
fn int_attribute(span: &Value, key: &str) -> Option<i64> {
    let v = attribute(span, key)?;
    let v = &v["intValue"];
    v.as_i64().or_else(|| v.as_str()?.parse().ok())
}

/// With `[otlp]`, a batch trigger's batch is one `consume` span linked to the trace of each of
/// its records, its request a `dispatch` child of that span, and the run continues the
/// `dispatch` span's trace (a run cannot be the child of several traces).
#[tokio::test]
async fn a_batch_is_one_span_linked_to_each_record_trace_over_otlp() {
    let topic = unique("otlp-batch");
    create_topic(&topic, 1).await;
    let d = dispatcher(Faults::default()).await;
    let (collector, exports) = fake_collector().await;
    let group = unique("otlp-batch-group");
    let config = otlp_config(
        collector,
        &connection_toml(
            &group,
            &topic,
            &d.url(),
            "value_format = \"json\"\nbatch = { max_records = 2, max_wait_ms = 60000 }",
        ),
    );
    let (trace_ids, parent) = (TRACE_IDS, PRODUCER_SPAN);
    produce_traced(&topic).await;
    let mut daemon = spawn_daemon(&config, Stdio::null());
    let (batch, dispatch) = wait_for(
        "the batch's consume span and its dispatch span",
        Duration::from_secs(60),
        || {
            let all = spans(&exports.lock().unwrap());
            let batch = all
                .iter()
                .find(|s| {
                    span_is(s, "consume")
                        && int_attribute(s, "messaging.batch.message_count") == Some(2)
                })?
                .clone();
            let dispatch = all
                .iter()
                .find(|s| s["name"] == "dispatch" && s["parentSpanId"] == batch["spanId"])?
                .clone();
            Some((batch, dispatch))
        },
    )
    .await;
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert_eq!(batch["name"], format!("process {topic}"));
    assert_eq!(
        attribute(&batch, "messaging.destination.name"),
        Some(serde_json::json!({"stringValue": topic}))
    );
    assert_eq!(int_attribute(&batch, "tessel.batch.first_offset"), Some(0));
    assert_eq!(int_attribute(&batch, "tessel.batch.last_offset"), Some(1));
    let mut linked: Vec<(String, String)> = batch["links"]
        .as_array()
        .expect("the batch span's links")
        .iter()
        .map(|l| {
            (
                l["traceId"].as_str().unwrap_or_default().to_owned(),
                l["spanId"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    linked.sort();
    assert_eq!(
        linked,
        trace_ids
            .iter()
            .map(|t| (t.to_string(), parent.to_owned()))
            .collect::<Vec<_>>(),
        "linked to each record's producer span"
    );
    assert_eq!(dispatch["traceId"], batch["traceId"]);
    for (span, key, value) in [
        (&batch, "messaging.batch.message_count", "2"),
        (&dispatch, "messaging.batch.message_count", "2"),
        (&dispatch, "tessel.attempt", "1"),
    ] {
        assert_eq!(
            attribute(span, key).map(|v| v["intValue"].clone()),
            Some(serde_json::json!(value)),
            "{key}, an integer"
        );
    }
    let runs = d.runs();
    assert_eq!(runs.len(), 2, "both records accepted in the batch");
    let expected = format!(
        "00-{}-{}-01",
        dispatch["traceId"].as_str().unwrap(),
        dispatch["spanId"].as_str().unwrap()
    );
    for r in &runs {
        assert_eq!(
            r.traceparent.as_deref(),
            Some(expected.as_str()),
            "the run continues the dispatch span"
        );
    }
}

/// The lag of a paused partition keeps following the log end: a paused partition is not
/// fetched, so its end offset has to come from somewhere else than fetch responses.
#[tokio::test]
async fn lag_keeps_rising_while_a_partition_is_paused() {
    let topic = unique("paused-lag");
    create_topic(&topic, 1).await;
    let d = dispatcher(Faults {
        fail_all: Some(503),
        ..Faults::default()
    })
    .await;
    let port = crate::support::free_port();
    let toml = connection_toml(
        &unique("paused-lag-group"),
        &topic,
        &d.url(),
        "concurrency = 1",
    )
    .replace(
        "drain_timeout_ms = 10000\n",
        "drain_timeout_ms = 10000\nmax_buffered_per_partition = 5\n",
    )
    .replace(
        "\"auto.offset.reset\" = \"earliest\"\n",
        "\"auto.offset.reset\" = \"earliest\"\n\"statistics.interval.ms\" = \"500\"\n",
    );
    let config = temp_config(&format!("[server]\nlisten = \"127.0.0.1:{port}\"\n{toml}"));
    let mut daemon = spawn_daemon(&config, Stdio::null());
    produce_keyed(&topic, 0, 50, 5).await;
    let _ = wait_for_async("the partition paused", Duration::from_secs(60), || async {
        let text = super::metrics_text(port).await?;
        (super::metric_sum(&text, "tessel_kafka_paused_partitions", &[]) >= 1.0).then_some(())
    })
    .await;
    produce_keyed(&topic, 50, 500, 5).await;
    let lag = wait_for_async(
        "lag to reach the new end",
        Duration::from_secs(30),
        || async {
            let text = super::metrics_text(port).await?;
            let l = super::metric_sum(
                &text,
                "tessel_kafka_consumer_lag_messages",
                &[&format!("topic=\"{topic}\"")],
            );
            (l >= 500.0).then_some(l)
        },
    )
    .await;
    daemon.kill().unwrap();
    let _ = daemon.wait();
    eprintln!("lag of the paused partition: {lag}");
}
