//! Tests against the real broker and registry (feature `kafka-integration-tests`).

mod batches;
mod control;
mod demo;
mod descriptors;
mod dispatcher_tls;
mod failures;
mod handover;
mod hostile;
#[cfg(feature = "image-tests")]
mod image;
mod measured;
mod operations;
mod ordering;
mod patterns;
mod pipeline;
mod placement;
mod produce;
mod prometheus;
mod region;
mod resets;
mod restart;
mod security;
mod smoke;
/// The crate's own test CA, mTLS server and CONNECT proxy (test code, shared by path).
#[path = "../../../src/tls_testing.rs"]
mod tls_testing;
mod tools;
mod transactions;
mod triggers;

use std::process::Stdio;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;
use tessel_kafka::cli::dev_dispatcher::{DevDispatcher, Faults};
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use crate::support::stack;

/// Whether the broker offers the KIP-848 consumer group protocol: on by default from Kafka
/// 4.0; 2.8 has no ConsumerGroupHeartbeat and 3.x offers it only behind an early-access
/// setting this stack does not set (the consumer never gets an assignment). Prints why a
/// test is skipped when it does not.
pub fn kip_848_available() -> bool {
    let major: u32 = stack()
        .kafka_version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .expect("TESSEL_IT_KAFKA_VERSION starts with a major version number");
    if major < 4 {
        eprintln!(
            "skipped: KIP-848 needs Kafka 4.x; this run is against {}",
            stack().kafka_version
        );
    }
    major >= 4
}

/// Creates `topic` with `partitions` partitions through the PLAINTEXT listener.
pub async fn create_topic(topic: &str, partitions: i32) {
    create_topic_with(topic, partitions, &[]).await;
}

/// Creates `topic` with topic-level `config` entries (such as `max.message.bytes`).
pub async fn create_topic_with(topic: &str, partitions: i32, config: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &stack().bootstrap)
        .create()
        .expect("admin client");
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    for (k, v) in config {
        new = new.set(k, v);
    }
    let res = admin
        .create_topics(
            &[new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .expect("create topics");
    for r in res {
        r.unwrap_or_else(|(t, e)| panic!("cannot create topic {t}: {e}"));
    }
}

/// Runs `scripts/py/<script>` with the stack's Python, `spec` as JSON on stdin; returns the
/// JSON it prints.
pub async fn run_reference(script: &str, spec: Value) -> Value {
    let path = crate::support::repo().join("scripts/py").join(script);
    let mut child = tokio::process::Command::new(&stack().python)
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(spec.to_string().as_bytes())
        .await
        .expect("write spec");
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{script} timed out"))
        .unwrap_or_else(|e| panic!("{script} output: {e}"));
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{script} JSON: {e}"))
}

/// Runs the reference producer (Python confluent-kafka serializers) with `spec`.
pub async fn reference_produce(spec: Value) -> Value {
    run_reference("refproduce.py", spec).await
}

/// Reads a topic with the reference consumer (Python confluent-kafka deserializers); returns
/// its records.
pub async fn reference_consume(spec: Value) -> Vec<Value> {
    let v = run_reference("refconsume.py", spec).await;
    v["records"].as_array().expect("records").clone()
}

/// The idempotency key of the record of `topic` at `partition`/`offset` for `group` (its
/// event's `id`), with the topic's id as the broker has it.
pub fn record_key(group: &str, topic: &str, partition: i32, offset: i64) -> String {
    let topic = crate::support::key_topic(&stack().bootstrap, topic);
    format!("kafka:{group}:{topic}:{partition}:{offset}")
}

/// The idempotency key of a batch of `count` records of `topic`/`partition` from `first` to
/// `last` for `group`.
pub fn batch_key(
    group: &str,
    topic: &str,
    partition: i32,
    first: i64,
    last: i64,
    count: usize,
) -> String {
    let topic = crate::support::key_topic(&stack().bootstrap, topic);
    format!("kafka:{group}:{topic}:{partition}:{first}-{last}:{count}")
}

/// Committed offsets of `group` for `partitions` of `topic` (-1 when none).
pub fn committed(group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    committed_with_metadata(group, topic, partitions)
        .into_iter()
        .map(|(offset, _)| offset)
        .collect()
}

/// Committed offsets of `group` for `partitions` of `topic` (-1 when none), each with its
/// commit metadata, as they are now (read_uncommitted: a pending transactional offset commit,
/// which the connector never makes, is not waited for).
pub fn committed_with_metadata(group: &str, topic: &str, partitions: i32) -> Vec<(i64, String)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &stack().bootstrap)
        .set("group.id", group)
        .set("isolation.level", "read_uncommitted")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    // The group coordinator can answer NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS while
    // it moves or loads its offsets (seen on 3.9 under the parallel tests): asked again until
    // a deadline, as clients do.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let got = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(got) => break got,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("committed offsets of {group}: {e}; asking again");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("committed offsets of {group}: {e}"),
        }
    };
    (0..partitions)
        .map(|p| match got.find_partition(topic, p) {
            Some(e) => match e.offset() {
                Offset::Offset(o) => (o, e.metadata().to_owned()),
                _ => (-1, String::new()),
            },
            None => (-1, String::new()),
        })
        .collect()
}

/// High watermarks of `topic`'s partitions.
pub fn high_watermarks(topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &stack().bootstrap)
        .create()
        .expect("consumer");
    (0..partitions)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks")
                .1
        })
        .collect()
}

pub use crate::support::Connector;

/// A dev dispatcher for one test.
pub async fn dispatcher(faults: Faults) -> DevDispatcher {
    DevDispatcher::start(
        "127.0.0.1:0".parse().unwrap(),
        faults,
        false,
        CancellationToken::new(),
    )
    .await
    .expect("dev dispatcher")
}

/// A connection with one trigger on `topic`, plain listener, the stack's registry.
pub fn connection_toml(
    group: &str,
    topic: &str,
    dispatcher_url: &str,
    trigger_extra: &str,
) -> String {
    format!(
        r#"
[connections.it]
drain_timeout_ms = 10000
[connections.it.kafka]
"bootstrap.servers" = "{bootstrap}"
"group.id" = "{group}"
"auto.offset.reset" = "earliest"
[connections.it.schema_registry]
url = "{registry}"
[connections.it.triggers.main]
topics = ["{topic}"]
workflow = "wf-{topic}"
dispatcher = {{ url = "{dispatcher_url}", timeout_ms = 5000 }}
retry = {{ initial_backoff_ms = 50, max_backoff_ms = 500 }}
{trigger_extra}
"#,
        bootstrap = stack().bootstrap,
        registry = stack().registry_url,
    )
}

/// A dead-lettering test's names and topics: a topic, its dead-letter topic and a group,
/// unique per test, named from one prefix.
pub struct DeadLetterSetup {
    /// The trigger's topic.
    pub topic: String,
    /// Its `dead_letter_topic`.
    pub dlq: String,
    /// The consumer group.
    pub group: String,
}

impl DeadLetterSetup {
    /// Creates the topic with `partitions` partitions and the dead-letter topic with
    /// `dlq_partitions`.
    pub async fn create(prefix: &str, partitions: i32, dlq_partitions: i32) -> Self {
        let setup = Self {
            topic: crate::support::unique(prefix),
            dlq: crate::support::unique(&format!("{prefix}-dlq")),
            group: crate::support::unique(&format!("{prefix}-group")),
        };
        create_topic(&setup.topic, partitions).await;
        create_topic(&setup.dlq, dlq_partitions).await;
        setup
    }

    /// The idempotency key of the topic's record at `partition`/`offset` (its event's `id`).
    pub fn id(&self, partition: i32, offset: i64) -> String {
        record_key(&self.group, &self.topic, partition, offset)
    }

    /// The trigger settings that dead-letter into `dlq`, a line each.
    pub fn dead_letter(&self) -> String {
        format!(
            "on_error = \"dead_letter\"\ndead_letter_topic = \"{}\"\n",
            self.dlq
        )
    }

    /// [`connection_toml`] for the topic and group, dead-lettering, with `extra` trigger
    /// settings.
    pub fn toml(&self, dispatcher_url: &str, extra: &str) -> String {
        connection_toml(
            &self.group,
            &self.topic,
            dispatcher_url,
            &format!("{}{extra}", self.dead_letter()),
        )
    }
}

/// A config file of `toml` with the daemon's HTTP server on 127.0.0.1:`port` (0: any).
pub fn daemon_config(port: u16, toml: &str) -> std::path::PathBuf {
    crate::support::temp_config(&format!("[server]\nlisten = \"127.0.0.1:{port}\"\n{toml}"))
}

/// Sum of the samples of `name` whose labels contain every `labels` pair.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
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

/// The daemon's `/metrics` text; None while it does not answer.
pub async fn metrics_text(admin_port: u16) -> Option<String> {
    reqwest::get(format!("http://127.0.0.1:{admin_port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()
}

/// The daemon in a process of its own (its `/health` on a free port), its log kept in a
/// temporary file for a failure; stopped when dropped.
pub struct LoggedDaemon {
    _daemon: Daemon,
    /// Its admin port (`/health`, `/metrics`).
    pub admin_port: u16,
    /// Its log file.
    pub log: std::path::PathBuf,
}

impl LoggedDaemon {
    /// Starts the daemon with `toml` (of [`connection_toml`]); its log named after `name`.
    pub fn start(name: &str, toml: &str) -> Self {
        let admin_port = crate::support::free_port();
        let log = std::env::temp_dir().join(format!("{}.log", crate::support::unique(name)));
        let daemon = Daemon(spawn_daemon(
            &daemon_config(admin_port, toml),
            std::process::Stdio::from(std::fs::File::create(&log).expect("daemon log")),
        ));
        Self {
            _daemon: daemon,
            admin_port,
            log,
        }
    }

    /// Polls `/health` until it answers 503 with a stall reason for `partition` (connection
    /// "it") containing `wanted`, for at most `within`; the reason.
    pub async fn stall_reason(
        &self,
        partition: &str,
        wanted: &str,
        within: std::time::Duration,
    ) -> String {
        let deadline = std::time::Instant::now() + within;
        let url = format!("http://127.0.0.1:{}/health", self.admin_port);
        let mut last = None;
        loop {
            if let Ok(resp) = reqwest::get(&url).await {
                let status = resp.status().as_u16();
                if let Ok(body) = resp.json::<serde_json::Value>().await {
                    let reason =
                        body["connections"]["it"]["stalled_partitions"][partition].as_str();
                    if let Some(r) = reason.filter(|r| status == 503 && r.contains(wanted)) {
                        return r.to_owned();
                    }
                    last = Some((status, body));
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no stall of {partition} for {wanted:?} within {within:?}; /health {last:?}, log {}",
                self.log.display()
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}

/// `toml` (of [`connection_toml`]) with librdkafka statistics every 500 ms, so lag and
/// broker metrics move within a test.
pub fn with_fast_statistics(toml: &str) -> String {
    toml.replace(
        "\"auto.offset.reset\" = \"earliest\"\n",
        "\"auto.offset.reset\" = \"earliest\"\n\"statistics.interval.ms\" = \"500\"\n",
    )
}

/// `tessel-kafka run` for `toml` (its HTTP server on any port, its log discarded), killed
/// (SIGKILL) when dropped: also when a test fails, so no daemon outlives its test.
pub struct Daemon(std::process::Child);

impl Daemon {
    /// Starts it.
    pub fn start(toml: &str) -> Self {
        Self(spawn_daemon(&daemon_config(0, toml), Stdio::null()))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the `tessel-kafka` binary with `config` (its `[log]` section decides the level); its
/// log goes to `stderr`.
pub fn spawn_daemon(config: &std::path::Path, stderr: Stdio) -> std::process::Child {
    std::process::Command::new(crate::support::binary())
        .args(["run", "--config"])
        .arg(config)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start tessel-kafka")
}

/// Produces JSON records `{"i": i}` for i in `from..to`, keyed `k{i % keys}`.
pub async fn produce_keyed(topic: &str, from: usize, to: usize, keys: usize) {
    let records: Vec<Value> = (from..to)
        .map(|i| serde_json::json!({"key": format!("k{}", i % keys), "value": {"i": i}}))
        .collect();
    let _ = reference_produce(serde_json::json!({
        "bootstrap": stack().bootstrap, "topic": topic, "key": {"format": "string"}, "value": {"format": "json"},
        "kafka": {"linger.ms": 20, "batch.num.messages": 10000},
        "steps": [{"txn": null, "records": records}]
    }))
    .await;
}

/// Asserts that every value `i` in 0..n was accepted exactly once.
pub fn assert_all_once(d: &DevDispatcher, n: usize) {
    assert_eq!(
        d.repeats(),
        0,
        "offered again after acceptance: {:?}",
        d.repeated_keys()
    );
    assert_none_lost(d, n);
}

/// Asserts that every value `i` in 0..n was accepted (at least once).
pub fn assert_none_lost(d: &DevDispatcher, n: usize) {
    let mut seen: Vec<i64> = d
        .runs()
        .iter()
        .map(|r| r.event["value"]["i"].as_i64().unwrap())
        .collect();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..n as i64).collect::<Vec<_>>(),
        "every message once"
    );
}

/// The `[connections.it.kafka]` table for the SASL_SSL listener as `user`.
pub fn sasl_ssl_kafka_table(user: &str, password: &str, group: &str) -> String {
    let s = stack();
    format!(
        r#"[connections.it.kafka]
"bootstrap.servers" = "{}"
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "SCRAM-SHA-512"
"sasl.username" = "{user}"
"sasl.password" = "{password}"
"ssl.ca.location" = "{}"
"group.id" = "{group}"
"auto.offset.reset" = "earliest"
"#,
        s.bootstrap_sasl_ssl, s.ca_pem
    )
}

/// Waits until `group` has committed up to the end of every partition of `topic`, and returns
/// those end offsets.
pub async fn wait_committed_to_end(group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let hwm = high_watermarks(topic, partitions);
    // One query can take 30 s while a coordinator loads under the parallel tests.
    let timeout = Duration::from_secs(120);
    let deadline = std::time::Instant::now() + timeout;
    loop {
        // Asked off the test's runtime: the query blocks (for seconds while a coordinator
        // loads), and stand-in servers or a connector on the runtime would not run meanwhile.
        let (g, t) = (group.to_owned(), topic.to_owned());
        let now = tokio::task::spawn_blocking(move || committed(&g, &t, partitions))
            .await
            .expect("committed offsets");
        if now == hwm {
            return hwm;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{group} committed {now:?} of {topic}, not its ends {hwm:?}, within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
