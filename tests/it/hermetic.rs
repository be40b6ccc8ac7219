//! The hermetic tier: the real daemon (in this process, or the binary) against librdkafka's
//! mock cluster and the dev dispatcher. Plain `cargo test`, no broker, seconds per test. What
//! only a real broker shows (transactions, ACLs, the registry) stays in the broker tier.

use std::process::Stdio;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{Offset, TopicPartitionList};
use tessel_kafka::cli::dev_dispatcher::{DevDispatcher, Faults};
use tokio_util::sync::CancellationToken;

use crate::config_builder::TestConfig;
use crate::support::{binary, temp_config, unique, wait_for, Connector};

type Mock = MockCluster<'static, rdkafka::producer::DefaultProducerContext>;

fn mock_with_topic(topic: &str, partitions: i32) -> Mock {
    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic(topic, partitions, 1).expect("topic");
    mock
}

/// Produces `{"i": i}` for i in `from..to`, keyed `k{i % keys}`, to `partition` (or by key).
fn produce(mock: &Mock, topic: &str, from: usize, to: usize, keys: usize, partition: Option<i32>) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", mock.bootstrap_servers())
        .create()
        .expect("producer");
    for i in from..to {
        let key = format!("k{}", i % keys);
        let value = format!("{{\"i\":{i}}}");
        let mut record = BaseRecord::to(topic).key(&key).payload(&value);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        producer.send(record).expect("queue a record");
    }
    producer.flush(Duration::from_secs(10)).expect("flush");
}

fn committed(mock: &Mock, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", mock.bootstrap_servers())
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(5))
        .expect("committed offsets");
    (0..partitions)
        .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => -1,
        })
        .collect()
}

fn end_offsets(mock: &Mock, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", mock.bootstrap_servers())
        .create()
        .expect("consumer");
    (0..partitions)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(5))
                .expect("watermarks")
                .1
        })
        .collect()
}

async fn dispatcher(faults: Faults) -> DevDispatcher {
    DevDispatcher::start(
        "127.0.0.1:0".parse().unwrap(),
        faults,
        false,
        CancellationToken::new(),
    )
    .await
    .expect("dev dispatcher")
}

/// Every `{"i": i}` for i in 0..n accepted exactly once.
fn assert_all_once(d: &DevDispatcher, n: usize) {
    assert_eq!(d.repeats(), 0, "repeated: {:?}", d.repeated_keys());
    assert_none_lost(d, n);
}

/// Every `{"i": i}` for i in 0..n accepted, some perhaps more than once.
fn assert_none_lost(d: &DevDispatcher, n: usize) {
    let mut seen: Vec<i64> = d
        .runs()
        .iter()
        .map(|r| r.event["value"]["i"].as_i64().unwrap())
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen, (0..n as i64).collect::<Vec<_>>(), "nothing lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_are_committed_only_after_the_dispatcher_accepts() {
    let topic = unique("h-accept");
    let mock = mock_with_topic(&topic, 1);
    produce(&mock, &topic, 0, 10, 10, Some(0));
    let group = unique("h-accept-group");
    let stuck = format!(
        "kafka:{group}:{}:0:4",
        crate::support::key_topic_once(&mock.bootstrap_servers(), &topic)
    );
    let d = dispatcher(Faults {
        fail_keys: std::collections::HashSet::from([stuck]),
        fail_status: 500,
        ..Faults::default()
    })
    .await;
    let c = Connector::start(
        &TestConfig::new(&mock.bootstrap_servers(), &group, &topic, &d.url()).toml(),
    );
    wait_for("the 9 other runs", Duration::from_secs(30), || {
        (d.accepted() == 9).then_some(())
    })
    .await;
    wait_for(
        "a commit at the failing offset",
        Duration::from_secs(10),
        || (committed(&mock, &group, &topic, 1) == [4]).then_some(()),
    )
    .await;
    d.faults(|f| f.fail_keys.clear());
    wait_for("committed to the end", Duration::from_secs(30), || {
        (committed(&mock, &group, &topic, 1) == [10]).then_some(())
    })
    .await;
    c.stop().await;
    assert_all_once(&d, 10);
}

/// A healthy daemon's probes: `/livez` and `/readyz` answer 200, and its event loop keeps
/// turning while idle (its last turn, in `/health`, stays under the 1 s stall-check period
/// plus slack long after the last record), so `/livez` judges a loop that beats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_daemon_is_alive_and_ready_and_its_idle_loop_keeps_turning() {
    let topic = unique("h-probes");
    let mock = mock_with_topic(&topic, 1);
    produce(&mock, &topic, 0, 3, 3, Some(0));
    let d = dispatcher(Faults::default()).await;
    let port = crate::support::free_port();
    let c = Connector::start_with(
        &TestConfig::new(
            &mock.bootstrap_servers(),
            &unique("h-probes-group"),
            &topic,
            &d.url(),
        )
        .server(&format!("127.0.0.1:{port}"))
        .toml(),
        true,
    );
    wait_for("the 3 runs", Duration::from_secs(30), || {
        (d.accepted() == 3).then_some(())
    })
    .await;
    let get = |path: &'static str| async move {
        let resp = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
            .await
            .ok()?;
        let status = resp.status().as_u16();
        Some((status, resp.json::<serde_json::Value>().await.ok()?))
    };
    let idle_since = Instant::now();
    let mut silences = Vec::new();
    while idle_since.elapsed() < Duration::from_secs(3) {
        let (_, body) = get("/health").await.expect("/health answers");
        silences.push(body["connections"]["it"]["event_loop_silent_ms"].as_u64());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let livez = get("/livez").await;
    let readyz = get("/readyz").await;
    c.stop().await;
    assert_eq!(livez, Some((200, serde_json::json!({"status": "ok"}))));
    assert_eq!(readyz, Some((200, serde_json::json!({"status": "ready"}))));
    assert!(silences.len() >= 8, "{silences:?}");
    assert!(
        silences.iter().all(|s| s.is_some_and(|ms| ms < 2_500)),
        "the idle loop turned at least every 2.5 s: {silences:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_refused_with_illegal_generation_loses_nothing_and_repeats_at_most_that_run() {
    let topic = unique("h-refused");
    let mock = mock_with_topic(&topic, 1);
    produce(&mock, &topic, 0, 10, 3, Some(0));
    let group = unique("h-refused-group");
    let d = dispatcher(Faults::default()).await;
    // librdkafka's own auto-commit is pushed out of the test's time frame: only the
    // connector's commits count.
    let config = TestConfig::new(&mock.bootstrap_servers(), &group, &topic, &d.url())
        .kafka("auto.commit.interval.ms", "600000")
        .kafka("session.timeout.ms", "6000")
        .kafka("heartbeat.interval.ms", "500");
    let c = Connector::start(&config.toml());
    wait_for("committed to 10", Duration::from_secs(30), || {
        (committed(&mock, &group, &topic, 1) == [10]).then_some(())
    })
    .await;
    // The next commit is refused as while another member joins: librdkafka drops the
    // assignment and joins again; the run whose commit was refused is offered once more.
    mock.request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION],
    );
    produce(&mock, &topic, 10, 11, 3, Some(0));
    wait_for("committed to 11", Duration::from_secs(30), || {
        (committed(&mock, &group, &topic, 1) == [11]).then_some(())
    })
    .await;
    produce(&mock, &topic, 11, 20, 3, Some(0));
    wait_for("committed to 20", Duration::from_secs(30), || {
        (committed(&mock, &group, &topic, 1) == [20]).then_some(())
    })
    .await;
    c.stop().await;
    assert!(d.repeats() <= 1, "repeated: {:?}", d.repeated_keys());
    assert_none_lost(&d, 20);
}

/// Two members take a partition from each other while it is paused (a full buffer), with
/// `strategy`; everything is dispatched once and committed.
async fn paused_partitions_move_and_come_back(strategy: &str) {
    let topic = unique("h-pause");
    let mock = mock_with_topic(&topic, 4);
    produce(&mock, &topic, 0, 200, 40, None);
    let group = unique("h-pause-group");
    let d = dispatcher(Faults {
        latency_ms: (20, 20),
        ..Faults::default()
    })
    .await;
    let config = TestConfig::new(&mock.bootstrap_servers(), &group, &topic, &d.url())
        .kafka("partition.assignment.strategy", strategy)
        .kafka("session.timeout.ms", "6000")
        .kafka("heartbeat.interval.ms", "500")
        .connection("max_buffered_per_partition", "2")
        .trigger("concurrency", "2")
        .toml();
    let a = Connector::start(&config);
    wait_for("the first runs", Duration::from_secs(30), || {
        (d.accepted() >= 10).then_some(())
    })
    .await;
    // A second member takes some partitions (paused ones among them), then leaves again.
    let b = Connector::start(&config);
    let before = d.accepted();
    wait_for("progress with two members", Duration::from_secs(30), || {
        (d.accepted() >= before + 20).then_some(())
    })
    .await;
    b.stop().await;
    wait_for("all 200 runs", Duration::from_secs(60), || {
        (d.accepted() >= 200).then_some(())
    })
    .await;
    let end = end_offsets(&mock, &topic, 4);
    wait_for("committed to the end", Duration::from_secs(30), || {
        (committed(&mock, &group, &topic, 4) == end).then_some(())
    })
    .await;
    a.stop().await;
    // librdkafka's mock coordinator refuses every commit while the group rebalances, the
    // revoke's synchronous commit included: the runs accepted in that window are offered
    // again by the next owner. New runs wait while commits are refused, so that is about the
    // runs in flight when the refusals began, per member and rebalance; a bound far below
    // the 200 records catches a regression that would repeat whole partitions.
    eprintln!("{strategy}: {} runs offered again", d.repeats());
    assert!(d.repeats() <= 40, "repeated: {:?}", d.repeated_keys());
    assert_none_lost(&d, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_partitions_revoked_and_assigned_again_resume_with_eager_assignment() {
    paused_partitions_move_and_come_back("range").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_partitions_revoked_and_assigned_again_resume_with_cooperative_assignment() {
    paused_partitions_move_and_come_back("cooperative-sticky").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_assignment_of_paused_partitions_comes_back_and_drains() {
    let topic = unique("h-lost");
    let mock = mock_with_topic(&topic, 2);
    produce(&mock, &topic, 0, 100, 20, None);
    let group = unique("h-lost-group");
    let d = dispatcher(Faults {
        latency_ms: (20, 20),
        ..Faults::default()
    })
    .await;
    let config = TestConfig::new(&mock.bootstrap_servers(), &group, &topic, &d.url())
        .kafka("session.timeout.ms", "6000")
        .kafka("heartbeat.interval.ms", "300")
        .connection("max_buffered_per_partition", "2")
        .trigger("concurrency", "1")
        .toml();
    let a = Connector::start(&config);
    wait_for("the first runs", Duration::from_secs(30), || {
        (d.accepted() >= 5).then_some(())
    })
    .await;
    // The coordinator forgets the member: librdkafka declares the assignment lost and joins
    // again, getting the (paused) partitions back.
    mock.request_errors(
        RDKafkaApiKey::Heartbeat,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID],
    );
    wait_for("all 100 runs", Duration::from_secs(60), || {
        (d.accepted() >= 100).then_some(())
    })
    .await;
    let end = end_offsets(&mock, &topic, 2);
    wait_for("committed to the end", Duration::from_secs(30), || {
        (committed(&mock, &group, &topic, 2) == end).then_some(())
    })
    .await;
    a.stop().await;
    // A run in flight when the assignment was lost may be offered again (409 from the
    // dispatcher); none is lost.
    assert_none_lost(&d, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_a_revoke_pending_ends_the_revoke_once_its_partitions_drained() {
    let topic = unique("h-shutdown");
    let mock = mock_with_topic(&topic, 4);
    produce(&mock, &topic, 0, 8, 8, None);
    let group = unique("h-shutdown-group");
    // Runs take 8 s: the revoke, which the mock cluster delivers 5-6 s after the second
    // member joins, arrives while they are in flight and waits for them. (With 3 s runs it
    // sometimes found the revoked partitions idle, was answered at once, and the stop then
    // met the cooperative rebalance's next round: a final commit refused for 10 s.)
    let d = dispatcher(Faults {
        latency_ms: (8000, 8000),
        ..Faults::default()
    })
    .await;
    let config = TestConfig::new(&mock.bootstrap_servers(), &group, &topic, &d.url())
        .kafka("partition.assignment.strategy", "cooperative-sticky")
        .kafka("session.timeout.ms", "6000")
        .kafka("heartbeat.interval.ms", "300")
        .dispatcher_timeout_ms(15_000)
        .connection("drain_timeout_ms", "12000")
        .trigger("concurrency", "4")
        .server("127.0.0.1:0");
    let log = std::env::temp_dir().join(format!("{}.log", unique("h-shutdown")));
    let path = temp_config(&format!("{}[log]\nlevel = \"info\"\n", config.toml()));
    let mut first = spawn(&path, &log);
    wait_for("4 runs in flight", Duration::from_secs(30), || {
        (d.in_flight() == 4).then_some(())
    })
    .await;
    // A second member joins: the first must revoke partitions whose runs are in flight.
    let second_log = std::env::temp_dir().join(format!("{}.log", unique("h-shutdown-2")));
    let mut second = spawn(&path, &second_log);
    wait_for("the revoke", Duration::from_secs(30), || {
        std::fs::read_to_string(&log)
            .ok()?
            .contains("partitions revoked")
            .then_some(())
    })
    .await;
    let stopped_at = Instant::now();
    sigterm(&first);
    // The revoke ends (its partitions' final commit, librdkafka released) once its own
    // partitions' runs ended: at most 8 s here. Holding it for the whole stop (the other
    // partitions' runs, the final commit) stalled the group's rebalance, and the mock
    // cluster then refused the final commit and expelled the member; before that, waiting
    // for the revoke callback's own deadline (drain_timeout + 10 s = 22 s) was the defect.
    let released = wait_for("the revoke to finish", Duration::from_secs(20), || {
        std::fs::read_to_string(&log)
            .ok()?
            .contains("revoke finished")
            .then(|| stopped_at.elapsed())
    })
    .await;
    // Then the stop's own drain and final commit (retried up to 10 s while the group
    // rebalances), and the consumer's close (bounded at 10 s; it went silent twice here,
    // see CLOSE_TIMEOUT).
    let status = wait_exit(
        &mut first,
        "the first member",
        Duration::from_secs(45),
        &log,
    )
    .await;
    let took = stopped_at.elapsed();
    eprintln!("stopping with a revoke pending took {took:?}; the revoke ended after {released:?}");
    sigterm(&second);
    let _ = wait_exit(
        &mut second,
        "the second member",
        Duration::from_secs(45),
        &second_log,
    )
    .await;
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(
        released < Duration::from_secs(12),
        "the revoke ended {released:?} after the stop began\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// A daemon process that is killed when the test ends, also when it fails.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Daemon {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

fn spawn(config: &std::path::Path, log: &std::path::Path) -> Daemon {
    Daemon(
        std::process::Command::new(binary())
            .args(["run", "--config"])
            .arg(config)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("start tessel-kafka"),
    )
}

/// Waits for `child` to exit; on timeout, fails with its log.
async fn wait_exit(
    child: &mut Daemon,
    what: &str,
    within: Duration,
    log: &std::path::Path,
) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait for the daemon") {
            return status;
        }
        if Instant::now() > deadline {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            panic!("timed out after {within:?} waiting for {what} to exit; its log:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sigterm(child: &std::process::Child) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}
