//! A region beyond one pod (issue 36): several daemon processes as the replicas of one
//! region, placing their connections through a region group on the test broker (a group and
//! a placement topic of their own per test). The heavy scenarios (300 connections, SIGKILL
//! of a replica, a fourth replica) are in `measured::region`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;
use tessel_kafka::cli::dev_dispatcher::{DevDispatcher, Faults};

use super::{daemon_config, dispatcher, spawn_daemon};
use crate::support::{free_port, stack, unique, wait_for, wait_for_async};

/// One region's connections: each its own topic and group, named from one prefix.
pub(super) struct RegionSetup {
    /// The region's name (its group and placement topic derive from it).
    pub region: String,
    /// Connection name → (topic, group).
    pub connections: BTreeMap<String, (String, String)>,
    /// Connection settings added to each (`[connections.<c>]` lines).
    pub connection_extra: String,
    /// librdkafka properties added to each connection's `kafka` table.
    pub kafka_extra: String,
    /// Top-level tables before `[region]` (a `[produce]` section).
    pub top_extra: String,
}

impl RegionSetup {
    /// `n` connections over topics of `partitions` partitions, created in one request.
    pub async fn create(prefix: &str, n: usize, partitions: i32) -> Self {
        Self::create_with(prefix, &vec![partitions; n]).await
    }

    /// A connection per entry of `partitions`, its topic with that many partitions.
    pub async fn create_with(prefix: &str, partitions: &[i32]) -> Self {
        let n = partitions.len();
        let region = unique(prefix);
        let connections: BTreeMap<String, (String, String)> = (0..n)
            .map(|i| {
                (
                    format!("c{i:04}"),
                    (format!("{region}-t{i}"), format!("{region}-g{i}")),
                )
            })
            .collect();
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &stack().bootstrap)
            .create()
            .expect("admin client");
        let topics: Vec<&String> = connections.values().map(|(t, _)| t).collect();
        for chunk in topics.chunks(200) {
            let new: Vec<NewTopic> = chunk
                .iter()
                .map(|t| {
                    let i: usize = t.rsplit("-t").next().and_then(|i| i.parse().ok()).unwrap();
                    NewTopic::new(t, partitions[i], TopicReplication::Fixed(1))
                })
                .collect();
            let res = admin
                .create_topics(
                    &new,
                    &AdminOptions::new().operation_timeout(Some(Duration::from_secs(60))),
                )
                .await
                .expect("create topics");
            for r in res {
                r.unwrap_or_else(|(t, e)| panic!("cannot create topic {t}: {e}"));
            }
        }
        Self {
            region,
            connections,
            connection_extra: String::new(),
            kafka_extra: String::new(),
            top_extra: String::new(),
        }
    }

    /// Produces JSON records `{"c": <connection>, "i": i}` for i in `from..to` to every
    /// connection's topic, keyed `k{i % keys}`.
    pub async fn produce(&self, from: usize, to: usize, keys: usize) {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &stack().bootstrap)
            .set("linger.ms", "20")
            .set("enable.idempotence", "true")
            .create()
            .expect("producer");
        let mut sends = Vec::new();
        for (c, (topic, _)) in &self.connections {
            for i in from..to {
                let key = format!("k{}", i % keys);
                let value = serde_json::json!({"c": c, "i": i}).to_string();
                let queued = producer
                    .send_result(FutureRecord::to(topic).key(&key).payload(&value))
                    .map_err(|(e, _)| e);
                sends.push(queued);
            }
        }
        for s in sends {
            let sent = s.expect("queued").await.expect("delivered");
            sent.unwrap_or_else(|(e, _)| panic!("produce: {e}"));
        }
    }

    /// The configuration of replica `replica` on admin `port`.
    pub fn toml(&self, replica: &str, port: u16, dispatcher_url: &str) -> String {
        let s = stack();
        let mut t = format!(
            r#"{top}
[region]
name = "{region}"
replica_id = "{replica}"
advertise_url = "http://127.0.0.1:{port}"
[region.kafka]
"bootstrap.servers" = "{bootstrap}"
[region.placement]
spread = 2
slots = 60
"#,
            top = self.top_extra,
            region = self.region,
            bootstrap = s.bootstrap,
        );
        for (c, (topic, group)) in &self.connections {
            t.push_str(&format!(
                r#"
[connections.{c}]
drain_timeout_ms = 10000
{extra}
[connections.{c}.kafka]
"bootstrap.servers" = "{bootstrap}"
"group.id" = "{group}"
"auto.offset.reset" = "earliest"
"statistics.interval.ms" = "1000"
{kafka_extra}
[connections.{c}.triggers.t]
topics = ["{topic}"]
workflow = "wf"
concurrency = 8
key_format = "string"
value_format = "json"
dispatcher = {{ url = "{dispatcher_url}", timeout_ms = 5000 }}
retry = {{ initial_backoff_ms = 50, max_backoff_ms = 500 }}
"#,
                bootstrap = s.bootstrap,
                extra = self.connection_extra,
                kafka_extra = self.kafka_extra,
            ));
        }
        t
    }

    /// Starts replica `replica` (its log in a temporary file, shown when a test fails), and
    /// waits until it listens. A port found free can be taken before the daemon binds it
    /// (by another test, or as the local port of an outgoing connection): the replica is
    /// then started again on another.
    pub fn start(&self, replica: &str, dispatcher_url: &str) -> Replica {
        for _ in 0..5 {
            let port = free_port();
            let config = daemon_config(port, &self.toml(replica, port, dispatcher_url));
            let log = config.with_extension("log");
            let file = std::fs::File::create(&log).expect("log file");
            let mut child = spawn_daemon(&config, Stdio::from(file));
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains("admin server listening") {
                    return Replica {
                        name: replica.to_owned(),
                        base: format!("http://127.0.0.1:{port}"),
                        child,
                        log,
                    };
                }
                if let Ok(Some(status)) = child.try_wait() {
                    assert!(
                        text.contains("Address already in use"),
                        "replica {replica} exited ({status}): {text}"
                    );
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "replica {replica} not listening after 30 s: {text}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("replica {replica}: no free port in 5 tries");
    }
}

/// A daemon process of the region, killed (SIGKILL) when dropped.
pub(super) struct Replica {
    pub name: String,
    pub base: String,
    pub child: std::process::Child,
    pub log: std::path::PathBuf,
}

impl Replica {
    /// `/health`, when it answers.
    pub async fn health(&self) -> Option<Value> {
        let resp = reqwest::get(format!("{}/health", self.base)).await.ok()?;
        resp.json().await.ok()
    }

    /// The connections it runs, by its `/health` (None while it does not answer or has not
    /// joined).
    pub async fn runs(&self) -> Option<BTreeSet<String>> {
        let h = self.health().await?;
        if h["region"]["joined"] != true {
            return None;
        }
        Some(
            h["region"]["runs_here"]
                .as_object()?
                .keys()
                .cloned()
                .collect(),
        )
    }

    /// The value of the metric sample `name` (no labels).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let text = reqwest::get(format!("{}/metrics", self.base))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// SIGTERM, and waits for the exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        wait_for("the replica to exit", Duration::from_secs(60), || {
            self.child.try_wait().ok().flatten()
        })
        .await
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!(
                "--- replica {} log (last lines) ---\n{}",
                self.name,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

/// The replicas each connection runs on, by the replicas' `/health` (None until every
/// replica answers, has joined, and every connection runs somewhere).
pub(super) async fn placements(
    replicas: &[&Replica],
    connections: usize,
) -> Option<BTreeMap<String, BTreeSet<String>>> {
    let mut on: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in replicas {
        // Each sees every other in the region group.
        let h = r.health().await?;
        if h["region"]["replicas"].as_u64()? != replicas.len() as u64 {
            return None;
        }
        for c in r.runs().await? {
            let _ = on.entry(c).or_default().insert(r.name.clone());
        }
    }
    (on.len() == connections).then_some(on)
}

/// Waits until every connection runs on exactly `want` replicas, and returns where.
pub(super) async fn settled(
    replicas: &[&Replica],
    connections: usize,
    want: usize,
    timeout: Duration,
) -> BTreeMap<String, BTreeSet<String>> {
    wait_for_async(
        &format!("every connection placed on {want} replicas"),
        timeout,
        || async {
            let on = placements(replicas, connections).await?;
            on.values().all(|r| r.len() == want).then_some(on)
        },
    )
    .await
}

/// Per connection and key, the values `i` in the order their runs were first accepted.
pub(super) fn first_runs_by_key(d: &DevDispatcher) -> BTreeMap<(String, String), Vec<i64>> {
    let mut out: BTreeMap<(String, String), Vec<i64>> = BTreeMap::new();
    for r in d.runs() {
        let c = r.event["value"]["c"].as_str().unwrap_or("?").to_owned();
        let key = r.event["key"].as_str().unwrap_or("?").to_owned();
        let i = r.event["value"]["i"].as_i64().unwrap_or(-1);
        out.entry((c, key)).or_default().push(i);
    }
    out
}

/// Asserts that each connection's records `0..n` were all accepted, and each key's first
/// acceptances came in order.
pub(super) fn assert_all_in_key_order(d: &DevDispatcher, connections: &[String], n: usize) {
    let by_key = first_runs_by_key(d);
    for ((c, key), values) in &by_key {
        assert!(
            values.windows(2).all(|w| w[0] < w[1]),
            "{c} key {key} out of order: {values:?}"
        );
    }
    for c in connections {
        let mut seen: Vec<i64> = by_key
            .iter()
            .filter(|((cc, _), _)| cc == c)
            .flat_map(|(_, v)| v.iter().copied())
            .collect();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..n as i64).collect::<Vec<_>>(),
            "{c}: every record once"
        );
    }
}

/// Three replicas and twelve connections of two partitions: each connection runs on two
/// distinct replicas (the spread), every record is dispatched once, and each replica's
/// `/health` and metrics say what it runs.
#[tokio::test]
async fn three_replicas_run_each_connection_on_two_of_them_and_every_record_once() {
    let setup = RegionSetup::create("region-place", 12, 2).await;
    setup.produce(0, 30, 5).await;
    let d = dispatcher(Faults::default()).await;
    let replicas: Vec<Replica> = ["tk-0", "tk-1", "tk-2"]
        .iter()
        .map(|r| setup.start(r, &d.url()))
        .collect();
    let refs: Vec<&Replica> = replicas.iter().collect();
    let on = settled(&refs, 12, 2, Duration::from_secs(120)).await;
    let names: Vec<String> = setup.connections.keys().cloned().collect();
    wait_for("every record dispatched", Duration::from_secs(120), || {
        (d.accepted() >= 12 * 30).then_some(())
    })
    .await;
    assert_all_in_key_order(&d, &names, 30);
    assert_eq!(d.repeats(), 0, "{:?}", d.repeated_keys());
    // Two thirds of the clients every-replica-runs-all would need: 24 placements of 36.
    let per_replica: BTreeMap<&str, usize> = replicas
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                on.values().filter(|s| s.contains(&r.name)).count(),
            )
        })
        .collect();
    assert_eq!(per_replica.values().sum::<usize>(), 24, "{per_replica:?}");
    for r in &replicas {
        // A connection placed elsewhere since reports here until its drain ended and it
        // stopped (its health goes then): the report is read once those are gone.
        let h = wait_for_async(
            "only the connections placed here report",
            Duration::from_secs(60),
            || async {
                let h = r.health().await?;
                let here = h["region"]["runs_here"].as_object()?.len();
                (h["connections"].as_object()?.len() == here).then_some(h)
            },
        )
        .await;
        let region = &h["region"];
        assert_eq!(region["replicas"], 3, "{h}");
        assert!(region["generation"].as_i64().unwrap() > 0, "{h}");
        let here = region["runs_here"].as_object().unwrap();
        // Why: the slot that placed it here, its rank, and the other replica.
        for (c, why) in here {
            assert!(why["slot"].as_u64().unwrap() < 60, "{c}: {why}");
            assert_eq!(why["with"].as_array().unwrap().len(), 1, "{c}: {why}");
            assert!(h["connections"][c].is_object(), "{c} reports its health");
        }
        assert_eq!(
            h["connections"].as_object().unwrap().len(),
            here.len(),
            "only the connections placed here report: {h}"
        );
        let placed = wait_for_async("the placed gauge", Duration::from_secs(10), || async {
            r.metric("tessel_kafka_region_connections_placed")
                .await
                .filter(|n| *n as usize == here.len())
        })
        .await;
        // A consumer per connection placed here, producers only for dead letters (none),
        // and the region consumer.
        let clients = r.metric("tessel_kafka_region_clients").await.unwrap();
        assert_eq!(clients, placed + 1.0, "{}", r.name);
        assert!(r.metric("tessel_kafka_open_fds").await.unwrap() > 0.0);
        assert!(r.metric("tessel_kafka_region_generation").await.unwrap() > 0.0);
    }
    // A replica stopped with SIGTERM leaves the region group and drains: the other two run
    // every connection on both of them, and nothing is offered again.
    let mut replicas = replicas;
    let mut stopped = replicas.pop().expect("three");
    assert!(stopped.terminate().await.success());
    let refs: Vec<&Replica> = replicas.iter().collect();
    settled(&refs, 12, 2, Duration::from_secs(90)).await;
    setup.produce(30, 40, 5).await;
    wait_for("the records written since", Duration::from_secs(90), || {
        (d.accepted() >= 12 * 40).then_some(())
    })
    .await;
    assert_all_in_key_order(&d, &names, 40);
    assert_eq!(d.repeats(), 0, "{:?}", d.repeated_keys());
}

/// Without `[region.kafka]` each replica runs every connection, as before: no region group,
/// no `region` in `/health`, every connection placed.
#[tokio::test]
async fn without_a_region_cluster_every_replica_runs_every_connection() {
    let setup = RegionSetup::create("region-none", 3, 2).await;
    setup.produce(0, 10, 5).await;
    let d = dispatcher(Faults::default()).await;
    let port = free_port();
    let toml = setup.toml("tk-0", port, &d.url());
    let without = toml[toml.find("\n[connections.").unwrap()..].to_owned();
    let config = daemon_config(port, &without);
    let mut child = spawn_daemon(&config, Stdio::null());
    let base = format!("http://127.0.0.1:{port}");
    wait_for("every record dispatched", Duration::from_secs(90), || {
        (d.accepted() >= 30).then_some(())
    })
    .await;
    let h: Value = reqwest::get(format!("{base}/health"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(h.get("region").is_none(), "{h}");
    assert_eq!(h["connections"].as_object().unwrap().len(), 3, "{h}");
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("tessel_kafka_region_connections_placed 3\n"),
        "{metrics}"
    );
    assert!(metrics.contains("tessel_kafka_region_generation 0\n"));
    assert_eq!(d.repeats(), 0);
    let _ = child.kill();
    let _ = child.wait();
}

/// A connection runs on no more replicas than it has partitions: of two replicas, a
/// one-partition connection runs on one, a two-partition connection on both.
#[tokio::test]
async fn a_connection_runs_on_no_more_replicas_than_its_partitions() {
    let setup = RegionSetup::create_with("region-parts", &[1, 1, 1, 1, 2, 2]).await;
    setup.produce(0, 10, 5).await;
    let d = dispatcher(Faults::default()).await;
    let replicas: Vec<Replica> = ["tk-0", "tk-1"]
        .iter()
        .map(|r| setup.start(r, &d.url()))
        .collect();
    let refs: Vec<&Replica> = replicas.iter().collect();
    let on = wait_for_async(
        "one replica per partition, at most two",
        Duration::from_secs(90),
        || async {
            let on = placements(&refs, 6).await?;
            let want = |c: &str| if c < "c0004" { 1 } else { 2 };
            on.iter().all(|(c, r)| r.len() == want(c)).then_some(on)
        },
    )
    .await;
    wait_for("every record dispatched", Duration::from_secs(90), || {
        (d.accepted() >= 60).then_some(())
    })
    .await;
    let names: Vec<String> = setup.connections.keys().cloned().collect();
    assert_all_in_key_order(&d, &names, 10);
    assert_eq!(on.values().map(BTreeSet::len).sum::<usize>(), 4 + 2 * 2);
    assert_eq!(d.repeats(), 0, "{:?}", d.repeated_keys());
}

/// The produce API is served by every replica for every connection a token grants, whichever
/// replicas run its triggers.
#[tokio::test]
async fn every_replica_serves_the_produce_api_of_every_connection() {
    let mut setup = RegionSetup::create("region-produce", 3, 2).await;
    setup.top_extra = "[produce.tokens.wf]\ntoken = \"0123456789abcdef-region\"\nconnections = [\"*\"]\ntopics = [\"*\"]".to_owned();
    let d = dispatcher(Faults::default()).await;
    let replicas: Vec<Replica> = ["tk-0", "tk-1", "tk-2"]
        .iter()
        .map(|r| setup.start(r, &d.url()))
        .collect();
    let refs: Vec<&Replica> = replicas.iter().collect();
    let on = settled(&refs, 3, 2, Duration::from_secs(90)).await;
    let mut i = 0;
    for r in &replicas {
        for (c, (topic, _)) in &setup.connections {
            let body = serde_json::json!({"topic": topic, "key": "k0", "value": {"c": c, "i": i}});
            // A connection placed here that is still starting is answered 503 with
            // Retry-After: sent again then, as a client does (within a deadline).
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            let (status, text) = loop {
                let resp = reqwest::Client::new()
                    .post(format!("{}/v1/connections/{c}/messages", r.base))
                    .bearer_auth("0123456789abcdef-region")
                    .json(&body)
                    .send()
                    .await
                    .expect("produce API");
                let status = resp.status().as_u16();
                let retry_after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                let text = resp.text().await.unwrap_or_default();
                match retry_after {
                    Some(secs) if status == 503 && tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_secs(secs)).await;
                    }
                    _ => break (status, text),
                }
            };
            assert_eq!(
                status,
                200,
                "{} (runs {c}: {}) produce to {c}: {text}",
                r.name,
                on[c].contains(&r.name)
            );
            i += 1;
        }
    }
    // Every record written through any replica starts its run once.
    wait_for(
        "the produced records dispatched",
        Duration::from_secs(60),
        || (d.accepted() >= 9).then_some(()),
    )
    .await;
    assert_eq!(d.repeats(), 0);
}
