//! A region of several daemon processes, measured (issue 36): 300 connections over three
//! replicas, a replica SIGKILLed, a fourth replica added. Each prints its figures.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tessel_kafka::cli::dev_dispatcher::Faults;

use super::super::dispatcher;
use super::super::placement::{assert_all_in_key_order, placements, settled, RegionSetup, Replica};
use crate::support::{stack, wait_for, wait_for_async};

/// Threads of a process, from /proc.
fn threads(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Writes one record to every connection's topic per round, `{"c", "i"}` keyed `k{i % 5}`,
/// until stopped; returns how many rounds it wrote.
struct Traffic {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    fn start(setup: &RegionSetup, from: usize, every: Duration) -> Self {
        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", &stack().bootstrap)
            .set("linger.ms", "5")
            .set("enable.idempotence", "true")
            .create()
            .expect("producer");
        let topics: Vec<(String, String)> = setup
            .connections
            .iter()
            .map(|(c, (t, _))| (c.clone(), t.clone()))
            .collect();
        let (stop, rounds) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let task = tokio::spawn({
            let (stop, rounds) = (Arc::clone(&stop), Arc::clone(&rounds));
            async move {
                let mut i = from;
                while !stop.load(Ordering::SeqCst) {
                    let mut sends = Vec::new();
                    for (c, topic) in &topics {
                        let key = format!("k{}", i % 5);
                        let value = serde_json::json!({"c": c, "i": i}).to_string();
                        let queued = producer
                            .send_result(FutureRecord::to(topic).key(&key).payload(&value))
                            .map_err(|(e, _)| e);
                        sends.push(queued);
                    }
                    for s in sends {
                        let sent = s.expect("queued").await.expect("delivered");
                        sent.unwrap_or_else(|(e, _)| panic!("produce: {e}"));
                    }
                    i += 1;
                    rounds.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(every).await;
                }
            }
        });
        Self { stop, rounds, task }
    }

    /// Stops it; returns the values written per connection (`from..returned`).
    async fn stop(self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("traffic");
        self.rounds.load(Ordering::SeqCst)
    }
}

/// Placements as (connection, replica) pairs.
fn pairs(on: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<(String, String)> {
    on.iter()
        .flat_map(|(c, rs)| rs.iter().map(move |r| (c.clone(), r.clone())))
        .collect()
}

/// Three replicas, 300 connections of two partitions: each connection runs on two of them,
/// and each replica runs about two thirds of the 300 clients every-replica-runs-all needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_of_300_connections_each_run_two_thirds_of_the_clients() {
    let setup = RegionSetup::create("region-300", 300, 2).await;
    setup.produce(0, 10, 5).await;
    let d = dispatcher(Faults::default()).await;
    let started = Instant::now();
    let replicas: Vec<Replica> = ["tk-0", "tk-1", "tk-2"]
        .iter()
        .map(|r| setup.start(r, &d.url()))
        .collect();
    let refs: Vec<&Replica> = replicas.iter().collect();
    let on = settled(&refs, 300, 2, Duration::from_secs(150)).await;
    let placed_in = started.elapsed();
    wait_for("every record dispatched", Duration::from_secs(120), || {
        (d.accepted() >= 3000).then_some(())
    })
    .await;
    let drained_in = started.elapsed();
    let names: Vec<String> = setup.connections.keys().cloned().collect();
    assert_all_in_key_order(&d, &names, 10);
    let mut report = Vec::new();
    for r in &replicas {
        let runs = on.values().filter(|s| s.contains(&r.name)).count();
        let clients = wait_for_async("clients settle", Duration::from_secs(30), || async {
            r.metric("tessel_kafka_region_clients")
                .await
                .filter(|n| *n as usize == runs + 1)
        })
        .await;
        let threads = threads(r.child.id()).unwrap_or(0);
        report.push((r.name.clone(), runs, clients, threads));
        assert!(
            (160..=240).contains(&runs),
            "{} runs {runs} of the 600 placements",
            r.name
        );
    }
    eprintln!(
        "region of 3 replicas, 300 connections (spread 2): placed in {:.1} s, 3000 records \
         drained in {:.1} s, {} offered again",
        placed_in.as_secs_f64(),
        drained_in.as_secs_f64(),
        d.repeats()
    );
    for (name, runs, clients, threads) in &report {
        eprintln!(
            "  {name}: {runs} connections, {clients} librdkafka clients ({:.2} of the 301 \
             every-replica-runs-all needs), {threads} threads",
            clients / 301.0
        );
    }
}

/// A replica SIGKILLed under traffic: every connection it ran runs on two of the others
/// again within the region group's session timeout (10 s) plus start time, and nothing is
/// lost or run out of key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_leaves_no_connection_behind_and_loses_nothing() {
    let mut setup = RegionSetup::create("region-kill", 60, 2).await;
    // The tenant groups hand a dead member's partitions on after 6 s.
    setup.kafka_extra = "\"session.timeout.ms\" = \"6000\"".to_owned();
    let d = dispatcher(Faults {
        latency_ms: (5, 30),
        ..Faults::default()
    })
    .await;
    let mut replicas: Vec<Replica> = ["tk-0", "tk-1", "tk-2"]
        .iter()
        .map(|r| setup.start(r, &d.url()))
        .collect();
    {
        let refs: Vec<&Replica> = replicas.iter().collect();
        settled(&refs, 60, 2, Duration::from_secs(120)).await;
    }
    let traffic = Traffic::start(&setup, 0, Duration::from_millis(50));
    wait_for("runs under traffic", Duration::from_secs(60), || {
        (d.accepted() >= 60 * 20).then_some(())
    })
    .await;
    let before = {
        let refs: Vec<&Replica> = replicas.iter().collect();
        placements(&refs, 60).await.expect("placements")
    };
    let mut killed = replicas.remove(1);
    let orphaned: BTreeSet<String> = before
        .iter()
        .filter(|(_, rs)| rs.contains(&killed.name))
        .map(|(c, _)| c.clone())
        .collect();
    killed.child.kill().expect("SIGKILL");
    let killed_at = Instant::now();
    let _ = killed.child.wait();
    let refs: Vec<&Replica> = replicas.iter().collect();
    let after = settled(&refs, 60, 2, Duration::from_secs(60)).await;
    let replaced_in = killed_at.elapsed();
    let rounds = traffic.stop().await;
    wait_for("every record dispatched", Duration::from_secs(120), || {
        (d.runs().len() >= 60 * rounds).then_some(())
    })
    .await;
    let names: Vec<String> = setup.connections.keys().cloned().collect();
    assert_all_in_key_order(&d, &names, rounds);
    assert!(orphaned.iter().all(|c| after[c].len() == 2));
    eprintln!(
        "SIGKILL of one of 3 replicas (60 connections, {} of them on it): each back on two \
         replicas {:.1} s after the kill (region session timeout 10 s); {} records, 0 lost, \
         key order kept, {} offered again",
        orphaned.len(),
        replaced_in.as_secs_f64(),
        60 * rounds,
        d.repeats()
    );
    drop(killed);
}

/// A fourth replica joins three under traffic: about a quarter of the placements move to
/// it, each by an orderly handover (drained and committed first), so nothing is offered
/// again beyond the runs in flight, nothing is lost and keys keep their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_replica_takes_a_quarter_by_orderly_handovers() {
    let setup = RegionSetup::create("region-add", 120, 2).await;
    let d = dispatcher(Faults {
        latency_ms: (5, 30),
        ..Faults::default()
    })
    .await;
    let mut replicas: Vec<Replica> = ["tk-0", "tk-1", "tk-2"]
        .iter()
        .map(|r| setup.start(r, &d.url()))
        .collect();
    let before = {
        let refs: Vec<&Replica> = replicas.iter().collect();
        settled(&refs, 120, 2, Duration::from_secs(120)).await
    };
    let traffic = Traffic::start(&setup, 0, Duration::from_millis(100));
    wait_for("runs under traffic", Duration::from_secs(60), || {
        (d.accepted() >= 120 * 10).then_some(())
    })
    .await;
    let in_flight = d.max_in_flight();
    let joined_at = Instant::now();
    replicas.push(setup.start("tk-3", &d.url()));
    let refs: Vec<&Replica> = replicas.iter().collect();
    let after = settled(&refs, 120, 2, Duration::from_secs(90)).await;
    let took = joined_at.elapsed();
    let rounds = traffic.stop().await;
    wait_for("every record dispatched", Duration::from_secs(120), || {
        (d.runs().len() >= 120 * rounds).then_some(())
    })
    .await;
    let names: Vec<String> = setup.connections.keys().cloned().collect();
    assert_all_in_key_order(&d, &names, rounds);
    let (was, now) = (pairs(&before), pairs(&after));
    let moved = was.difference(&now).count();
    let to_new = now.iter().filter(|(_, r)| r == "tk-3").count();
    eprintln!(
        "a fourth replica: {moved} of 240 placements moved ({:.2}), {to_new} to it, settled in \
         {:.1} s; {} records, {} offered again (at most {in_flight} runs were in flight at once)",
        moved as f64 / 240.0,
        took.as_secs_f64(),
        120 * rounds,
        d.repeats()
    );
    assert!((36..=110).contains(&moved), "{moved} of 240 moved");
    assert!(
        d.repeats() as usize <= in_flight,
        "{} offered again, {in_flight} in flight: {:?}",
        d.repeats(),
        d.repeated_keys()
    );
}
