//! The blocking thread that polls librdkafka and forwards what it returns, in order.
//!
//! librdkafka's poll runs callbacks (rebalance, logs, commits) on the polling thread, and the
//! revoke callback blocks until the async side has drained; that must never happen on a
//! runtime worker, so polling has its own OS thread. Messages are handed over in batches of
//! what librdkafka has ready. After each idle poll, and at least every
//! 200 ms, it sends the consumer's positions: sent after the messages they follow, they let
//! the offset tracker move past transaction markers and aborted records.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Offset;
use tokio::sync::mpsc;

use crate::consumer::context::ConnectorContext;
use crate::consumer::ConsumerEvent;
use crate::dispatch::event::TopicPartition;

const POLL_TIMEOUT: Duration = Duration::from_millis(100);
const POSITION_INTERVAL: Duration = Duration::from_millis(200);

/// Most messages handed over at once. With the supervisor's event channel of
/// [`EVENT_CHANNEL`](crate::consumer::EVENT_CHANNEL) events, at most 1,024 messages sit between librdkafka
/// and the partition queues, where the byte budget counts them.
pub(crate) const BATCH: usize = 128;

/// Starts the poll thread. It stops when `stop` is set or the event receiver is gone; the
/// consumer is closed where its last reference is dropped, which the supervisor arranges to
/// be this thread.
pub(crate) fn spawn_poll_loop(
    connection: &str,
    consumer: Arc<BaseConsumer<ConnectorContext>>,
    events: mpsc::Sender<ConsumerEvent>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("kafka-poll-{connection}"))
        .spawn(move || {
            let mut last_positions = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                // What one poll returns, and then what is ready at once, up to BATCH messages:
                // one hand-over (and one wake-up of the supervisor) per batch, not per message.
                let mut batch = Vec::new();
                let mut error = None;
                let mut timeout = POLL_TIMEOUT;
                while batch.len() < BATCH {
                    match consumer.poll(timeout) {
                        Some(Ok(msg)) => batch.push(msg.detach()),
                        Some(Err(e)) => {
                            error = Some(e);
                            break;
                        }
                        None => break,
                    }
                    timeout = Duration::ZERO;
                }
                let idle = batch.is_empty() && error.is_none();
                if !batch.is_empty()
                    && events
                        .blocking_send(ConsumerEvent::Messages(batch))
                        .is_err()
                {
                    break;
                }
                if let Some(e) = error {
                    if events.blocking_send(ConsumerEvent::Error(e)).is_err() {
                        break;
                    }
                }
                if idle || last_positions.elapsed() >= POSITION_INTERVAL {
                    last_positions = Instant::now();
                    if let Ok(tpl) = consumer.position() {
                        let positions: Vec<(TopicPartition, Option<i64>)> = tpl
                            .elements()
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
                            .collect();
                        if !positions.is_empty()
                            && events
                                .blocking_send(ConsumerEvent::Positions(positions))
                                .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            drop(consumer);
        })
}

/// A pause or resume of partitions, for the flow thread.
pub(crate) struct FlowOp {
    /// Pause (true) or resume (false).
    pub pause: bool,
    /// The partitions.
    pub partitions: rdkafka::TopicPartitionList,
}

/// Starts the connection's flow thread: it applies pauses and resumes in the order they were
/// decided, off the runtime. librdkafka's pause and resume wait for each partition's broker
/// thread to answer (and a pause purges what was prefetched), so made on the supervisor's task
/// they held up the loop that starts runs: with the default buffer of 1,000 messages a
/// partition the drain was capped near 14k events/s with two runs in flight. It ends when the
/// sender is dropped.
pub(crate) fn spawn_flow_thread(
    connection: &str,
    consumer: Arc<BaseConsumer<ConnectorContext>>,
) -> std::io::Result<(std::sync::mpsc::Sender<FlowOp>, JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::channel::<FlowOp>();
    let name = connection.to_owned();
    let handle = std::thread::Builder::new()
        .name(format!("kafka-flow-{connection}"))
        .spawn(move || {
            while let Ok(op) = rx.recv() {
                apply_flow(&name, &consumer, op);
            }
            drop(consumer);
        })?;
    Ok((tx, handle))
}

/// Pauses or resumes `op`'s partitions now, on this thread.
pub(crate) fn apply_flow(connection: &str, consumer: &BaseConsumer<ConnectorContext>, op: FlowOp) {
    if op.partitions.count() == 0 {
        return;
    }
    let result = if op.pause {
        consumer.pause(&op.partitions)
    } else {
        consumer.resume(&op.partitions)
    };
    if let Err(e) = result {
        let what = if op.pause { "pause" } else { "resume" };
        tracing::warn!(connection, error = %e, "cannot {what} partitions");
    }
}
