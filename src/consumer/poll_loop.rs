//! The blocking thread that polls librdkafka and forwards what it returns, in order.
//!
//! librdkafka's poll runs callbacks (rebalance, logs, commits) on the polling thread, and the
//! revoke callback blocks until the async side has drained; that must never happen on a
//! runtime worker, so polling has its own OS thread. Messages are handed over in batches of
//! what librdkafka has ready.
//!
//! The thread sleeps until librdkafka has something for it ([`QueueWake`]: an eventfd written
//! when the consumer queue gets an element), not on a timer. While the connection is active
//! (messages, a rebalance or a moving position within [`SETTLE`]) it also wakes every
//! 100 ms and sends the consumer's positions, at least every 200 ms and after each idle wake:
//! sent after the messages they follow, they let the offset tracker move past transaction
//! markers and aborted records, which arrive as no message. Once quiet it wakes only every
//! [`QUIET_POLL`] (a consumer poll within `max.poll.interval.ms`, and the positions, sent
//! when they moved).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Offset;
use tokio::sync::mpsc;

use crate::consumer::context::ConnectorContext;
use crate::consumer::queue_wake::{QueueWake, Waker};
use crate::consumer::ConsumerEvent;
use crate::dispatch::event::TopicPartition;

const POLL_TIMEOUT: Duration = Duration::from_millis(100);
const POSITION_INTERVAL: Duration = Duration::from_millis(200);
/// How long after its last activity a connection counts as active.
pub(crate) const SETTLE: Duration = Duration::from_secs(2);
/// How often a quiet connection's poll thread wakes: well within `max.poll.interval.ms`
/// (300 s by default), past which librdkafka would leave the group.
pub(crate) const QUIET_POLL: Duration = Duration::from_secs(5);

/// Most messages handed over at once. With the supervisor's event channel of
/// [`EVENT_CHANNEL`](crate::consumer::EVENT_CHANNEL) events, at most 1,024 messages sit between librdkafka
/// and the partition queues, where the byte budget counts them.
pub(crate) const BATCH: usize = 128;

type Positions = Vec<(TopicPartition, Option<i64>)>;

/// Starts the poll thread. It stops when `stop` is set (and the returned waker woken) or the
/// event receiver is gone; the consumer is closed where its last reference is dropped, which
/// the supervisor arranges to be this thread.
pub(crate) fn spawn_poll_loop(
    connection: &str,
    consumer: Arc<BaseConsumer<ConnectorContext>>,
    events: mpsc::Sender<ConsumerEvent>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<(JoinHandle<()>, Waker)> {
    let (wake, waker) = QueueWake::enable(&consumer)?;
    let handle = std::thread::Builder::new()
        .name(format!("kafka-poll-{connection}"))
        .spawn(move || {
            poll_until_stopped(&consumer, &wake, &events, &stop);
            // librdkafka stops writing to the eventfd before the consumer closes.
            drop(wake);
            drop(consumer);
        })?;
    Ok((handle, waker))
}

fn poll_until_stopped(
    consumer: &BaseConsumer<ConnectorContext>,
    wake: &QueueWake,
    events: &mpsc::Sender<ConsumerEvent>,
    stop: &AtomicBool,
) {
    let mut last_positions = Instant::now();
    let mut sent_positions: Option<Positions> = None;
    let mut rebalances = consumer.context().rebalances();
    let mut last_activity = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let active = last_activity.elapsed() < SETTLE;
        // librdkafka writes only when an element lands on an empty queue: with elements left
        // (a full batch handed over) there is no wake-up to wait for.
        if wake.queued() == 0 {
            wake.wait(if active { POLL_TIMEOUT } else { QUIET_POLL });
        }
        if stop.load(Ordering::SeqCst) {
            break;
        }
        // What is ready, up to BATCH messages: one hand-over (and one wake-up of the
        // supervisor) per batch, not per message. A poll that served an event (a log,
        // statistics, a rebalance) returns nothing, so the queue's length says when to stop;
        // a poll of an empty queue re-arms the eventfd.
        //
        // A poll that served a rebalance ends the batch: the positions are read before any
        // later poll can move them, so a new assignment's first position is librdkafka's
        // "none yet", which tells the core it started from the commit. Polling on could
        // consume a transaction marker or an aborted tail of the new assignment first (each
        // moves the position as it is polled), and a position ahead of the commit with no
        // message of the assignment is not trusted: the commit would stay behind the marker.
        let mut batch = Vec::new();
        let mut error = None;
        let mut rebalanced = false;
        while batch.len() < BATCH {
            match consumer.poll(Duration::ZERO) {
                Some(Ok(msg)) => batch.push(msg.detach()),
                Some(Err(e)) => {
                    error = Some(e);
                    break;
                }
                None => {
                    let now_rebalances = consumer.context().rebalances();
                    if now_rebalances != rebalances {
                        rebalances = now_rebalances;
                        rebalanced = true;
                        break;
                    }
                    if wake.queued() == 0 {
                        break;
                    }
                }
            }
        }
        let idle = batch.is_empty() && error.is_none();
        if !idle || rebalanced {
            last_activity = Instant::now();
        }
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
        // While active as before; once quiet, every QUIET_POLL, and sent only when they moved.
        let due = if rebalanced {
            true
        } else if active || last_activity.elapsed() < SETTLE {
            idle || last_positions.elapsed() >= POSITION_INTERVAL
        } else {
            last_positions.elapsed() >= QUIET_POLL
        };
        if !due {
            continue;
        }
        last_positions = Instant::now();
        let Some(positions) = positions(consumer) else {
            continue;
        };
        let moved = sent_positions.as_ref() != Some(&positions);
        if moved {
            last_activity = Instant::now();
        } else if !active {
            continue;
        }
        sent_positions = Some(positions.clone());
        if !positions.is_empty()
            && events
                .blocking_send(ConsumerEvent::Positions(positions))
                .is_err()
        {
            break;
        }
    }
}

/// The consumer's positions (a local query, no request to the broker).
fn positions(consumer: &BaseConsumer<ConnectorContext>) -> Option<Positions> {
    let tpl = consumer.position().ok()?;
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

/// A pause or resume of partitions, for the ops thread.
///
/// librdkafka's pause and resume wait for each partition's broker thread to answer (and a
/// pause purges what was prefetched), so made on the supervisor's task they held up the loop
/// that starts runs: with the default buffer of 1,000 messages a partition the drain was
/// capped near 14k events/s with two runs in flight. They are applied off the runtime, in
/// the order decided.
pub(crate) struct FlowOp {
    /// Pause (true) or resume (false).
    pub pause: bool,
    /// The partitions.
    pub partitions: rdkafka::TopicPartitionList,
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
