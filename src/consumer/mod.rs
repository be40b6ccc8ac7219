//! The consumer of a connection: the shell around the [consumer core](crate::core).
//!
//! # Delivery guarantee
//! At least once, with no duplicates after an orderly hand-over: an offset is committed only
//! after the run for that message and every earlier message of the partition was accepted
//! (or deliberately skipped), by one ordered commit path (the commit rule,
//! docs/architecture.md), and every revoke and shutdown commits synchronously after draining.
//! After a crash, messages whose acceptance was not yet committed are dispatched again with
//! the same idempotency key. Reads use `read_committed`, so records of aborted transactions
//! never reach a run.
//!
//! # Tasks
//! A connection's poll task polls librdkafka ([`poll_loop`]) on the blocking pool while the
//! connection is busy and holds no thread while it is quiet; callbacks only hand events to
//! the async [`supervisor`], which feeds the core and carries out its commands: runs
//! ([`crate::run`]), commits (its commit task, [`commit_task`]), pauses, resumes and seeks
//! (the poll task, before its next poll, in order). [`tasks`] starts and watches both.
//! A connection without triggers runs none of this, only [`crate::produce::produce_only`]'s health probe.

mod commit_task;
pub mod context;
mod identity;
mod monitor;
mod native;
mod poll_loop;
pub mod port;
mod queue_wake;
mod setup;
#[cfg(test)]
mod simulation;
pub mod supervisor;
mod tasks;

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedMessage;

use crate::config::ConnectionConfig;
use crate::dispatch::event::TopicPartition;

/// Capacity of the channel from the poll task and the callbacks to the supervisor, in events.
pub const EVENT_CHANNEL: usize = 8;

/// What the poll task and the callbacks hand to the supervisor, in order.
#[derive(Debug)]
pub enum ConsumerEvent {
    /// Messages, in the order librdkafka returned them (at most
    /// [`poll_loop::BATCH`]).
    Messages(Vec<OwnedMessage>),
    /// The consumer's next-read positions, after the messages before this event (None: no
    /// position yet, as right after an assignment).
    Positions(Vec<(TopicPartition, Option<i64>)>),
    /// Partitions were assigned (added, with cooperative rebalancing), with the group's
    /// committed offset and commit metadata when they could be read.
    Assigned(Vec<AssignedPartition>),
    /// Partitions are being revoked; librdkafka releases them once `ack` is sent.
    Revoked {
        /// The partitions.
        partitions: Vec<TopicPartition>,
        /// The assignment was lost (session timeout, fenced): commits would fail.
        lost: bool,
        /// Sent when the supervisor has drained and committed.
        ack: std::sync::mpsc::SyncSender<()>,
    },
    /// An error returned by poll.
    Error(KafkaError),
    /// The poll task moved these partitions' positions as the supervisor asked (their topic
    /// was created again), after the messages read before the move and before any read
    /// after it.
    Sought(Vec<TopicPartition>),
    /// Paused partitions whose log ends below what their assignment had read (the
    /// monitor's probe of their ends): the log was cut or replaced while they were not
    /// fetched. Each with the assignment's generation and the end.
    LogEnds(Vec<(TopicPartition, u64, i64)>),
    /// librdkafka said something that may mean a topic was deleted or created again, before
    /// the messages after this event: the partitions run and commit nothing until their
    /// topics' ids are read again.
    IdentityHint,
}

pub use crate::core::AssignedPartition;
pub(crate) use setup::panic_message;

/// The ids (KIP-516) of `topics` through `client`'s connections: None for a topic the cluster
/// gives no id, a topic that does not exist left out. Records' idempotency keys name a topic
/// with its id ([`crate::dispatch::event::key_topic`]); tools and tests read it here.
pub fn topic_ids<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topics: &[String],
    timeout: std::time::Duration,
) -> Result<std::collections::BTreeMap<String, Option<String>>, KafkaError> {
    native::topic_ids(client, topics, timeout)
}

/// Properties the connector sets when the user did not, with the reason.
const DEFAULTS: &[(&str, &str)] = &[
    // Never lose a message of a new group: start at the beginning of each partition.
    ("auto.offset.reset", "earliest"),
    // Bound librdkafka's prefetch (it applies per partition) so memory stays flat with many
    // partitions: measured with 64 partitions and a 1,000,000-message backlog, the defaults
    // (65536 KB, 100000 messages) let the daemon reach 270 MiB, 2048 KB 194-213 MiB and 512 KB
    // 174-178 MiB. For small messages `queued.min.messages` is what holds a fetch back (the
    // fetcher's debug lines say so), so 512 KB costs a drain nothing; messages of more than
    // 5 KB are fetched fewer than 100 at a time.
    ("queued.max.messages.kbytes", "512"),
    ("queued.min.messages", "100"),
    // With a partition's queue above those thresholds, librdkafka postpones its next fetch by
    // fetch.queue.backoff.ms (1000 by default), and then lets the queue run dry before it
    // fetches again: measured with scripts/bench, draining stalled in bursts at ~5,000 events/s
    // and live traffic waited up to a second. 10 ms keeps the bounds and refills in time.
    ("fetch.queue.backoff.ms", "10"),
    // Statistics feed consumer lag and broker reachability (health). librdkafka builds them on
    // its main thread and they wake our poll loop, so they are the largest cost of an idle
    // connection: measured with `scripts/bench --fleet 1000`, every 2 s cost 0.50 cores per
    // 1,000 idle connections, over the 0.05 per 100 a region can afford. Every 5 s is still
    // well inside a Prometheus scrape interval.
    ("statistics.interval.ms", "5000"),
];

/// The librdkafka configuration of a connection's consumer.
pub fn consumer_config(name: &str, conn: &ConnectionConfig) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    for (k, v) in &conn.kafka {
        let _ = cfg.set(k, v);
    }
    for (k, v) in DEFAULTS {
        if !conn.kafka.contains_key(*k) {
            let _ = cfg.set(*k, *v);
        }
    }
    if !conn.kafka.contains_key("client.id") {
        let _ = cfg.set("client.id", format!("tessel-kafka-{name}"));
    }
    // The classic protocol keeps librdkafka's default assignment, `range,roundrobin` (eager):
    // a member drains and commits before it rejoins, so no commit waits behind a rejoin (see
    // the commit rule in crate::core::committer).
    // Owned by the connector (validated in the config): see crate::config. Auto-commit is off:
    // every commit goes through the ops task, in order (the commit rule's one path).
    let _ = cfg
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    // librdkafka says that a topic changed id (deleted and created again under the same
    // name) or went missing only in debug lines of its `topic` context; without them the
    // connector notices a new topic at its next periodic check, 30 s later, while the
    // consumer reads the new log at the old position. The context's lines are few (a
    // metadata refresh's, a topic's state changes): they are read for those hints and logged
    // at debug level (see crate::consumer::identity).
    let debug = match conn.kafka.get("debug").map(String::as_str) {
        None | Some("") => "topic".to_owned(),
        Some(d) if d.split(',').any(|c| matches!(c.trim(), "topic" | "all")) => d.to_owned(),
        Some(d) => format!("{d},topic"),
    };
    let _ = cfg.set("debug", debug);
    cfg.set_log_level(RDKafkaLogLevel::Debug);
    cfg
}
