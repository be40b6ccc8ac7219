//! The task that polls librdkafka and forwards what it returns, in order.
//!
//! librdkafka's poll runs callbacks (rebalance, logs, commits) on the polling thread, and the
//! revoke callback blocks until the async side has drained; that must never happen on a
//! runtime worker, so each round of polling runs on tokio's blocking pool
//! (`spawn_blocking`). Between rounds the connection holds no thread: its task waits on the
//! runtime's reactor for librdkafka's queue eventfd ([`QueueWake`]: written when the
//! consumer queue gets an element), or for a timer. A thousand idle connections cost a
//! thousand parked tasks, not a thousand threads. Messages are handed over in batches of
//! what librdkafka has ready.
//!
//! While the connection is active (messages, a rebalance or a moving position within
//! [`SETTLE`]) the task also wakes every 100 ms and sends the consumer's positions, at least
//! every 200 ms and after each idle wake: sent after the messages they follow, they let the
//! offset tracker move past transaction markers and aborted records, which arrive as no
//! message. Once quiet it wakes only every [`QUIET_POLL`] (a consumer poll within
//! `max.poll.interval.ms`, and the positions, sent when they moved).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Offset;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

use crate::consumer::context::ConnectorContext;
use crate::consumer::queue_wake::{self, QueueWake, Waker};
use crate::consumer::ConsumerEvent;
use crate::dispatch::event::TopicPartition;

const POLL_TIMEOUT: Duration = Duration::from_millis(100);
const POSITION_INTERVAL: Duration = Duration::from_millis(200);
/// How long after its last activity a connection counts as active.
pub(crate) const SETTLE: Duration = Duration::from_secs(2);
/// How often a quiet connection's poll task wakes (on average): well within
/// `max.poll.interval.ms` (300 s by default), past which librdkafka would leave the group.
pub(crate) const QUIET_POLL: Duration = Duration::from_secs(5);

/// Most messages handed over at once. With the supervisor's event channel of
/// [`EVENT_CHANNEL`](crate::consumer::EVENT_CHANNEL) events, at most 1,024 messages sit between librdkafka
/// and the partition queues, where the byte budget counts them.
pub(crate) const BATCH: usize = 128;

type Positions = Vec<(TopicPartition, Option<i64>)>;

/// Starts the poll task. It stops when `stop` is set (and the returned waker woken) or the
/// event receiver is gone; the consumer is closed where its last reference is dropped, which
/// the supervisor arranges to be this task's last round, on the blocking pool.
pub(crate) fn spawn_poll_loop(
    consumer: Arc<BaseConsumer<ConnectorContext>>,
    events: mpsc::Sender<ConsumerEvent>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<(tokio::task::JoinHandle<()>, Waker)> {
    let (wake, waker) = QueueWake::enable(&consumer)?;
    let ready = wake.register()?;
    let rebalances = consumer.context().rebalances();
    let mut poller = Poller {
        wake,
        consumer,
        events,
        last_positions: Instant::now(),
        sent_positions: None,
        rebalances,
        last_activity: Instant::now(),
    };
    let handle = tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            // librdkafka writes only when an element lands on an empty queue: with elements
            // left (a full batch handed over) there is no wake-up to wait for.
            if poller.wake.queued() == 0 {
                wait(&ready, poller.timeout()).await;
            }
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let stop_ = Arc::clone(&stop);
            let round = tokio::task::spawn_blocking(move || {
                let go_on = poller.rounds_while_active(&stop_);
                (poller, go_on)
            });
            // A round that panicked took the consumer's reference with it.
            let Ok((back, go_on)) = round.await else {
                return;
            };
            poller = back;
            if !go_on {
                break;
            }
        }
        drop(ready);
        // librdkafka stops writing to the eventfd before the consumer closes (field order).
        let _ = tokio::task::spawn_blocking(move || drop(poller)).await;
    });
    Ok((handle, waker))
}

/// Waits until the eventfd was written (and clears it), or `timeout`.
async fn wait(ready: &AsyncFd<OwnedFd>, timeout: Duration) {
    let written = async {
        loop {
            let Ok(mut guard) = ready.readable().await else {
                // Not pollable any more: fall back to the timer.
                return std::future::pending::<()>().await;
            };
            // Read until empty: readiness is cleared only once a read would block, so a
            // write after that read wakes the next wait.
            let mut read_any = false;
            let _: Result<std::io::Result<()>, _> = guard.try_io(|fd| loop {
                queue_wake::read(fd.get_ref())?;
                read_any = true;
            });
            if read_any {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(timeout, written).await;
}

/// One connection's polling state, moved onto the blocking pool for each round. The queue's
/// eventfd is declared first so that it is dropped, and librdkafka stops writing to it,
/// before the consumer's last reference.
struct Poller {
    wake: QueueWake,
    consumer: Arc<BaseConsumer<ConnectorContext>>,
    events: mpsc::Sender<ConsumerEvent>,
    last_positions: Instant,
    sent_positions: Option<Positions>,
    rebalances: u64,
    last_activity: Instant,
}

impl Poller {
    /// How long to wait for librdkafka before the next round. A quiet connection's wait is
    /// drawn between 80% and 120% of [`QUIET_POLL`]: connections started together would
    /// otherwise all wake in the same millisecond, each round wanting a thread of the
    /// blocking pool at once. (What kept 103 pool threads alive for 100 idle connections was
    /// the pool's keep-alive, see `BLOCKING_KEEP_ALIVE` in main.rs.)
    fn timeout(&self) -> Duration {
        if self.last_activity.elapsed() < SETTLE {
            POLL_TIMEOUT
        } else {
            QUIET_POLL.mul_f64(0.8 + 0.4 * rand::random::<f64>())
        }
    }

    /// Rounds on this thread of the blocking pool, waiting for librdkafka here between them,
    /// for as long as the connection is active; back to the runtime once it is quiet. A busy
    /// connection then costs what a thread of its own did (no hop through the runtime per
    /// batch: handing each round to the pool made a drain by key 5% slower and 10% dearer
    /// per event); a quiet one holds no thread. False when the supervisor is gone.
    fn rounds_while_active(&mut self, stop: &AtomicBool) -> bool {
        loop {
            if !self.round() {
                return false;
            }
            if stop.load(Ordering::SeqCst) || self.last_activity.elapsed() >= SETTLE {
                return true;
            }
            if self.wake.queued() == 0 {
                self.wake.wait(POLL_TIMEOUT);
            }
        }
    }

    /// Polls what is ready and hands it over, then the positions when due. False when the
    /// supervisor is gone.
    fn round(&mut self) -> bool {
        let consumer = &*self.consumer;
        let active = self.last_activity.elapsed() < SETTLE;
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
                    if now_rebalances != self.rebalances {
                        self.rebalances = now_rebalances;
                        rebalanced = true;
                        break;
                    }
                    if self.wake.queued() == 0 {
                        break;
                    }
                }
            }
        }
        let idle = batch.is_empty() && error.is_none();
        if !idle || rebalanced {
            self.last_activity = Instant::now();
        }
        if !batch.is_empty()
            && self
                .events
                .blocking_send(ConsumerEvent::Messages(batch))
                .is_err()
        {
            return false;
        }
        if let Some(e) = error {
            if self.events.blocking_send(ConsumerEvent::Error(e)).is_err() {
                return false;
            }
        }
        // While active as before; once quiet, every QUIET_POLL, and sent only when they moved.
        let due = if rebalanced {
            true
        } else if active || self.last_activity.elapsed() < SETTLE {
            idle || self.last_positions.elapsed() >= POSITION_INTERVAL
        } else {
            self.last_positions.elapsed() >= QUIET_POLL
        };
        if !due {
            return true;
        }
        self.last_positions = Instant::now();
        let Some(positions) = positions(consumer) else {
            return true;
        };
        let moved = self.sent_positions.as_ref() != Some(&positions);
        if moved {
            self.last_activity = Instant::now();
        } else if !active {
            return true;
        }
        self.sent_positions = Some(positions.clone());
        positions.is_empty()
            || self
                .events
                .blocking_send(ConsumerEvent::Positions(positions))
                .is_ok()
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

/// A pause or resume of partitions, for the ops task.
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
