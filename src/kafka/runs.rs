//! Starting runs on the runtime and reporting their end: the one place where a decided
//! [`Start`] becomes a task. A run is 1..n records of one partition (a single-record trigger's
//! run is a batch of one); its end is one [`RunFinished`] with every record's outcome.

use std::sync::Arc;

use futures::FutureExt as _;
use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::partitions::{PartitionId, Start};
use super::worker::{self, TriggerRuntime, WorkOutcome};
use crate::telemetry::metrics;

type Trigger = Arc<TriggerRuntime>;

/// What a run tells the supervisor.
pub(super) enum WorkerEvent {
    /// A started run ended.
    Finished(RunFinished),
    /// A run of the trigger with this index gave its permit back while it waits to retry:
    /// other partitions may start.
    Yielded(usize),
}

/// A run's end: each record's offset and outcome, in offset order.
pub(super) struct RunFinished {
    pub(super) id: PartitionId,
    /// The partition's assignment the run belongs to (a finished run of an earlier one is
    /// ignored).
    pub(super) generation: u64,
    /// The trigger's index (its runs-in-flight gauge).
    pub(super) trigger: usize,
    /// The key the run held (single-record runs; a batch holds none).
    pub(super) key: Option<Vec<u8>>,
    /// Whether the run was a batch (its records were taken in offset order, keyless).
    pub(super) batch: bool,
    pub(super) records: Vec<(i64, WorkOutcome)>,
    /// The run's trace span (disabled unless traces are exported).
    pub(super) span: tracing::Span,
}

/// Spawns runs and collects their ends.
pub(super) struct Runs {
    connection: String,
    group: String,
    tx: mpsc::UnboundedSender<WorkerEvent>,
    /// Every run's task: shutdown waits on it.
    pub(super) tasks: TaskTracker,
    /// Each trigger's runs-in-flight gauge, by index; registered when the connection runs
    /// (the recorder is installed by then).
    in_flight: Vec<metrics::Gauge>,
}

impl Runs {
    /// Runs of `connection` (consumer group `group`); their ends arrive on the receiver.
    pub(super) fn new(
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
        };
        (runs, rx)
    }

    /// Registers each trigger's runs-in-flight gauge.
    pub(super) fn register(&mut self, triggers: &[Trigger]) {
        self.in_flight = triggers
            .iter()
            .map(|t| metrics::in_flight_gauge(&self.connection, &t.name))
            .collect();
    }

    /// Moves the runs-in-flight gauge of the trigger with this index by `delta`.
    pub(super) fn in_flight_add(&self, trigger: usize, delta: f64) {
        if let Some(g) = self.in_flight.get(trigger) {
            g.increment(delta);
        }
    }

    /// A run ended: its records' offsets and whether each is handled, for the core; its
    /// records leave the runs-in-flight gauge.
    pub(super) fn finished(&self, f: &RunFinished) -> Vec<(i64, bool)> {
        self.in_flight_add(f.trigger, -(f.records.len() as f64));
        f.records
            .iter()
            .map(|(offset, outcome)| (*offset, outcome.is_handled()))
            .collect()
    }

    /// Counts a run's handled records by outcome, and closes its trace with each commit.
    pub(super) fn report(&self, trigger: &TriggerRuntime, f: &RunFinished) {
        let metrics = trigger.metrics();
        for (offset, outcome) in &f.records {
            if !outcome.is_handled() {
                continue;
            }
            metrics.handled(outcome.label());
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

    /// Starts one run on the runtime.
    pub(super) fn spawn(&self, start: Start<Trigger>) {
        if !start.batch.is_empty() || start.trigger.config.batch.is_some() {
            self.spawn_batch(start);
        } else {
            self.spawn_single(start);
        }
    }

    fn yielded(&self, trigger: usize) -> impl Fn() + Send + 'static {
        let tx = self.tx.clone();
        move || {
            let _ = tx.send(WorkerEvent::Yielded(trigger));
        }
    }

    fn spawn_single(&self, start: Start<Trigger>) {
        let Start {
            id,
            generation,
            key,
            msg,
            batch: _,
            permit,
            trigger,
            trigger_index,
            drain,
            cancel,
        } = start;
        let span = crate::telemetry::trace::message_span(
            &self.connection,
            &self.group,
            &trigger.name,
            &msg,
        );
        let offset = msg.offset();
        let done = self.tx.clone();
        let yielded = self.yielded(trigger_index);
        self.in_flight_add(trigger_index, 1.0);
        let task_span = span.clone();
        drop(self.tasks.spawn(async move {
            let (connection, name) = (trigger.connection.clone(), trigger.name.clone());
            let (topic, partition) = (msg.topic().to_owned(), msg.partition());
            // The worker contains panics of an attempt itself; this catches one in its own
            // bookkeeping, so that the end is always reported and the key never stays in
            // flight. The record is then abandoned: not committed, offered again after the
            // next rebalance or restart.
            // Boxed: the worker's future is 3.4 KB, and the task around it (span, panic guard)
            // was 7.3 KB, copied whole on every spawn; now the task is 448 bytes (memmove
            // went from 5.4% to 3.9% of the connector's CPU).
            let work = Box::pin(worker::process(
                trigger,
                msg,
                Some(permit),
                drain,
                cancel,
                yielded,
            ));
            let outcome = std::panic::AssertUnwindSafe(work.instrument(task_span))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    metrics::worker_panic(&connection, &name);
                    tracing::error!(connection = %connection, trigger = %name, topic = %topic,
                        partition, offset, "worker panicked outside an attempt; the record is left uncommitted");
                    WorkOutcome::Abandoned
                });
            let _ = done.send(WorkerEvent::Finished(RunFinished {
                id,
                generation,
                trigger: trigger_index,
                key,
                batch: false,
                records: vec![(offset, outcome)],
                span,
            }));
        }));
    }

    fn spawn_batch(&self, start: Start<Trigger>) {
        let Start {
            id,
            generation,
            msg,
            batch,
            permit,
            trigger,
            trigger_index,
            drain,
            cancel,
            ..
        } = start;
        let mut msgs: Vec<OwnedMessage> = Vec::with_capacity(batch.len() + 1);
        msgs.push(msg);
        msgs.extend(batch);
        let offsets: Vec<i64> = msgs.iter().map(|m| m.offset()).collect();
        let span = crate::telemetry::trace::batch_span(
            &self.connection,
            &self.group,
            &trigger.name,
            &msgs,
        );
        let done = self.tx.clone();
        let yielded = self.yielded(trigger_index);
        self.in_flight_add(trigger_index, offsets.len() as f64);
        drop(self.tasks.spawn(async move {
            let (connection, name) = (trigger.connection.clone(), trigger.name.clone());
            let first = offsets.first().copied().unwrap_or_default();
            // The batch worker contains panics of decoding itself; this catches one in its
            // own bookkeeping, so that the end is always reported. The records are then
            // abandoned: not committed, offered again after the next rebalance or restart.
            let outcomes = std::panic::AssertUnwindSafe(
                super::batch_worker::process(trigger, msgs, permit, drain, cancel, yielded)
                    .instrument(span),
            )
            .catch_unwind()
            .await
            .unwrap_or_else(|_| {
                metrics::worker_panic(&connection, &name);
                tracing::error!(connection = %connection, trigger = %name, first_offset = first,
                    "batch worker panicked; the batch is left uncommitted");
                Vec::new()
            });
            let records = offsets
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    (
                        *o,
                        outcomes.get(i).copied().unwrap_or(WorkOutcome::Abandoned),
                    )
                })
                .collect();
            let _ = done.send(WorkerEvent::Finished(RunFinished {
                id,
                generation,
                trigger: trigger_index,
                key: None,
                batch: true,
                records,
                span: tracing::Span::none(),
            }));
        }));
    }
}
