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
use std::time::Duration;

use rdkafka::Offset;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::consumer::port::{self, KafkaPort, Positions};
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

/// Starts the poll task. It stops when `stop` is set (and the returned waker woken) or the
/// event receiver is gone; the consumer is closed where its last reference is dropped, which
/// the supervisor arranges to be this task's last round, on the blocking pool.
/// The task's handle yields why a round panicked, if one did.
pub(crate) fn spawn_poll_loop<P: KafkaPort>(
    name: &str,
    consumer: Arc<P>,
    events: mpsc::Sender<ConsumerEvent>,
    stop: Arc<AtomicBool>,
    flow: FlowQueue,
) -> std::io::Result<(tokio::task::JoinHandle<Option<String>>, Waker)> {
    let (wake, waker) = QueueWake::enable(&consumer)?;
    let ready = wake.register()?;
    let rebalances = consumer.rebalances();
    let mut poller = Poller {
        wake,
        consumer,
        name: Arc::from(name),
        flow,
        events: Handoff {
            events,
            outbox: Vec::new(),
        },
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
            let round = port::call::<P, _>(move || {
                let go_on = poller.rounds_while_active(&stop_);
                (poller, go_on)
            });
            // A round that panicked (a callback, librdkafka's bindings) took the consumer's
            // reference with it: the task ends, and the supervisor restarts the connection.
            let (back, go_on) = match round.await {
                Ok(back) => back,
                Err(reason) => return Some(reason),
            };
            poller = back;
            if !go_on || !poller.events.flush().await {
                break;
            }
        }
        drop(ready);
        // librdkafka stops writing to the eventfd before the consumer closes (field order).
        let _ = port::call::<P, _>(move || drop(poller)).await;
        None
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
struct Poller<P: KafkaPort> {
    wake: QueueWake<P>,
    consumer: Arc<P>,
    name: Arc<str>,
    flow: FlowQueue,
    events: Handoff,
    last_positions: Instant,
    sent_positions: Option<Positions>,
    rebalances: u64,
    last_activity: Instant,
}

/// Where a round's events go to the supervisor.
struct Handoff {
    events: mpsc::Sender<ConsumerEvent>,
    /// Events of a round on the runtime's own thread, sent once it is over (see
    /// [`Handoff::send`]).
    outbox: Vec<ConsumerEvent>,
}

impl Handoff {
    /// Hands `event` to the supervisor: waits for room in the channel on this thread of the
    /// blocking pool, or, for a port `P` called on the runtime's own thread, keeps it for the
    /// task to send once the round is over ([`Handoff::flush`]). Err: the supervisor is gone.
    fn send<P: KafkaPort>(&mut self, event: ConsumerEvent) -> Result<(), ()> {
        if P::BLOCKS {
            self.events.blocking_send(event).map_err(drop)
        } else {
            self.outbox.push(event);
            Ok(())
        }
    }

    /// Sends what a round on the runtime's own thread kept, in order. False when the
    /// supervisor is gone.
    async fn flush(&mut self) -> bool {
        for event in std::mem::take(&mut self.outbox) {
            if self.events.send(event).await.is_err() {
                return false;
            }
        }
        true
    }
}

impl<P: KafkaPort> Poller<P> {
    /// How long to wait for librdkafka before the next round. A quiet connection's wait is
    /// drawn between 80% and 120% of [`QUIET_POLL`]: connections started together would
    /// otherwise all wake in the same millisecond, each round wanting a thread of the
    /// blocking pool at once. (What kept 103 pool threads alive for 100 idle connections was
    /// the pool's keep-alive, see `BLOCKING_KEEP_ALIVE` in main.rs.)
    fn timeout(&self) -> Duration {
        let wait = if self.last_activity.elapsed() < SETTLE {
            POLL_TIMEOUT
        } else {
            QUIET_POLL.mul_f64(0.8 + 0.4 * crate::clock::draw())
        };
        // A failed seek is tried again when it is due, not at a quiet connection's next
        // wake-up: the partition takes nothing until one succeeds.
        self.flow.next_retry().map_or(wait, |due| {
            wait.min(due.saturating_duration_since(Instant::now()))
        })
    }

    /// Rounds on this thread of the blocking pool, waiting for librdkafka here between them,
    /// for as long as the connection is active; back to the runtime once it is quiet. A busy
    /// connection then costs what a thread of its own did (no hop through the runtime per
    /// batch: handing each round to the pool made a drain by key 5% slower and 10% dearer
    /// per event); a quiet one holds no thread. False when the supervisor is gone.
    ///
    /// A port whose calls never block does one round: its thread is the runtime's own.
    fn rounds_while_active(&mut self, stop: &AtomicBool) -> bool {
        loop {
            if !self.round() {
                return false;
            }
            if !P::BLOCKS || stop.load(Ordering::SeqCst) || self.last_activity.elapsed() >= SETTLE {
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
        // A seek resets librdkafka's position of the partition to none, as an assignment
        // does (librdkafka #3567): like a rebalance, it ends the batch, and the positions
        // are read before a later poll can move them past a transaction marker of the log
        // sought (the core trusts a position only after such a none).
        let mut sought = self.flow.apply_pending(&self.name, consumer);
        let mut seeked = !sought.is_empty();
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
        while !seeked && batch.len() < BATCH {
            // A pause decided meanwhile takes effect before the next poll: librdkafka drops
            // what it fetched for the partition beyond the messages polled so far.
            let moved = self.flow.apply_pending(&self.name, consumer);
            if !moved.is_empty() {
                sought.extend(moved);
                seeked = true;
                break;
            }
            match consumer.poll() {
                Some(Ok(msg)) => {
                    // librdkafka hinted at a topic deleted or created again before this
                    // message reached the queue: the hint goes first, so that the connector
                    // checks the log before it runs or commits anything read after it.
                    if consumer.take_identity_check() {
                        if !batch.is_empty()
                            && self
                                .events
                                .send::<P>(ConsumerEvent::Messages(std::mem::take(&mut batch)))
                                .is_err()
                        {
                            return false;
                        }
                        if self.events.send::<P>(ConsumerEvent::IdentityHint).is_err() {
                            return false;
                        }
                    }
                    batch.push(msg);
                }
                Some(Err(e)) => {
                    error = Some(e);
                    break;
                }
                None => {
                    let now_rebalances = consumer.rebalances();
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
        // librdkafka reset a position to none (an assignment or a seek): it is read now.
        let reset = rebalanced || seeked;
        if !idle || reset {
            self.last_activity = Instant::now();
        }
        if !batch.is_empty()
            && self
                .events
                .send::<P>(ConsumerEvent::Messages(batch))
                .is_err()
        {
            return false;
        }
        if let Some(e) = error {
            if self.events.send::<P>(ConsumerEvent::Error(e)).is_err() {
                return false;
            }
        }
        // After the messages read before the moves, before any read after them.
        if !sought.is_empty()
            && self
                .events
                .send::<P>(ConsumerEvent::Sought(sought))
                .is_err()
        {
            return false;
        }
        // While active as before; once quiet, every QUIET_POLL, and sent only when they moved.
        let due = if reset {
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
        let Some(positions) = consumer.positions() else {
            return true;
        };
        // After a seek they are sent even if they look unchanged: the core restarted the
        // partition and waits for a none it may already have been sent before.
        let moved = seeked || self.sent_positions.as_ref() != Some(&positions);
        if moved {
            self.last_activity = Instant::now();
        } else if !active {
            return true;
        }
        self.sent_positions = Some(positions.clone());
        positions.is_empty()
            || self
                .events
                .send::<P>(ConsumerEvent::Positions(positions))
                .is_ok()
    }
}

/// A pause or resume of partitions.
pub(crate) struct FlowOp {
    /// Pause (true) or resume (false).
    pub pause: bool,
    /// The partitions.
    pub partitions: Vec<TopicPartition>,
}

/// What the poll task is to do to the consumer between two polls, in the order decided.
pub(crate) enum FlowCmd {
    /// Pause or resume partitions.
    Flow(FlowOp),
    /// Move a partition's position (its topic was created again: to where
    /// `auto.offset.reset` says).
    Seek(TopicPartition, Offset),
}

/// How long a seek may wait for the partition's fetcher.
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);

/// Pauses, resumes and seeks for the poll task, which carries them out before its next
/// poll, in the order decided.
///
/// A pause takes effect only for what has not been polled yet: librdkafka drops what it
/// fetched for the partition beyond the application's position (a version barrier) and
/// fetches from there on resume. It fetches a partition a response at a time, each of
/// thousands of records (a whole record batch, however small `max.partition.fetch.bytes`),
/// and polling hands those over faster than any other thread could pause: applied by an ops
/// task 10-50 ms after it was decided, with 64 partitions filling at once, the pauses let in
/// twice the byte budget (`a_million_message_backlog_keeps_memory_bounded`). Between two
/// polls, only the messages already on their way to the core (at most
/// [`EVENT_CHANNEL`](crate::consumer::EVENT_CHANNEL) batches) still arrive. Pauses and
/// resumes take microseconds (librdkafka's broker thread applies them after the call
/// returns); a seek waits for the partition's fetcher.
#[derive(Clone, Default)]
pub(crate) struct FlowQueue {
    inner: Arc<FlowInner>,
}

#[derive(Default)]
struct FlowInner {
    cmds: std::sync::Mutex<Vec<FlowCmd>>,
    /// Set while `cmds` is not empty, or a failed seek waits to be tried again: checked
    /// before every poll without the lock.
    pending: AtomicBool,
    /// Seeks that failed (librdkafka's timed out waiting for the fetcher, or the partition
    /// could not move then), to try again: the partition, where to, the attempts so far and
    /// when the next may be made. Until one succeeds the partition is not said to have
    /// moved, so the core keeps dropping what arrives for it.
    retries: std::sync::Mutex<Vec<SeekRetry>>,
}

/// A failed seek to try again.
struct SeekRetry {
    tp: TopicPartition,
    to: Offset,
    attempts: u32,
    due: Instant,
}

/// Failed attempts of a seek after which it is logged as an ERROR (once; then a WARN every
/// [`SEEK_ATTEMPTS_LOUD`] more). A seek is never given up while its partition is assigned:
/// the partition takes nothing until it moves, and a cluster that refuses for minutes and
/// recovers needs no rebalance to go on.
const SEEK_ATTEMPTS_LOUD: u32 = 20;

/// The wait before a failed seek's next attempt, times its attempts so far, up to
/// [`SEEK_RETRY_MAX`].
const SEEK_RETRY_STEP: Duration = Duration::from_millis(250);

/// The longest wait between two attempts of a seek.
const SEEK_RETRY_MAX: Duration = Duration::from_secs(5);

impl FlowQueue {
    /// Queues `cmd` after those queued before; the caller wakes the poll task.
    pub(crate) fn push(&self, cmd: FlowCmd) {
        let mut cmds = self
            .inner
            .cmds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cmds.push(cmd);
        self.inner.pending.store(true, Ordering::Release);
    }

    /// Drops the seeks of `revoked` partitions, queued or waiting to be tried again: they
    /// were for an assignment that ended (a later one of the same partition starts from the
    /// group's commit).
    pub(crate) fn forget(&self, revoked: &[TopicPartition]) {
        lock(&self.inner.retries).retain(|r| !revoked.contains(&r.tp));
        lock(&self.inner.cmds)
            .retain(|c| !matches!(c, FlowCmd::Seek(tp, _) if revoked.contains(tp)));
    }

    /// When the earliest failed seek may be tried again, if one waits.
    fn next_retry(&self) -> Option<Instant> {
        lock(&self.inner.retries).iter().map(|r| r.due).min()
    }

    /// Carries out what was queued, in order, on this thread. Returns the partitions whose
    /// position it moved (seeks).
    pub(crate) fn apply_pending<P: KafkaPort>(
        &self,
        connection: &str,
        consumer: &P,
    ) -> Vec<TopicPartition> {
        if !self.inner.pending.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut retries = lock(&self.inner.retries);
        let cmds = {
            let mut cmds = lock(&self.inner.cmds);
            self.inner
                .pending
                .store(!retries.is_empty(), Ordering::Release);
            std::mem::take(&mut *cmds)
        };
        let mut sought = Vec::new();
        let now = Instant::now();
        let (due, later): (Vec<SeekRetry>, Vec<SeekRetry>) = std::mem::take(&mut *retries)
            .into_iter()
            .partition(|r| r.due <= now);
        *retries = later;
        let mut seek = |tp: TopicPartition, to: Offset, attempts: u32| {
            // A seek that failed may not have moved the position: the partition is said to
            // have moved only once one succeeds, and until then the core takes nothing of
            // it (records read from the old position would run as the new log's first).
            let Err(e) = consumer.seek(&tp, to, SEEK_TIMEOUT) else {
                sought.push(tp);
                return;
            };
            let attempts = attempts.saturating_add(1);
            if attempts == SEEK_ATTEMPTS_LOUD {
                tracing::error!(connection, topic = %tp.topic, partition = tp.partition, error = %e, attempts,
                    "cannot move the partition's position; it takes nothing until it moves: trying again every 5 s");
            } else if attempts < SEEK_ATTEMPTS_LOUD || attempts.is_multiple_of(SEEK_ATTEMPTS_LOUD) {
                tracing::warn!(connection, topic = %tp.topic, partition = tp.partition, error = %e, attempts, "cannot move the partition's position; trying again");
            }
            retries.push(SeekRetry {
                tp,
                to,
                attempts,
                due: now + (SEEK_RETRY_STEP * attempts).min(SEEK_RETRY_MAX),
            });
        };
        for r in due {
            seek(r.tp, r.to, r.attempts);
        }
        for cmd in cmds {
            match cmd {
                FlowCmd::Flow(op) => apply_flow(connection, consumer, op),
                FlowCmd::Seek(tp, to) => seek(tp, to, 0),
            }
        }
        if !retries.is_empty() {
            self.inner.pending.store(true, Ordering::Release);
        }
        sought
    }
}

/// Locks `m`, whatever a panic left in it.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Pauses or resumes `op`'s partitions now, on this thread.
pub(crate) fn apply_flow<P: KafkaPort>(connection: &str, consumer: &P, op: FlowOp) {
    if op.partitions.is_empty() {
        return;
    }
    if let Err(e) = consumer.flow(op.pause, &op.partitions) {
        let what = if op.pause { "pause" } else { "resume" };
        tracing::warn!(connection, error = %e, "cannot {what} partitions");
    }
}
