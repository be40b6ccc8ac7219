//! The shipped dashboard and alert rules against a real Prometheus (Debian's `prometheus`
//! package, installed by `scripts/deps`) scraping a running connector:
//!
//! - the rules pass `promtool check rules`, and during a live run every dashboard query,
//!   every dashboard variable and every alert expression finds its series, with the run's
//!   values; the lag queries keep each partition's value once the daemon stopped reporting;
//! - a dispatcher down for a minute fires the stall and dispatcher alerts for the run's
//!   namespace, region and connection, `/health` and the metrics show the stall, and `/readyz`
//!   and `/livez` stay 200 throughout.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use tessel_kafka::cli::dev_dispatcher::Faults;

use super::{
    connection_toml, create_topic, daemon_config, dispatcher, reference_produce, spawn_daemon,
    with_fast_statistics, DeadLetterSetup,
};
use crate::support::{free_port, repo, stack, unique, wait_for_async};

/// The scrape job's name: the alert rules select `up{job="tessel-kafka"}`, and the chart's
/// ServiceMonitor and PodMonitor take it from the `tessel.dev/job` label the chart sets to
/// `tessel-kafka` (tests/it/deploy.rs checks that for every rendering).
const JOB: &str = "tessel-kafka";

/// Target labels Kubernetes service discovery and the ServiceMonitor add in production.
const NAMESPACE: &str = "it-namespace";
const REGION: &str = "it-region";
const CONNECTION: &str = "it";

/// A Prometheus server on a loopback port; killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `target` every second and evaluating the alert rules in
    /// `rules`.
    async fn start(target: &str, rules: &std::path::Path) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = format!(
            r#"global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{rules}"]
scrape_configs:
  - job_name: {JOB}
    static_configs:
      - targets: ["{target}"]
        labels: {{namespace: {NAMESPACE}, region: {REGION}}}
"#,
            rules = rules.display()
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start prometheus ({e}): scripts/deps installs Debian's package")
            });
        let p = Self { child, port, dir };
        let ready = format!("http://127.0.0.1:{port}/-/ready");
        wait_for_async("prometheus ready", Duration::from_secs(60), || async {
            let r = reqwest::get(&ready).await.ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/<path>` with `params`; the `data` of a successful answer.
    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Option<Value> {
        let url = url::Url::parse_with_params(
            &format!("http://127.0.0.1:{}/api/v1/{path}", self.port),
            params,
        )
        .ok()?;
        let v: Value = reqwest::get(url).await.ok()?.json().await.ok()?;
        (v["status"] == "success").then(|| v["data"].clone())
    }

    /// The samples an instant query returns now (empty when it finds no series).
    async fn query(&self, promql: &str) -> Option<Vec<Value>> {
        let data = self.api("query", &[("query", promql)]).await?;
        data["result"].as_array().cloned()
    }

    /// The value of the first sample an instant query returns now.
    async fn value(&self, promql: &str) -> Option<f64> {
        let samples = self.query(promql).await?;
        samples.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Every alerting rule loaded, with its state (`inactive`, `pending`, `firing`) and its
    /// alerts; None until they all evaluated without error.
    async fn alert_rules(&self) -> Option<Vec<Value>> {
        let data = self.api("rules", &[("type", "alert")]).await?;
        let rules: Vec<Value> = data["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        (!rules.is_empty() && rules.iter().all(|r| r["health"] == "ok")).then_some(rules)
    }

    /// The labels of the alerts firing now.
    async fn firing(&self) -> Option<Vec<Value>> {
        let data = self.api("alerts", &[]).await?;
        Some(
            data["alerts"]
                .as_array()?
                .iter()
                .filter(|a| a["state"] == "firing")
                .map(|a| a["labels"].clone())
                .collect(),
        )
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Replaces the dashboard's variables with what one operator would pick.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$namespace", NAMESPACE)
        .replace("$region", REGION)
        .replace("$connection", CONNECTION)
}

/// Byte offsets of the characters of `expr` outside brackets and quotes.
fn top_level(expr: &str) -> Vec<usize> {
    let (mut depth, mut quoted, mut out) = (0i32, false, Vec::new());
    for (i, c) in expr.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '(' | '[' | '{' if !quoted => depth += 1,
            ')' | ']' | '}' if !quoted => depth -= 1,
            _ if depth == 0 && !quoted => out.push(i),
            _ => {}
        }
    }
    out
}

/// The parts of an alert expression that select data: the operands of top-level `and`, `or`
/// and `unless`, each without its threshold (`> 0.1`, `== 0`), and the selector inside
/// `absent(...)` (which answers only when it finds nothing). An alert can only fire when each
/// part finds series (or, for `absent`, when the series it watches go away); a misspelt
/// metric or label makes a part silently empty.
fn selecting_parts(expr: &str) -> Vec<String> {
    let mut cuts = Vec::new();
    for i in top_level(expr) {
        for op in [" and ", " or ", " unless "] {
            if expr[i..].starts_with(op) {
                cuts.push((i, i + op.len()));
            }
        }
    }
    let mut parts = Vec::new();
    let mut start = 0;
    for (from, to) in cuts {
        parts.push(&expr[start..from]);
        start = to;
    }
    parts.push(&expr[start..]);
    parts
        .into_iter()
        .map(|part| {
            let comparison = top_level(part)
                .into_iter()
                .find(|&i| matches!(part.as_bytes()[i], b'<' | b'>' | b'=' | b'!'));
            let Some(i) = comparison else {
                let part = part.trim();
                return part
                    .strip_prefix("absent(")
                    .and_then(|p| p.strip_suffix(')'))
                    .unwrap_or(part)
                    .to_owned();
            };
            let rhs = part[i..].trim_start_matches(['<', '>', '=', '!']).trim();
            let rhs = rhs.strip_prefix("bool ").unwrap_or(rhs);
            if rhs.parse::<f64>().is_ok() {
                part[..i].trim().to_owned()
            } else {
                part.trim().to_owned()
            }
        })
        .collect()
}

#[test]
fn alert_expressions_split_into_their_selecting_parts() {
    assert_eq!(
        selecting_parts(r#"up{job="tessel-kafka"} == 0"#),
        [r#"up{job="tessel-kafka"}"#]
    );
    assert_eq!(
        selecting_parts("sum by (a) (deriv(x[10m])) > 0 and sum by (a) (x) > 1000"),
        ["sum by (a) (deriv(x[10m]))", "sum by (a) (x)"]
    );
    assert_eq!(
        selecting_parts(r#"sum(rate(x{o!="a"}[5m])) / sum(rate(x[5m])) > 0.1"#),
        [r#"sum(rate(x{o!="a"}[5m])) / sum(rate(x[5m]))"#]
    );
    assert_eq!(selecting_parts("a > b"), ["a > b"]);
    assert_eq!(
        selecting_parts(r#"absent(up{job="tessel-kafka"})"#),
        [r#"up{job="tessel-kafka"}"#]
    );
    assert_eq!(
        selecting_parts("count by (n) (max_over_time(up[1h])) unless count by (n) (up == 1)"),
        [
            "count by (n) (max_over_time(up[1h]))",
            "count by (n) (up == 1)"
        ]
    );
}

/// The shipped rules with every `for:` hold shortened to `hold` (nothing else changed), in
/// `dir`: an alert that holds for minutes in production fires within a test.
fn rules_holding_for(dir: &std::path::Path, hold: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yml")).unwrap();
    let held: Vec<String> = text
        .lines()
        .map(|l| match l.split_once("for: ") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}for: {hold}"),
            _ => l.to_owned(),
        })
        .collect();
    assert!(held.iter().any(|l| l.ends_with(&format!("for: {hold}"))));
    let path = dir.join("alerts.yml");
    std::fs::write(&path, held.join("\n")).unwrap();
    path
}

const ORDER_AVRO: &str = r#"{"type":"record","name":"Order","namespace":"it.prometheus","fields":[{"name":"n","type":"long"}]}"#;

/// Avro orders (some refused by the dispatcher and dead-lettered), and records naming a
/// schema id the registry does not know (a registry error, then dead-lettered).
async fn produce_traffic(topic: &str, from: u32, to: u32) {
    let frame_unknown = |id: u32| {
        let mut v = vec![0u8];
        v.extend_from_slice(&id.to_be_bytes());
        v.extend_from_slice(b"\x02");
        base64::engine::general_purpose::STANDARD.encode(v)
    };
    let mut records: Vec<Value> = (from..to)
        .map(|i| json!({"key": format!("k{}", i % 7), "value": {"n": i}}))
        .collect();
    records.push(json!({"key": format!("unknown-{from}"), "raw_value_b64": frame_unknown(0x7ffe_0000 + from)}));
    let _ = reference_produce(json!({
        "bootstrap": stack().bootstrap, "registry": stack().registry_url, "topic": topic,
        "key": {"format": "string"}, "value": {"format": "avro", "schema": ORDER_AVRO},
        "steps": [{"txn": null, "records": records}]
    }))
    .await;
}

/// The daemon for `toml` (with statistics every 500 ms) on a free port, scraped by a
/// Prometheus with `rules`; returns both and the daemon's port.
async fn scraped_daemon(toml: &str, rules: &std::path::Path) -> (Child, Prometheus, u16) {
    let admin = free_port();
    let config = daemon_config(admin, &with_fast_statistics(toml));
    let daemon = spawn_daemon(&config, Stdio::null());
    let prometheus = Prometheus::start(&format!("127.0.0.1:{admin}"), rules).await;
    (daemon, prometheus, admin)
}

#[tokio::test]
async fn every_dashboard_query_and_alert_expression_returns_data_from_a_live_run() {
    let rules = repo().join("deploy/prometheus/alerts.yml");
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool (scripts/deps installs Debian's prometheus package)");
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    let setup = DeadLetterSetup::create("prom", 2, 1).await;
    let topic = &setup.topic;
    // One dispatch in five is refused (400): dispatch errors and dead letters have series.
    let d = dispatcher(Faults {
        latency_ms: (2, 20),
        fail_ratio: 0.2,
        fail_status: 400,
        ..Faults::default()
    })
    .await;
    let extra = "value_format = \"schema_registry\"\nkey_format = \"string\"\n";
    let toml = setup.toml(&d.url(), extra).replace(
        "retry = { initial_backoff_ms = 50, max_backoff_ms = 500 }",
        "retry = { initial_backoff_ms = 50, max_backoff_ms = 500, schema_not_found_ms = 300 }",
    );
    let (mut daemon, prometheus, _) = scraped_daemon(&toml, &rules).await;
    let up = format!("up{{job=\"{JOB}\"}} == 1");
    wait_for_async("the connector scraped", Duration::from_secs(60), || async {
        (!prometheus.query(&up).await?.is_empty()).then_some(())
    })
    .await;
    // Traffic in batches, each once Prometheus has scraped the dispatches of the one before:
    // a series first scraped with its final value has no increase, and its rate is 0.
    let attempts = "sum(tessel_kafka_dispatch_attempts_total)";
    for batch in 0..3 {
        produce_traffic(topic, batch * 20, batch * 20 + 20).await;
        wait_for_async(
            "Prometheus to scrape the batch's dispatches",
            Duration::from_secs(60),
            || async {
                let samples = prometheus.query(attempts).await?;
                let n: f64 = samples.first()?["value"][1].as_str()?.parse().ok()?;
                let sent = d.attempts();
                (sent >= 20 * (u64::from(batch) + 1) && n as u64 == sent).then_some(())
            },
        )
        .await;
    }

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grafana/tessel-kafka.json")).unwrap(),
    )
    .unwrap();
    let mut queries: BTreeMap<String, String> = BTreeMap::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            let _ = queries.insert(
                format!("panel {:?} {}", panel["title"], target["refId"]),
                substitute(expr),
            );
        }
    }
    assert!(queries.len() >= 8, "{queries:?}");
    let names: Vec<&str> = ["namespace", "region", "connection"].to_vec();
    let variables: Vec<&Value> = dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .filter(|v| v["type"] == "query")
        .collect();
    assert_eq!(
        variables
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        names,
        "dashboard variables"
    );
    // label_values(<selector>, <label>): the label's values among the selector's series.
    for v in &variables {
        let definition = v["definition"].as_str().expect("definition");
        let inner = definition
            .strip_prefix("label_values(")
            .and_then(|d| d.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{definition}"));
        let (selector, label) = inner.rsplit_once(", ").expect("selector, label");
        let _ = queries.insert(
            format!("variable {}", v["name"]),
            format!("count by ({label}) ({})", substitute(selector)),
        );
    }
    let alerts = wait_for_async("the alert rules loaded", Duration::from_secs(30), || {
        prometheus.alert_rules()
    })
    .await;
    let rule_text = std::fs::read_to_string(&rules).unwrap();
    assert_eq!(
        alerts.len(),
        rule_text.matches("- alert: ").count(),
        "every rule loaded"
    );
    for rule in &alerts {
        let name = rule["name"].as_str().unwrap();
        let runbook = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no runbook_url"));
        let anchor = runbook.rsplit_once('#').map(|(_, a)| a).unwrap_or_default();
        assert_eq!(anchor, name.to_lowercase(), "{name}: {runbook}");
        for (i, part) in selecting_parts(rule["query"].as_str().unwrap())
            .into_iter()
            .enumerate()
        {
            let _ = queries.insert(format!("alert {name} part {i}"), part);
        }
    }
    let runbook = std::fs::read_to_string(repo().join("docs/runbook.md")).unwrap();
    for rule in &alerts {
        let heading = format!("\n## {}\n", rule["name"].as_str().unwrap());
        assert!(
            runbook.contains(&heading),
            "docs/runbook.md lacks {heading}"
        );
    }

    // Polled until every query answers, with a deadline; the failure lists the empty ones.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let mut empty = Vec::new();
        for (what, q) in &queries {
            let samples = prometheus.query(q).await.unwrap_or_default();
            // A quantile over buckets that saw nothing is NaN: it must be a number.
            let finite = samples.iter().any(|s| {
                s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(f64::is_finite)
            });
            if !finite {
                empty.push(format!("{what}: {q}"));
            }
        }
        if empty.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no data after 120 s for:\n{}\nprometheus log:\n{}",
            empty.join("\n"),
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The values are the run's, not just present.
    let accepted = format!(
        "sum(tessel_kafka_messages_handled_total{{namespace=\"{NAMESPACE}\", outcome=\"accepted\"}})"
    );
    wait_for_async(
        "Prometheus to count every accepted run",
        Duration::from_secs(30),
        || async {
            let samples = prometheus.query(&accepted).await?;
            let n: f64 = samples.first()?["value"][1].as_str()?.parse().ok()?;
            (d.accepted() > 0 && n as usize == d.accepted()).then_some(())
        },
    )
    .await;
    // Per trigger, and nothing left in flight once every record is handled; the oldest
    // record not yet handled is then none (lag 0 s) on both partitions.
    let in_flight = format!(
        "sum(tessel_kafka_runs_in_flight{{namespace=\"{NAMESPACE}\", connection=\"{CONNECTION}\", trigger=\"main\"}})"
    );
    assert_eq!(prometheus.value(&in_flight).await, Some(0.0), "{in_flight}");
    let lag_seconds = format!(
        "count(tessel_kafka_consumer_lag_seconds{{namespace=\"{NAMESPACE}\", topic=\"{topic}\"}} == 0)"
    );
    wait_for_async(
        "the lag in seconds of both partitions at 0",
        Duration::from_secs(30),
        || async { (prometheus.value(&lag_seconds).await? == 2.0).then_some(()) },
    )
    .await;
    // The daemon reports, so the absence alerts stay quiet.
    let rules_now = prometheus.alert_rules().await.expect("rules");
    for name in ["TesselKafkaAbsent", "TesselKafkaStoppedReporting"] {
        let rule = rules_now.iter().find(|r| r["name"] == name).expect(name);
        assert_eq!(rule["state"], "inactive", "{name}: {rule}");
    }

    // The replica stops reporting (as when it dies before its partitions find a new owner):
    // its lag series go stale at once, and the dashboard's lag query keeps each partition's
    // last value.
    let lag = format!(
        "sum(tessel_kafka_consumer_lag_messages{{topic=\"{topic}\"}}) == 0 and count(tessel_kafka_consumer_lag_messages{{topic=\"{topic}\"}}) == 2"
    );
    wait_for_async(
        "both partitions' lag scraped at 0",
        Duration::from_secs(30),
        || async { (!prometheus.query(&lag).await?.is_empty()).then_some(()) },
    )
    .await;
    let _ = daemon.kill();
    let _ = daemon.wait();
    let raw = format!("count(tessel_kafka_consumer_lag_messages{{topic=\"{topic}\"}})");
    wait_for_async(
        "the stopped replica's lag series to go stale",
        Duration::from_secs(30),
        || async { prometheus.query(&raw).await?.is_empty().then_some(()) },
    )
    .await;
    let kept = queries
        .iter()
        .find(|(what, _)| {
            what.starts_with("panel ") && what.contains("Consumer lag by topic (messages)")
        })
        .map(|(_, q)| q.clone())
        .expect("the lag panel");
    let samples = prometheus.query(&kept).await.unwrap_or_default();
    let topics: Vec<&str> = samples
        .iter()
        .filter_map(|s| s["metric"]["topic"].as_str())
        .collect();
    assert_eq!(topics, [topic.as_str()], "{kept}: {samples:?}");
    let value: f64 = samples[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert_eq!(value, 0.0, "every record was handled: {samples:?}");
}

/// The issue's outage: the run dispatcher answers 503 to everything for a minute. The
/// partition stalls; `/health` and the metrics say so, the stall and dispatcher alerts fire
/// for the run's namespace, region and connection, and `/readyz` and `/livez` answer 200
/// throughout. Once the dispatcher is back, every record runs and the connection is healthy.
#[tokio::test]
async fn a_dispatcher_down_for_a_minute_fires_alerts_and_leaves_the_probes_up() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = rules_holding_for(dir.path(), "5s");
    let topic = unique("prom-outage");
    create_topic(&topic, 1).await;
    let d = dispatcher(Faults::default()).await;
    let toml = connection_toml(&unique("prom-outage-group"), &topic, &d.url(), "").replace(
        "drain_timeout_ms = 10000\n",
        "drain_timeout_ms = 10000\nstall_after_ms = 2000\n",
    );
    let (mut daemon, prometheus, admin) = scraped_daemon(&toml, &rules).await;
    let get = |path: &'static str| async move {
        let resp = reqwest::get(format!("http://127.0.0.1:{admin}{path}"))
            .await
            .ok()?;
        let status = resp.status().as_u16();
        Some((status, resp.json::<Value>().await.ok()?))
    };
    super::produce_keyed(&topic, 0, 5, 5).await;
    wait_for_async("the first records run", Duration::from_secs(60), || async {
        (d.accepted() == 5).then_some(())
    })
    .await;

    d.faults(|f| f.fail_all = Some(503));
    let down_at = std::time::Instant::now();
    super::produce_keyed(&topic, 5, 10, 5).await;
    let mut probes = BTreeMap::new();
    let (mut stalled, mut fired) = (None, None);
    while down_at.elapsed() < Duration::from_secs(60) {
        for path in ["/readyz", "/livez"] {
            let answer = get(path).await.map(|(status, _)| status);
            *probes.entry((path, answer)).or_insert(0u32) += 1;
        }
        if stalled.is_none() {
            stalled = get("/health").await.filter(|(status, body)| {
                *status == 503
                    && body["connections"][CONNECTION]["stalled_partitions"][format!("{topic}[0]")]
                        .as_str()
                        .is_some_and(|r| r.contains("HTTP 503"))
            });
        }
        if fired.is_none() {
            let firing = prometheus.firing().await.unwrap_or_default();
            let of = |name: &str| firing.iter().find(|a| a["alertname"] == name).cloned();
            if let (Some(stall), Some(errors)) = (
                of("TesselKafkaPartitionStalled"),
                of("TesselKafkaDispatcherErrors"),
            ) {
                fired = Some((stall, errors, down_at.elapsed()));
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let stalled_partitions = format!(
        "sum by (namespace, region, connection) (tessel_kafka_stalled_partitions{{connection=\"{CONNECTION}\"}})"
    );
    let stalled_now = prometheus
        .query(&stalled_partitions)
        .await
        .unwrap_or_default();
    d.faults(|f| f.fail_all = None);
    wait_for_async(
        "every record run and the connection healthy",
        Duration::from_secs(60),
        || async {
            let (status, _) = get("/health").await?;
            (d.accepted() == 10 && status == 200).then_some(())
        },
    )
    .await;
    let _ = daemon.kill();
    let _ = daemon.wait();

    assert_eq!(
        probes.keys().copied().collect::<Vec<_>>(),
        [("/livez", Some(200)), ("/readyz", Some(200))],
        "every probe answered 200 during the outage: {probes:?}"
    );
    let (_, body) = stalled.expect("/health reported the stall with its reason");
    assert_eq!(body["status"], "degraded", "{body}");
    let (stall, errors, after) = fired.expect("the stall and dispatcher alerts fired");
    eprintln!("alerts fired {after:?} into the outage");
    for (alert, labels) in [
        (&stall, vec![("connection", CONNECTION)]),
        (
            &errors,
            vec![("connection", CONNECTION), ("trigger", "main")],
        ),
    ] {
        assert_eq!(alert["namespace"], NAMESPACE, "{alert}");
        assert_eq!(alert["region"], REGION, "{alert}");
        for (k, v) in labels {
            assert_eq!(alert[k], v, "{alert}");
        }
    }
    assert_eq!(stalled_now.len(), 1, "{stalled_now:?}");
    assert_eq!(stalled_now[0]["value"][1], "1", "{stalled_now:?}");
    assert_eq!(stalled_now[0]["metric"]["region"], REGION);
}
