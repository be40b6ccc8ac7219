//! Starting runs on the runtime and reporting their end: the one place where a decided
//! [`Start`] becomes a task. A run is 1..n records of one partition (a single-record trigger's
//! run is a batch of one); its end is one [`RunFinished`] with every record's outcome. The
//! core's [`RunSignal`]s reach the runs here, through each assignment's tokens.

use std::collections::HashMap;
use std::sync::Arc;

use futures::FutureExt as _;
use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::{attempt, body, TriggerRuntime, WorkOutcome};
use crate::core::partitions::{PartitionId, Start};
use crate::core::shell::{AssignmentId, Record, RunSignal, Shell};
use crate::telemetry::metrics;

type Trigger = Arc<TriggerRuntime>;

/// The daemon's [`Shell`]: rdkafka's messages, the triggers' runtimes and their semaphores'
/// permits.
#[derive(Debug)]
pub(crate) struct KafkaShell;

impl Shell for KafkaShell {
    type Trigger = Trigger;
    type Permit = OwnedSemaphorePermit;
    type Record = OwnedMessage;

    /// None while an operator paused the trigger: nothing of it starts (its partitions wait,
    /// starved, until the resume wakes them).
    fn try_permit(trigger: &Trigger) -> Option<OwnedSemaphorePermit> {
        if trigger.control.paused() {
            return None;
        }
        Arc::clone(&trigger.permits).try_acquire_owned().ok()
    }
}

impl Record for OwnedMessage {
    fn topic(&self) -> &str {
        Message::topic(self)
    }
    fn partition(&self) -> i32 {
        Message::partition(self)
    }
    fn offset(&self) -> i64 {
        Message::offset(self)
    }
    fn key(&self) -> Option<&[u8]> {
        Message::key(self)
    }
    fn payload_len(&self) -> usize {
        Message::payload(self).map_or(0, <[u8]>::len)
    }
}

/// How long a run that ended without an outcome outside a revoke waits before its records
/// are given back to start again.
const RETURN_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// What the runs of one assignment are told: stop retrying (`drain`), give up (`cancel`).
#[derive(Default)]
struct Tokens {
    drain: CancellationToken,
    cancel: CancellationToken,
}

impl Tokens {
    /// Give up, which includes retrying no more.
    fn abandon(&self) {
        self.drain.cancel();
        self.cancel.cancel();
    }
}

/// What a run tells the supervisor.
pub(crate) enum WorkerEvent {
    /// A started run ended.
    Finished(RunFinished),
    /// A run of the trigger with this index gave its permit back while it waits to retry:
    /// other partitions may start.
    Yielded(usize),
}

/// A run's end: each record's offset and outcome, in offset order.
pub(crate) struct RunFinished {
    pub(crate) id: PartitionId,
    /// The partition's assignment the run belongs to (a finished run of an earlier one is
    /// ignored).
    pub(crate) generation: u64,
    /// The trigger's index (its runs-in-flight gauge).
    pub(crate) trigger: usize,
    /// The key the run held (single-record runs; a batch holds none).
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) records: Vec<(i64, WorkOutcome)>,
    /// Records the run ended without an outcome for, outside a revoke or stop (its task
    /// panicked outside an attempt, say): given back to start again, before the later
    /// records of their key. Not among `records`.
    pub(crate) returned: Vec<OwnedMessage>,
    /// The run's `consume` span (disabled unless traces are exported).
    pub(crate) span: tracing::Span,
}

/// Spawns runs and collects their ends.
pub(crate) struct Runs {
    connection: String,
    group: String,
    tx: mpsc::UnboundedSender<WorkerEvent>,
    /// Every run's task: shutdown waits on it.
    pub(crate) tasks: TaskTracker,
    /// Each trigger's runs-in-flight gauge, by index; registered when the connection runs
    /// (the recorder is installed by then).
    in_flight: Vec<metrics::Gauge>,
    /// Each current assignment's tokens, until the core abandons it.
    tokens: HashMap<AssignmentId, Tokens>,
}

impl Runs {
    /// Runs of `connection` (consumer group `group`); their ends arrive on the receiver.
    pub(crate) fn new(
        connection: &str,
        group: &str,
    ) -> (Self, mpsc::UnboundedReceiver<WorkerEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let runs = Self {
            connection: connection.to_owned(),
            group: group.to_owned(),
            tx,
            tasks: TaskTracker::new(),
            in_flight: Vec::new(),
            tokens: HashMap::new(),
        };
        (runs, rx)
    }

    /// Registers each trigger's runs-in-flight gauge.
    pub(crate) fn register(&mut self, triggers: &[Trigger]) {
        self.in_flight = triggers
            .iter()
            .map(|t| metrics::in_flight_gauge(&self.connection, &t.name))
            .collect();
    }

    /// Moves the runs-in-flight gauge of the trigger with this index by `delta`.
    pub(crate) fn in_flight_add(&self, trigger: usize, delta: f64) {
        if let Some(g) = self.in_flight.get(trigger) {
            g.increment(delta);
        }
    }

    /// A run ended: its records' offsets and whether each is handled, for the core; its
    /// records leave the runs-in-flight gauge.
    pub(crate) fn finished(&self, f: &RunFinished) -> Vec<(i64, bool)> {
        self.in_flight_add(f.trigger, -((f.records.len() + f.returned.len()) as f64));
        f.records
            .iter()
            .map(|(offset, outcome)| (*offset, outcome.is_handled()))
            .collect()
    }

    /// Counts a run's handled records by outcome, and closes its trace with each commit.
    pub(crate) fn report(&self, trigger: &TriggerRuntime, f: &RunFinished) {
        let metrics = trigger.metrics();
        for (offset, outcome) in &f.records {
            if !outcome.is_handled() {
                continue;
            }
            metrics.handled(outcome.label());
            trigger.control.count(outcome.label(), 1);
            f.span.record("tessel.outcome", outcome.label());
            if !f.span.is_disabled() {
                let _commit = tracing::info_span!(
                    target: crate::telemetry::trace::TARGET,
                    parent: &f.span,
                    "commit",
                    messaging.kafka.offset = offset,
                )
                .entered();
            }
        }
    }

    /// Carries a run signal of the core to the runs of its assignment.
    pub(crate) fn signal(&mut self, signal: RunSignal) {
        match signal {
            RunSignal::Drain(a) => self.tokens.entry(a).or_default().drain.cancel(),
            RunSignal::Abandon(a) => {
                if let Some(t) = self.tokens.remove(&a) {
                    t.abandon();
                }
            }
        }
    }

    /// Abandons every run still in progress (the stop's drain deadline passed).
    pub(crate) fn abandon_all(&mut self) {
        for (_, t) in self.tokens.drain() {
            t.abandon();
        }
    }

    /// Starts one run on the runtime.
    pub(crate) fn spawn(&mut self, start: Start<KafkaShell>) {
        let tokens = self.tokens.entry(start.assignment()).or_default();
        let (drain, cancel) = (tokens.drain.clone(), tokens.cancel.clone());
        let Start {
            id,
            generation,
            topic_id,
            key,
            msg,
            batch,
            permit,
            trigger,
            trigger_index,
        } = start;
        let mut msgs: Vec<OwnedMessage> = Vec::with_capacity(batch.len() + 1);
        msgs.push(msg);
        msgs.extend(batch);
        let batch = body::is_batch(&trigger, msgs.len());
        let offsets: Vec<i64> = msgs.iter().map(Message::offset).collect();
        let span =
            super::span::consume_span(&self.connection, &self.group, &trigger.name, &msgs, batch);
        let done = self.tx.clone();
        let tx = self.tx.clone();
        let yielded = move || {
            let _ = tx.send(WorkerEvent::Yielded(trigger_index));
        };
        self.in_flight_add(trigger_index, offsets.len() as f64);
        let task_span = span.clone();
        drop(self.tasks.spawn(async move {
            let (connection, name) = (trigger.connection.clone(), trigger.name.clone());
            let (topic, partition) = (Message::topic(&msgs[0]).to_owned(), Message::partition(&msgs[0]));
            // The run contains panics of an attempt itself; this catches one in its own
            // bookkeeping, so that the end is always reported. Records left without an
            // outcome outside a revoke or stop are given back and start again (after a
            // pause, so that a panic that recurs does not spin), keeping their key held.
            // Boxed: the run's future is several KB, and the task around it (span, panic
            // guard) would be copied whole on every spawn (for single records, memmove went
            // from 5.4% to 3.9% of the connector's CPU when boxed).
            let draining = drain.clone();
            #[cfg(not(test))]
            let work = Box::pin(attempt::process(
                trigger, topic_id, &msgs, permit, drain, cancel, yielded,
            ));
            #[cfg(test)]
            let work = Box::pin(faults::around(attempt::process(
                trigger, topic_id, &msgs, permit, drain, cancel, yielded,
            )));
            let outcomes = std::panic::AssertUnwindSafe(work.instrument(task_span))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    metrics::worker_panic(&connection, &name);
                    tracing::error!(connection = %connection, trigger = %name, topic = %topic,
                        partition, offset = offsets[0], "worker panicked outside an attempt; the record starts again");
                    Vec::new()
                });
            let outcome = |i: usize| outcomes.get(i).copied().unwrap_or(WorkOutcome::Abandoned);
            let give_back = !draining.is_cancelled()
                && (0..msgs.len()).any(|i| outcome(i) == WorkOutcome::Abandoned);
            let mut records = Vec::with_capacity(msgs.len());
            let mut returned = Vec::new();
            for (i, msg) in msgs.into_iter().enumerate() {
                match outcome(i) {
                    WorkOutcome::Abandoned if give_back => returned.push(msg),
                    o => records.push((offsets[i], o)),
                }
            }
            if give_back {
                tokio::select! {
                    biased;
                    _ = draining.cancelled() => {}
                    _ = tokio::time::sleep(RETURN_PAUSE) => {}
                }
            }
            let _ = done.send(WorkerEvent::Finished(RunFinished {
                id,
                generation,
                trigger: trigger_index,
                key,
                records,
                returned,
                // A batch's span has no outcome of its own, nor commit children.
                span: if batch { tracing::Span::none() } else { span },
            }));
        }));
    }
}

/// Panics a simulation draws in a run's own bookkeeping, outside its attempt (tests only:
/// the shipped binary has none).
#[cfg(test)]
pub(crate) mod faults {
    use std::cell::Cell;

    use crate::core::simulation::schedule::Rng;

    thread_local! {
        /// Per 1,000 runs, the chance of a panic; and the draws' state.
        static PANICS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
        /// Panics drawn on this thread so far.
        static HITS: Cell<u64> = const { Cell::new(0) };
    }

    /// Panics drawn on this thread so far (the simulation's faults happened).
    pub(crate) fn hits() -> u64 {
        HITS.with(Cell::get)
    }

    /// Runs started on this thread from now on panic outside their attempt `per_mille`
    /// times in 1,000, drawn from `seed` (half before the attempt, half after it, its
    /// outcome lost); 0: none.
    pub(crate) fn set(per_mille: u64, seed: u64) {
        PANICS.with(|p| p.set((per_mille, seed)));
    }

    /// Whether this run panics: Some(true) before its attempt, Some(false) after it.
    fn draw() -> Option<bool> {
        PANICS.with(|p| {
            let (per_mille, state) = p.get();
            if per_mille == 0 {
                return None;
            }
            let mut rng = Rng(state);
            let hit = rng.below(1000) < per_mille;
            let before = rng.chance(50);
            p.set((per_mille, rng.0));
            if hit {
                HITS.with(|h| h.set(h.get() + 1));
            }
            hit.then_some(before)
        })
    }

    /// `attempt`, with the panic drawn for it.
    pub(crate) async fn around<F: std::future::Future>(attempt: F) -> F::Output {
        let panic = draw();
        assert!(
            panic != Some(true),
            "simulated: a panic in a run's bookkeeping, before its attempt"
        );
        let outcomes = attempt.await;
        assert!(
            panic != Some(false),
            "simulated: a panic in a run's bookkeeping, after its attempt"
        );
        outcomes
    }
}
