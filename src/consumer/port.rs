//! The port between the shell and librdkafka: every call the connection's tasks make to
//! their consumer, as one trait ([`KafkaPort`]), and its adapter over rust-rdkafka
//! ([`RdKafkaPort`]).
//!
//! The shell's tasks (supervisor, poll, commit, identity and monitor) are generic over the
//! port, so the adapter costs nothing over calling rust-rdkafka directly, and a second
//! implementation (a simulated librdkafka over the simulator's coordinator and logs,
//! docs/architecture.md "Tests") can run the real shell. What a port reports about the
//! cluster between calls (brokers up, refusals, identity hints, rebalances) is what the
//! consumer's context collected from librdkafka's callbacks.
//!
//! Unsafe: the consumer queue's io events, through rdkafka-sys (see [`ConsumerQueue`]).
#![allow(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::os::fd::RawFd;
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::OwnedMessage;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::consumer::context::ConnectorContext;
use crate::core::CommitBatch;
use crate::dispatch::event::TopicPartition;

/// The consumer's next-read positions (None: no position yet, as right after an assignment
/// or a seek).
pub type Positions = Vec<(TopicPartition, Option<i64>)>;

/// The broker's verdict on a commit request: the request's own error, and each partition's
/// (a partition the answer does not name carries the request's).
pub type CommitVerdict = (
    Option<RDKafkaErrorCode>,
    Vec<(TopicPartition, Option<RDKafkaErrorCode>)>,
);

/// What the shell asks of its consumer. Calls may block (a commit waits for the broker's
/// answer, a seek for the partition's fetcher): the shell makes the blocking ones off the
/// runtime's workers, as noted on each.
pub trait KafkaPort: Send + Sync + 'static {
    /// Whether the port's calls block their thread: librdkafka's do (a commit waits for the
    /// broker, a poll runs the revoke callback, which waits for the supervisor), so the
    /// shell makes them on tokio's blocking pool. A port whose calls never block (a
    /// simulated librdkafka) is called on the task's own thread, so that one thread runs
    /// the whole connection in an order a seed replays.
    const BLOCKS: bool = true;

    /// Subscribes to `topics` (names and patterns).
    fn subscribe(&self, topics: &[&str]) -> Result<(), KafkaError>;

    /// The next element of the consumer's queue without waiting: a message, an error, or
    /// None when nothing was ready or the poll served an event (a log line, statistics, a
    /// rebalance, whose callbacks run here). The poll task's thread only.
    fn poll(&self) -> Option<Result<OwnedMessage, KafkaError>>;

    /// Elements waiting in the consumer's queue.
    fn queued(&self) -> usize;

    /// Has the consumer write to the eventfd `fd` when an element lands on its empty queue
    /// (`None`: stop writing; called before the fd closes).
    fn wake_on(&self, fd: Option<RawFd>);

    /// Rebalances (assignments, revocations) the consumer went through so far.
    fn rebalances(&self) -> u64;

    /// The next-read positions of the assigned partitions (a local query).
    fn positions(&self) -> Option<Positions>;

    /// Pauses (true) or resumes `partitions`: what was fetched beyond the position of a
    /// paused partition is dropped and fetched again on resume.
    fn flow(&self, pause: bool, partitions: &[TopicPartition]) -> Result<(), KafkaError>;

    /// Moves `tp`'s position to `to`; waits up to `timeout` for the partition's fetcher.
    fn seek(&self, tp: &TopicPartition, to: Offset, timeout: Duration) -> Result<(), KafkaError>;

    /// Commits `batch` synchronously and reads the broker's verdict per partition. Blocks.
    fn commit(&self, batch: &CommitBatch) -> CommitVerdict;

    /// Commits `batch` synchronously; the first error. Blocks.
    fn commit_sync(&self, batch: &CommitBatch) -> Result<(), KafkaError>;

    /// The end (high watermark) of `tp`'s log, asked of its leader. Blocks up to `timeout`.
    fn high_watermark(&self, tp: &TopicPartition, timeout: Duration) -> Result<i64, KafkaError>;

    /// The ids (KIP-516) of `topics`: None where the cluster gives none, a topic that does not
    /// exist left out. Blocks up to `timeout`.
    fn topic_ids(
        &self,
        topics: &[String],
        timeout: Duration,
    ) -> Result<BTreeMap<String, Option<String>>, KafkaError>;

    /// Whether something said since the last call may mean that a topic was deleted and
    /// created again (an offset reset, an unknown topic or partition).
    fn take_identity_check(&self) -> bool;

    /// Notes an error the poll returned (connection failures, authorization refusals).
    fn note_error(&self, error: &KafkaError);

    /// Whether an authorization refusal was seen since the last call.
    fn take_authorization_refused(&self) -> bool;

    /// Brokers reachable at the last report (None before the first).
    fn brokers_up(&self) -> Option<bool>;

    /// The last authentication or TLS failure, while no broker is up.
    fn connect_failure(&self) -> Option<String>;

    /// The ends of the paused partitions, queried by the monitor (a paused partition is not
    /// fetched, so the reported end stops moving).
    fn set_paused_ends(&self, ends: HashMap<(String, i32), i64>);

    /// The connection committed for shutdown: rebalance callbacks from now on do nothing.
    fn set_closing(&self);
}

/// Runs `f`, a call to port `P`, where it may block: on tokio's blocking pool when `P`'s
/// calls block, else here. Err: it panicked, with the panic's message (or why the blocking
/// pool lost it).
pub(crate) async fn call<P: KafkaPort, T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    if P::BLOCKS {
        tokio::task::spawn_blocking(f).await.map_err(|e| {
            if e.is_panic() {
                super::setup::panic_message(&*e.into_panic())
            } else {
                e.to_string()
            }
        })
    } else {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .map_err(|p| super::setup::panic_message(&*p))
    }
}

/// Starts `f`, a call to port `P` whose answer goes elsewhere (a channel), without waiting
/// for it: on tokio's blocking pool when `P`'s calls block, else at once, here.
pub(crate) fn start<P: KafkaPort>(f: impl FnOnce() + Send + 'static) {
    if P::BLOCKS {
        drop(tokio::task::spawn_blocking(f));
    } else {
        f();
    }
}

/// What librdkafka writes to the eventfd: an eventfd accepts only 8-byte writes, and adds
/// them up.
static PAYLOAD: u64 = 1;

/// A reference to the consumer's queue, held for its io events and length. Declared before
/// the consumer in [`RdKafkaPort`], so it is released before the consumer closes.
struct ConsumerQueue(*mut rdsys::rd_kafka_queue_t);

// librdkafka's queue calls used here (io event enablement, length, destroy) take the queue's
// lock; the reference itself is released once, in Drop.
unsafe impl Send for ConsumerQueue {}
unsafe impl Sync for ConsumerQueue {}

impl Drop for ConsumerQueue {
    fn drop(&mut self) {
        // SAFETY: stop writing to any fd, then release the reference (before the consumer
        // closes: field order).
        unsafe {
            rdsys::rd_kafka_queue_io_event_enable(self.0, -1, std::ptr::null(), 0);
            rdsys::rd_kafka_queue_destroy(self.0);
        }
    }
}

/// The port over rust-rdkafka: a connection's consumer, whose context collects what
/// librdkafka's callbacks said.
pub struct RdKafkaPort {
    queue: ConsumerQueue,
    consumer: BaseConsumer<ConnectorContext>,
}

impl RdKafkaPort {
    /// The port of `consumer`.
    pub(crate) fn new(consumer: BaseConsumer<ConnectorContext>) -> std::io::Result<Self> {
        // SAFETY: the consumer's handle is valid while `consumer` lives, and the reference is
        // released before it (field order).
        let queue = unsafe { rdsys::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        if queue.is_null() {
            return Err(std::io::Error::other("the consumer has no consumer queue"));
        }
        Ok(Self {
            queue: ConsumerQueue(queue),
            consumer,
        })
    }

    fn context(&self) -> &ConnectorContext {
        self.consumer.context()
    }
}

/// `partitions` as librdkafka's list.
fn list_of(partitions: &[TopicPartition]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(partitions.len());
    for tp in partitions {
        let _ = tpl.add_partition(&tp.topic, tp.partition);
    }
    tpl
}

/// The request of `batch`: each partition at its offset, with its metadata.
fn commit_list(batch: &CommitBatch) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(batch.len());
    for (tp, offset, metadata) in batch {
        let mut elem = tpl.add_partition(&tp.topic, tp.partition);
        let _ = elem.set_offset(Offset::Offset(*offset));
        elem.set_metadata(metadata);
    }
    tpl
}

impl KafkaPort for RdKafkaPort {
    fn subscribe(&self, topics: &[&str]) -> Result<(), KafkaError> {
        self.consumer.subscribe(topics)
    }

    fn poll(&self) -> Option<Result<OwnedMessage, KafkaError>> {
        self.consumer
            .poll(Duration::ZERO)
            .map(|r| r.map(|m| m.detach()))
    }

    fn queued(&self) -> usize {
        // SAFETY: the queue reference is valid until Drop.
        unsafe { rdsys::rd_kafka_queue_length(self.queue.0) }
    }

    fn wake_on(&self, fd: Option<RawFd>) {
        // SAFETY: librdkafka copies the payload; the caller keeps the fd open until it calls
        // this again with None.
        unsafe {
            match fd {
                Some(fd) => rdsys::rd_kafka_queue_io_event_enable(
                    self.queue.0,
                    fd,
                    std::ptr::from_ref(&PAYLOAD).cast(),
                    std::mem::size_of::<u64>(),
                ),
                None => {
                    rdsys::rd_kafka_queue_io_event_enable(self.queue.0, -1, std::ptr::null(), 0)
                }
            }
        }
    }

    fn rebalances(&self) -> u64 {
        self.context().rebalances()
    }

    fn positions(&self) -> Option<Positions> {
        let tpl = self.consumer.position().ok()?;
        Some(
            tpl.elements()
                .iter()
                .map(|e| {
                    let tp = TopicPartition {
                        topic: e.topic().to_owned(),
                        partition: e.partition(),
                    };
                    match e.offset() {
                        Offset::Offset(o) => (tp, Some(o)),
                        _ => (tp, None),
                    }
                })
                .collect(),
        )
    }

    fn flow(&self, pause: bool, partitions: &[TopicPartition]) -> Result<(), KafkaError> {
        let tpl = list_of(partitions);
        if pause {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        }
    }

    fn seek(&self, tp: &TopicPartition, to: Offset, timeout: Duration) -> Result<(), KafkaError> {
        self.consumer.seek(&tp.topic, tp.partition, to, timeout)
    }

    fn commit(&self, batch: &CommitBatch) -> CommitVerdict {
        super::native::commit_with_results(self.consumer.client(), &commit_list(batch))
    }

    fn commit_sync(&self, batch: &CommitBatch) -> Result<(), KafkaError> {
        self.consumer.commit(&commit_list(batch), CommitMode::Sync)
    }

    fn high_watermark(&self, tp: &TopicPartition, timeout: Duration) -> Result<i64, KafkaError> {
        self.consumer
            .fetch_watermarks(&tp.topic, tp.partition, timeout)
            .map(|(_, high)| high)
    }

    fn topic_ids(
        &self,
        topics: &[String],
        timeout: Duration,
    ) -> Result<BTreeMap<String, Option<String>>, KafkaError> {
        super::native::topic_ids(self.consumer.client(), topics, timeout)
    }

    fn take_identity_check(&self) -> bool {
        self.context().take_identity_check()
    }

    fn note_error(&self, error: &KafkaError) {
        self.context().note_error(error, &error.to_string());
    }

    fn take_authorization_refused(&self) -> bool {
        self.context().take_authorization_refused()
    }

    fn brokers_up(&self) -> Option<bool> {
        self.context().brokers_up()
    }

    fn connect_failure(&self) -> Option<String> {
        self.context().connect_failure().map(|f| f.to_string())
    }

    fn set_paused_ends(&self, ends: HashMap<(String, i32), i64>) {
        self.context().set_paused_ends(ends);
    }

    fn set_closing(&self) {
        self.context().set_closing();
    }
}
