//! The supervisor of one connection: owns the consumer, routes messages to partition queues,
//! starts workers within each trigger's concurrency, stores offsets as runs are accepted, and
//! drains on revoke and shutdown.

use futures::FutureExt as _;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use thiserror::Error;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::committer::{CommitResult, Committer};
use super::context::ConnectorContext;
use super::offsets::{OffsetTracker, Received};
use super::scheduler::PartitionQueue;
use super::worker::{self, TriggerRuntime, WorkOutcome};
use super::{consumer_config, ConsumerEvent};
use crate::codec::registry::RegistryClient;
use crate::codec::Decoder;
use crate::config::ConnectionConfig;
use crate::dispatch::retry::Backoff;
use crate::dispatch::HttpDispatcher;
use crate::event::TopicPartition;
use crate::health::{ConnectionHealth, HealthRegistry};
use crate::telemetry::metrics;

/// Why a connection could not start or stopped.
#[derive(Debug, Error)]
pub enum SupervisorError {
    /// The consumer could not be created or subscribed.
    #[error("kafka consumer for connection {connection}: {source}")]
    Kafka {
        /// Connection name.
        connection: String,
        /// librdkafka's error.
        source: rdkafka::error::KafkaError,
    },
    /// A trigger's dispatcher or the registry client could not be built.
    #[error("connection {connection}: {reason}")]
    Setup {
        /// Connection name.
        connection: String,
        /// Why.
        reason: String,
    },
    /// The poll thread could not be started.
    #[error("cannot start the poll thread of connection {0}: {1}")]
    Thread(String, std::io::Error),
}

type Consumer_ = BaseConsumer<ConnectorContext>;

struct PartitionState {
    trigger: Arc<TriggerRuntime>,
    generation: u64,
    queue: PartitionQueue<OwnedMessage>,
    tracker: OffsetTracker,
    /// Positions are trusted only after a message of this assignment arrived or librdkafka
    /// showed it started from the commit (`position_reset`): a position left over from an
    /// earlier assignment of the partition could be ahead of what was handled.
    received_any: bool,
    /// librdkafka reported no position, or one at or before `start`, in this assignment.
    position_reset: bool,
    /// The group's committed offset when the partition was assigned.
    start: Option<i64>,
    paused: bool,
    buffered_bytes: usize,
    /// Stops retries of this partition's messages (revoke, shutdown).
    drain: CancellationToken,
    /// Abandons even attempts in progress (lost assignment, drain deadline).
    cancel: CancellationToken,
    /// When the commit offset last moved (or the partition last had no backlog).
    last_progress: Instant,
    /// Why the partition is reported stalled, while it is.
    stalled: Option<String>,
}

/// What a worker tells the supervisor.
enum WorkerEvent {
    /// A started message ended.
    Finished(Completion),
    /// A worker gave its permit back while it waits to retry: other partitions may start.
    Yielded(Arc<TriggerRuntime>),
}

struct Completion {
    tp: TopicPartition,
    generation: u64,
    offset: i64,
    key: Option<Vec<u8>>,
    outcome: WorkOutcome,
    /// The message's trace span (disabled unless traces are exported).
    span: tracing::Span,
}

struct PendingRevoke {
    partitions: Vec<TopicPartition>,
    lost: bool,
    ack: std::sync::mpsc::SyncSender<()>,
    deadline: Instant,
}

/// Runs one connection.
pub struct ConnectionSupervisor {
    name: String,
    config: ConnectionConfig,
    consumer: Arc<Consumer_>,
    events: mpsc::Receiver<ConsumerEvent>,
    events_tx: mpsc::Sender<ConsumerEvent>,
    triggers: HashMap<String, Arc<TriggerRuntime>>,
    partitions: HashMap<TopicPartition, PartitionState>,
    generation: u64,
    completions_tx: mpsc::UnboundedSender<WorkerEvent>,
    completions: mpsc::UnboundedReceiver<WorkerEvent>,
    /// Partitions with something to do: start messages, store offsets, pause or resume.
    dirty: HashSet<TopicPartition>,
    /// Partitions that had startable messages but no permit, by trigger name.
    starved: HashMap<String, HashSet<TopicPartition>>,
    /// Wanted commits, sent asynchronously at most every COMMIT_INTERVAL and again until the
    /// broker confirms them (the commit rule: see [`super::committer`]).
    committer: Committer,
    /// New runs wait because the broker refuses commits (a rebalance).
    holding: bool,
    /// Requests to the commit thread (None before `run` and after shutdown began).
    commit_requests: Option<std::sync::mpsc::Sender<CommitBatch>>,
    /// The commit thread's answers.
    commit_answers: mpsc::UnboundedReceiver<Vec<CommitResult>>,
    commit_answers_tx: mpsc::UnboundedSender<Vec<CommitResult>>,
    commit_thread: Option<std::thread::JoinHandle<()>>,
    /// Whether the global byte budget was exceeded at the last check.
    global_full: bool,
    /// Where readiness is reported.
    health: HealthRegistry,
    /// The registry client, probed for readiness.
    registry: Option<Arc<RegistryClient>>,
    /// Result of the last registry probe.
    registry_reachable: Arc<std::sync::atomic::AtomicBool>,
    /// When the registry was last probed.
    last_registry_probe: Option<Instant>,
    /// When the end offsets of paused partitions were last queried.
    last_paused_end_probe: Option<Instant>,
    /// A query of paused partitions' end offsets is running.
    paused_end_probe_running: Arc<AtomicBool>,
    /// The last query found paused partitions (so the next one clears them).
    paused_ends_reported: bool,
    tasks: TaskTracker,
    buffered_bytes: usize,
    pending_revoke: Option<PendingRevoke>,
    /// Permissions found missing by the last diagnosis (see [`crate::preflight`]).
    missing_permissions: Arc<std::sync::Mutex<Vec<String>>>,
    /// When the permissions were last diagnosed; a diagnosis runs at most every
    /// [`PERMISSION_RECHECK`], after an authorization refusal or while one is reported.
    last_permission_check: Option<Instant>,
    /// An authorization refusal was seen and not yet diagnosed.
    permission_check_wanted: bool,
}

/// How often missing permissions are looked for again while they are reported.
const PERMISSION_RECHECK: Duration = Duration::from_secs(10);

const EVENT_CHANNEL: usize = 1024;

/// How often stalls are looked for (and readiness refreshed).
const STALL_CHECK: Duration = Duration::from_secs(1);

/// How often the end offsets of paused partitions are queried for the lag metric.
const PAUSED_END_PROBE: Duration = Duration::from_secs(5);

/// How often the schema registry is probed for readiness.
const REGISTRY_PROBE: Duration = Duration::from_secs(5);

/// Accepted offsets reach the group within this interval plus one round trip. Commits are
/// asynchronous and pipelined (librdkafka sends them in order on one connection), so a crash
/// offers again only what was accepted in that window; the broker sees at most 100 commits a
/// second per connection, and none while nothing is accepted.
const COMMIT_INTERVAL: Duration = Duration::from_millis(10);

/// The longest new runs wait while the broker refuses commits (a classic-protocol rebalance
/// lasts until a dead member's session times out, 45 s by default): a broker that refuses for
/// longer does not stop dispatching for ever.
const COMMIT_HOLD_LIMIT: Duration = Duration::from_secs(60);

/// Clients of one connection that the consumer and the produce API share: one registry
/// client (one schema cache) and one idempotent producer.
#[derive(Debug, Default)]
pub struct SharedClients {
    /// The registry client, when the connection has a registry.
    pub registry: Option<Arc<RegistryClient>>,
    /// The idempotent producer, when the connection produces (dead letters, produce API).
    pub producer: Option<super::producer::IdempotentProducer>,
}

impl SharedClients {
    /// Builds the clients `config` needs; `produces` says whether the produce API uses this
    /// connection. Opens no connection yet.
    pub fn try_new(
        name: &str,
        config: &ConnectionConfig,
        produces: bool,
    ) -> Result<Self, SupervisorError> {
        let registry = match &config.schema_registry {
            Some(r) => Some(Arc::new(
                RegistryClient::try_new(r)
                    .map_err(|e| SupervisorError::Setup {
                        connection: name.to_owned(),
                        reason: format!("schema registry client: {e}"),
                    })?
                    .for_connection(name),
            )),
            None => None,
        };
        let dead_letters = config
            .triggers
            .values()
            .any(|t| t.on_error == crate::config::ErrorPolicy::DeadLetter);
        let producer = if dead_letters || produces {
            Some(
                super::producer::IdempotentProducer::try_new(name, config).map_err(|source| {
                    SupervisorError::Kafka {
                        connection: name.to_owned(),
                        source,
                    }
                })?,
            )
        } else {
            None
        };
        Ok(Self { registry, producer })
    }
}

impl ConnectionSupervisor {
    /// Creates the consumer and the triggers' clients; opens no connection yet. `shared`
    /// holds the clients the connection shares with the produce API.
    pub fn try_new(
        name: &str,
        config: &ConnectionConfig,
        health: HealthRegistry,
        shared: &SharedClients,
    ) -> Result<Self, SupervisorError> {
        let setup = |reason: String| SupervisorError::Setup {
            connection: name.to_owned(),
            reason,
        };
        let registry = shared.registry.clone();
        let decoder = Decoder::new(registry.clone());
        let producer = shared.producer.clone();
        let mut triggers = HashMap::new();
        for (tname, t) in &config.triggers {
            let dispatcher = HttpDispatcher::try_new(&t.dispatcher)
                .map_err(|e| setup(format!("trigger {tname} dispatcher: {e}")))?;
            let runtime = Arc::new(TriggerRuntime {
                connection: name.to_owned(),
                group: config.group_id().to_owned(),
                name: tname.clone(),
                config: t.clone(),
                dispatcher,
                permits: Arc::new(Semaphore::new(t.concurrency)),
                backoff: Backoff::new(
                    Duration::from_millis(t.retry.initial_backoff_ms),
                    Duration::from_millis(t.retry.max_backoff_ms),
                )
                .with_max_retry_after(Duration::from_millis(t.retry.max_retry_after_ms)),
                decoder: decoder.clone(),
                producer: producer.clone(),
                throttle_until: std::sync::Mutex::new(None),
                warned_traceparent: std::sync::atomic::AtomicBool::new(false),
                stopped: std::sync::atomic::AtomicBool::new(false),
                last_failure: std::sync::Mutex::new(None),
                missing_permission: std::sync::Mutex::new(None),
            });
            for topic in &t.topics {
                let _ = triggers.insert(topic.clone(), Arc::clone(&runtime));
            }
        }
        let (events_tx, events) = mpsc::channel(EVENT_CHANNEL);
        let revoke_wait = Duration::from_millis(config.drain_timeout_ms) + Duration::from_secs(10);
        let signer = super::security::MskIamSigner::from_config(config, |v| std::env::var(v).ok())
            .map_err(|e| setup(format!("AWS_MSK_IAM: {e}")))?
            .map(Arc::new);
        let context =
            ConnectorContext::new(name.to_owned(), events_tx.clone(), revoke_wait, signer)
                .with_offset_reset(config.kafka.get("auto.offset.reset").map(String::as_str));
        let consumer: Consumer_ = consumer_config(name, config)
            .create_with_context(context)
            .map_err(|source| SupervisorError::Kafka {
                connection: name.to_owned(),
                source,
            })?;
        let (completions_tx, completions) = mpsc::unbounded_channel();
        let (commit_answers_tx, commit_answers) = mpsc::unbounded_channel();
        Ok(Self {
            name: name.to_owned(),
            config: config.clone(),
            consumer: Arc::new(consumer),
            events,
            events_tx,
            triggers,
            partitions: HashMap::new(),
            generation: 0,
            completions_tx,
            completions,
            dirty: HashSet::new(),
            starved: HashMap::new(),
            committer: Committer::new(COMMIT_INTERVAL, COMMIT_HOLD_LIMIT),
            holding: false,
            commit_requests: None,
            commit_answers,
            commit_answers_tx,
            commit_thread: None,
            global_full: false,
            health,
            registry_reachable: Arc::new(std::sync::atomic::AtomicBool::new(registry.is_none())),
            registry,
            last_registry_probe: None,
            last_paused_end_probe: None,
            paused_end_probe_running: Arc::new(AtomicBool::new(false)),
            paused_ends_reported: false,
            tasks: TaskTracker::new(),
            buffered_bytes: 0,
            pending_revoke: None,
            missing_permissions: Arc::new(std::sync::Mutex::new(Vec::new())),
            last_permission_check: None,
            permission_check_wanted: false,
        })
    }

    /// Subscribes and runs until `shutdown` fires; then drains, commits and closes.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), SupervisorError> {
        let topics: Vec<&str> = self.config.topics().into_iter().collect();
        self.consumer
            .subscribe(&topics)
            .map_err(|source| SupervisorError::Kafka {
                connection: self.name.clone(),
                source,
            })?;
        tracing::info!(connection = %self.name, topics = ?topics, group = self.config.group_id(), "consumer subscribed");
        let stop = Arc::new(AtomicBool::new(false));
        let poll_thread = super::poll_loop::spawn_poll_loop(
            &self.name,
            Arc::clone(&self.consumer),
            self.events_tx.clone(),
            Arc::clone(&stop),
        )
        .map_err(|e| SupervisorError::Thread(self.name.clone(), e))?;
        let (requests, thread) = spawn_commit_thread(
            &self.name,
            Arc::clone(&self.consumer),
            self.commit_answers_tx.clone(),
        )
        .map_err(|e| SupervisorError::Thread(self.name.clone(), e))?;
        self.commit_requests = Some(requests);
        self.commit_thread = Some(thread);

        let mut stall_check = tokio::time::interval(STALL_CHECK);
        stall_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let revoke_deadline = self.pending_revoke.as_ref().map(|r| r.deadline);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(e) = self.completions.recv() => self.on_worker_event(e),
                _ = sleep_until_opt(revoke_deadline) => {}
                _ = stall_check.tick() => {
                    self.check_stalls();
                    self.probe_paused_ends();
                }
                _ = sleep_until_opt(self.committer.next_due()) => {}
                Some(answers) = self.commit_answers.recv() => {
                    self.committer.on_answer(Instant::now(), &answers);
                }
                event = self.events.recv(), if self.pending_revoke.is_none() => match event {
                    Some(e) => self.on_event(e),
                    None => break,
                },
            }
            if self.pending_revoke.is_some() {
                self.try_finish_revoke().await;
            }
            self.update_hold();
            self.process_dirty();
            self.send_commits();
        }
        self.shut_down(stop, poll_thread).await;
        Ok(())
    }

    fn on_event(&mut self, event: ConsumerEvent) {
        match event {
            ConsumerEvent::Message(msg) => self.on_message(msg),
            ConsumerEvent::Positions(positions) => {
                for (tp, pos) in positions {
                    let Some(p) = self.partitions.get_mut(&tp) else {
                        continue;
                    };
                    // A position is trusted once librdkafka has started this assignment from
                    // the group's commit: it reported no position yet, or one at or before
                    // the committed offset, or returned a message. Until then it may be left
                    // over from an earlier assignment and ahead of what was handled. Trusted
                    // positions move the commit past transaction markers and aborted records
                    // even when no message of this assignment ever arrives.
                    match pos {
                        None => p.position_reset = true,
                        Some(o) if p.start.is_some_and(|s| o <= s) => p.position_reset = true,
                        Some(_) => {}
                    }
                    if let (Some(o), true) = (pos, p.received_any || p.position_reset) {
                        p.tracker.position(o);
                        let _ = self.dirty.insert(tp);
                    }
                }
            }
            ConsumerEvent::Assigned(assigned) => {
                metrics::rebalance(&self.name, "assign");
                self.committer.rebalanced();
                // librdkafka can keep a partition's pause flag across revoke and re-assign;
                // a new assignment starts unpaused, in librdkafka as in its state here.
                let mut fresh = TopicPartitionList::new();
                for a in &assigned {
                    let _ = fresh.add_partition(&a.tp.topic, a.tp.partition);
                }
                if fresh.count() > 0 {
                    if let Err(e) = self.consumer.resume(&fresh) {
                        tracing::warn!(connection = %self.name, error = %e, "cannot resume newly assigned partitions");
                    }
                }
                for a in assigned {
                    let tp = a.tp;
                    let Some(trigger) = self.triggers.get(&tp.topic).cloned() else {
                        continue;
                    };
                    self.generation += 1;
                    tracing::info!(connection = %self.name, topic = %tp.topic, partition = tp.partition, "partition assigned");
                    let state = PartitionState {
                        queue: PartitionQueue::new(trigger.config.ordering),
                        trigger,
                        generation: self.generation,
                        tracker: OffsetTracker::from_committed(a.committed, &a.metadata),
                        received_any: false,
                        position_reset: false,
                        start: a.committed,
                        paused: false,
                        buffered_bytes: 0,
                        drain: CancellationToken::new(),
                        cancel: CancellationToken::new(),
                        last_progress: Instant::now(),
                        stalled: None,
                    };
                    if let Some(old) = self.partitions.insert(tp, state) {
                        old.cancel.cancel();
                    }
                }
                self.report_partitions();
            }
            ConsumerEvent::Revoked {
                partitions,
                lost,
                ack,
            } => {
                metrics::rebalance(&self.name, if lost { "lost" } else { "revoke" });
                tracing::info!(connection = %self.name, partitions = partitions.len(), lost, "partitions revoked");
                for tp in &partitions {
                    if let Some(p) = self.partitions.get_mut(tp) {
                        // Waiting messages will be read again by the next owner.
                        for m in p.queue.clear_waiting() {
                            self.buffered_bytes -= msg_bytes(&m);
                        }
                        p.buffered_bytes = 0;
                        p.drain.cancel();
                        if lost {
                            p.cancel.cancel();
                        }
                    }
                }
                let deadline = Instant::now() + Duration::from_millis(self.config.drain_timeout_ms);
                self.pending_revoke = Some(PendingRevoke {
                    partitions,
                    lost,
                    ack,
                    deadline,
                });
            }
            ConsumerEvent::Committed(results) => {
                self.committer.on_results(Instant::now(), &results);
            }
            ConsumerEvent::Error(e) => {
                self.consumer.context().note_error(&e, &e.to_string());
                tracing::warn!(connection = %self.name, error = %e, "kafka consumer error");
            }
        }
    }

    fn on_message(&mut self, msg: OwnedMessage) {
        let tp = TopicPartition {
            topic: msg.topic().to_owned(),
            partition: msg.partition(),
        };
        metrics::consumed(&self.name, &tp.topic);
        let Some(p) = self.partitions.get_mut(&tp) else {
            tracing::warn!(connection = %self.name, topic = %tp.topic, partition = tp.partition, offset = msg.offset(), "message for a partition not assigned; ignored");
            return;
        };
        p.received_any = true;
        match p.tracker.received(msg.offset()) {
            Received::Dispatch => {}
            Received::AlreadyAccepted => {
                let _ = self.dirty.insert(tp.clone());
                metrics::handled(&self.name, &p.trigger.name, "already_accepted");
                tracing::debug!(connection = %self.name, topic = %tp.topic, partition = tp.partition, offset = msg.offset(), "handled already; not dispatched again");
                return;
            }
            Received::AlreadyReceived => {
                tracing::debug!(connection = %self.name, topic = %tp.topic, partition = tp.partition, offset = msg.offset(), "delivered again while waiting or in flight; not dispatched twice");
                return;
            }
        }
        let bytes = msg_bytes(&msg);
        p.buffered_bytes += bytes;
        self.buffered_bytes += bytes;
        let key = msg.key().map(<[u8]>::to_vec);
        p.queue.push(key, msg);
        let _ = self.dirty.insert(tp);
    }

    fn on_worker_event(&mut self, event: WorkerEvent) {
        match event {
            WorkerEvent::Finished(c) => self.on_completion(c),
            WorkerEvent::Yielded(trigger) => self.wake_starved(&trigger.name),
        }
    }

    /// A permit of `trigger` came free: its starved partitions may start messages again.
    fn wake_starved(&mut self, trigger: &str) {
        if let Some(starved) = self.starved.get_mut(trigger) {
            self.dirty.extend(starved.drain());
        }
    }

    fn on_completion(&mut self, c: Completion) {
        metrics::in_flight(&self.name, -1.0);
        let Some(p) = self.partitions.get_mut(&c.tp) else {
            return;
        };
        if p.generation != c.generation {
            return;
        }
        let trigger = p.trigger.name.clone();
        p.queue.finished(&c.key);
        let _ = self.dirty.insert(c.tp.clone());
        self.wake_starved(&trigger);
        let Some(p) = self.partitions.get_mut(&c.tp) else {
            return;
        };
        c.span.record("tessel.outcome", c.outcome.label());
        match c.outcome {
            WorkOutcome::Accepted | WorkOutcome::Skipped | WorkOutcome::DeadLettered => {
                metrics::handled(&self.name, &p.trigger.name, c.outcome.label());
                let _commit = tracing::info_span!(
                    target: crate::telemetry::trace::TARGET,
                    parent: &c.span,
                    "commit",
                    messaging.kafka.offset = c.offset,
                )
                .entered();
                p.tracker.handled(c.offset);
            }
            WorkOutcome::Abandoned => {}
        }
    }

    /// Works through the partitions that changed: starts what ordering and concurrency
    /// allow, stores advanced commit offsets, pauses full partitions and resumes drained ones.
    /// Only changed partitions are visited, so thousands of idle partitions cost nothing.
    fn process_dirty(&mut self) {
        let full = self.buffered_bytes >= self.config.max_buffered_bytes;
        let low = self.buffered_bytes <= self.config.max_buffered_bytes / 2;
        if full != self.global_full || (self.global_full && low) {
            // The global budget changed state: every partition may need pausing or resuming.
            self.global_full = full;
            self.dirty.extend(self.partitions.keys().cloned());
        }
        if self.dirty.is_empty() {
            return;
        }
        let revoking: HashSet<TopicPartition> = self
            .pending_revoke
            .as_ref()
            .map(|r| r.partitions.iter().cloned().collect())
            .unwrap_or_default();
        let per_partition = self.config.max_buffered_per_partition;
        let mut store = TopicPartitionList::new();
        let mut pause = TopicPartitionList::new();
        let mut resume = TopicPartitionList::new();
        for tp in std::mem::take(&mut self.dirty) {
            if !self.partitions.contains_key(&tp) {
                continue;
            }
            if !revoking.contains(&tp) {
                let starved = self.start_ready(&tp);
                if starved {
                    let trigger = self.partitions[&tp].trigger.name.clone();
                    let _ = self.starved.entry(trigger).or_default().insert(tp.clone());
                }
            }
            let Some(p) = self.partitions.get_mut(&tp) else {
                continue;
            };
            if let Some((offset, metadata)) = p.tracker.take_new_commit() {
                p.last_progress = Instant::now();
                add_commit(&mut store, &tp, offset, &metadata);
                self.committer.want(tp.clone(), offset, metadata);
            }
            let waiting = p.queue.waiting();
            let gap_full = p.tracker.gap_full();
            if !p.paused && (waiting >= per_partition || (full && waiting > 0) || gap_full) {
                p.paused = true;
                let _ = pause.add_partition(&tp.topic, tp.partition);
            } else if p.paused && waiting <= per_partition / 2 && !self.global_full && !gap_full {
                p.paused = false;
                let _ = resume.add_partition(&tp.topic, tp.partition);
            }
        }
        if store.count() > 0 {
            if let Err(e) = self.consumer.store_offsets(&store) {
                tracing::warn!(connection = %self.name, error = %e, "cannot store offsets");
            }
        }
        if pause.count() > 0 {
            if let Err(e) = self.consumer.pause(&pause) {
                tracing::warn!(connection = %self.name, error = %e, "cannot pause partitions");
            }
        }
        if resume.count() > 0 {
            if let Err(e) = self.consumer.resume(&resume) {
                tracing::warn!(connection = %self.name, error = %e, "cannot resume partitions");
            }
        }
        if pause.count() > 0 || resume.count() > 0 {
            self.report_partitions();
        }
    }

    /// Starts the messages of `tp` that ordering and the trigger's permits allow. Returns
    /// true when a message could have started but no permit was free.
    fn start_ready(&mut self, tp: &TopicPartition) -> bool {
        if self.holding {
            // Started when the broker accepts commits again (update_hold marks every
            // partition dirty then).
            return false;
        }
        let Some(p) = self.partitions.get_mut(tp) else {
            return false;
        };
        loop {
            if p.queue.waiting() == 0 || p.tracker.gap_full() {
                return false;
            }
            let Ok(permit) = Arc::clone(&p.trigger.permits).try_acquire_owned() else {
                return true;
            };
            let Some((key, msg)) = p.queue.pop_startable() else {
                return false;
            };
            let bytes = msg_bytes(&msg);
            p.buffered_bytes -= bytes;
            self.buffered_bytes -= bytes;
            let completion = Completion {
                tp: tp.clone(),
                generation: p.generation,
                offset: msg.offset(),
                key,
                outcome: WorkOutcome::Abandoned,
                span: crate::telemetry::trace::message_span(
                    &self.name,
                    self.config.group_id(),
                    &p.trigger.name,
                    &msg,
                ),
            };
            let trigger = Arc::clone(&p.trigger);
            let drain = p.drain.clone();
            let cancel = p.cancel.clone();
            let done = self.completions_tx.clone();
            let yielded = {
                let tx = self.completions_tx.clone();
                let trigger = Arc::clone(&trigger);
                move || {
                    let _ = tx.send(WorkerEvent::Yielded(Arc::clone(&trigger)));
                }
            };
            metrics::in_flight(&self.name, 1.0);
            let span = completion.span.clone();
            self.tasks.spawn(async move {
                let (connection, name) = (trigger.connection.clone(), trigger.name.clone());
                let (topic, partition, offset) = (msg.topic().to_owned(), msg.partition(), msg.offset());
                // The worker contains panics of an attempt itself; this catches one in its own
                // bookkeeping, so that the completion is always sent and the key never stays
                // in flight. The record is then abandoned: not committed, offered again after
                // the next rebalance or restart.
                let outcome = std::panic::AssertUnwindSafe(
                    worker::process(trigger, msg, Some(permit), drain, cancel, yielded)
                        .instrument(span),
                )
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    metrics::worker_panic(&connection, &name);
                    tracing::error!(connection = %connection, trigger = %name, topic = %topic,
                        partition, offset, "worker panicked outside an attempt; the record is left uncommitted");
                    WorkOutcome::Abandoned
                });
                let _ = done.send(WorkerEvent::Finished(Completion {
                    outcome,
                    ..completion
                }));
            });
        }
    }

    /// Sends the wanted commits that are due (new ones at most every [`COMMIT_INTERVAL`],
    /// refused or unanswered ones again), asynchronously, in one request. librdkafka's
    /// auto-commit of stored offsets is the backstop.
    fn send_commits(&mut self) {
        let Some(requests) = &self.commit_requests else {
            return;
        };
        let due = self.committer.take_due(Instant::now());
        if due.is_empty() {
            return;
        }
        if requests.send(due).is_err() {
            tracing::error!(connection = %self.name, "the commit thread is gone; commits rely on auto-commit until restart");
            self.commit_requests = None;
        }
    }

    /// Starts or ends the hold on new runs while the broker refuses commits; when it ends,
    /// every partition may start messages again.
    fn update_hold(&mut self) {
        let holding = self.committer.holding(Instant::now());
        if holding == self.holding {
            return;
        }
        self.holding = holding;
        if holding {
            let reason = self.committer.refusing().map(|(_, r)| r.to_owned());
            tracing::warn!(connection = %self.name, error = reason.as_deref().unwrap_or(""),
                "the broker refuses offset commits (a rebalance in progress?): new runs wait, refused commits are sent again");
        } else {
            if self.committer.refusing().is_some() {
                tracing::warn!(connection = %self.name, limit_s = COMMIT_HOLD_LIMIT.as_secs(),
                    "offset commits refused for too long: dispatching again; a crash now may offer accepted runs again");
            } else {
                tracing::info!(connection = %self.name, "offset commits accepted again: new runs start");
            }
            self.dirty.extend(self.partitions.keys().cloned());
        }
    }

    /// Reports partitions with a backlog and no progress for `stall_after_ms`, with the
    /// reason, in the log, the metrics and `/readyz`; and triggers stopped by configuration.
    fn check_stalls(&mut self) {
        let after = Duration::from_millis(self.config.stall_after_ms);
        if let Some(registry) = &self.registry {
            if self
                .last_registry_probe
                .is_none_or(|t| t.elapsed() >= REGISTRY_PROBE)
            {
                self.last_registry_probe = Some(Instant::now());
                let registry = Arc::clone(registry);
                let flag = Arc::clone(&self.registry_reachable);
                tokio::spawn(async move {
                    let ok = registry.probe().await.is_ok();
                    flag.store(ok, std::sync::atomic::Ordering::SeqCst);
                });
            }
        }
        let brokers_up = self.consumer.context().brokers_up();
        if let Some(up) = brokers_up {
            metrics::brokers_up(&self.name, up);
        }
        self.check_permissions();
        let kafka_error = self
            .consumer
            .context()
            .connect_failure()
            .map(|f| f.to_string());
        let missing_permissions = self
            .missing_permissions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut health = ConnectionHealth {
            brokers_up: brokers_up.unwrap_or(false),
            registry_reachable: self
                .registry_reachable
                .load(std::sync::atomic::Ordering::SeqCst),
            assigned_partitions: self.partitions.len(),
            kafka_error,
            missing_permissions,
            ..ConnectionHealth::default()
        };
        for (tp, p) in self.partitions.iter_mut() {
            let backlog = p.queue.waiting() + p.queue.in_flight();
            if backlog == 0 {
                p.last_progress = Instant::now();
            }
            let reason = (backlog > 0 && p.last_progress.elapsed() >= after).then(|| {
                if p.trigger.stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    "trigger stopped by a configuration error".to_owned()
                } else if let Some(failure) = p.trigger.recent_failure(after) {
                    match p.tracker.commit_offset() {
                        Some(o) => format!(
                            "key parked at offset {o}: a message is being retried ({failure})"
                        ),
                        None => format!("key parked: a message is being retried ({failure})"),
                    }
                } else if p.paused {
                    "paused: the partition's buffer is full".to_owned()
                } else {
                    "waiting for runs in flight".to_owned()
                }
            });
            match (&p.stalled, &reason) {
                (None, Some(r)) => {
                    tracing::warn!(connection = %self.name, topic = %tp.topic, partition = tp.partition,
                    reason = %r, stalled_for_ms = p.last_progress.elapsed().as_millis() as u64, "partition stalled")
                }
                (Some(_), None) => {
                    tracing::info!(connection = %self.name, topic = %tp.topic, partition = tp.partition, "partition progressing again")
                }
                _ => {}
            }
            p.stalled = reason;
            if let Some(r) = &p.stalled {
                let _ = health.stalled_partitions.insert(tp.to_string(), r.clone());
            }
        }
        for t in self.triggers.values() {
            // A refused dead-letter write is retried with backoff (at most max_backoff_ms
            // apart), so a refusal within twice that is still current.
            let window = Duration::from_millis(t.config.retry.max_backoff_ms.saturating_mul(2))
                .max(STALL_CHECK * 10);
            if let Some(p) = t.recent_missing_permission(window) {
                if !health.missing_permissions.contains(&p) {
                    health.missing_permissions.push(p);
                }
            }
            if t.stopped.load(std::sync::atomic::Ordering::SeqCst) {
                let reason = t.recent_failure(Duration::MAX).unwrap_or_default();
                let _ = health.stopped_triggers.insert(t.name.clone(), reason);
            }
        }
        metrics::stalled(&self.name, health.stalled_partitions.len());
        self.health.set(&self.name, health);
    }

    /// After the broker refused an operation for lack of a permission (and while one is
    /// reported missing), works out which permissions are missing with the same probes as
    /// `tessel-kafka check`, off the runtime, and reports them in the log and `/readyz`.
    fn check_permissions(&mut self) {
        let refused = self.consumer.context().take_authorization_refused();
        let reported = !self
            .missing_permissions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        let due = self
            .last_permission_check
            .is_none_or(|t| t.elapsed() >= PERMISSION_RECHECK);
        self.permission_check_wanted |= refused;
        if !(self.permission_check_wanted || reported) || !due {
            return;
        }
        self.permission_check_wanted = false;
        self.last_permission_check = Some(Instant::now());
        let name = self.name.clone();
        let config = self.config.clone();
        let slot = Arc::clone(&self.missing_permissions);
        self.tasks.spawn_blocking(move || {
            let missing = crate::preflight::missing_consumer_permissions(&name, &config);
            let mut current = slot.lock().unwrap_or_else(|p| p.into_inner());
            if *current != missing {
                if missing.is_empty() {
                    tracing::info!(connection = %name, "permissions present again");
                } else {
                    // The message repeats the product page's words ("missing READ on group
                    // G") so operators can grep for them.
                    tracing::error!(connection = %name, missing = %missing.join(", "), "missing {}", missing.join(", missing "));
                }
                *current = missing;
            }
        });
    }

    /// Queries the end offsets of paused partitions (off the async threads, one probe at a
    /// time), so their lag keeps following the log while they are not fetched.
    fn probe_paused_ends(&mut self) {
        if self
            .last_paused_end_probe
            .is_some_and(|t| t.elapsed() < PAUSED_END_PROBE)
            || self.paused_end_probe_running.load(AtomicOrdering::SeqCst)
        {
            return;
        }
        self.last_paused_end_probe = Some(Instant::now());
        let paused: Vec<TopicPartition> = self
            .partitions
            .iter()
            .filter(|(_, p)| p.paused)
            .map(|(tp, _)| tp.clone())
            .collect();
        if paused.is_empty() && !self.paused_ends_reported {
            return;
        }
        self.paused_ends_reported = !paused.is_empty();
        self.paused_end_probe_running
            .store(true, AtomicOrdering::SeqCst);
        let running = Arc::clone(&self.paused_end_probe_running);
        let consumer = Arc::clone(&self.consumer);
        drop(tokio::task::spawn_blocking(move || {
            // One deadline for the whole probe, so an unreachable cluster holds this
            // thread (and the consumer) only briefly.
            let deadline = Instant::now() + PAUSED_END_PROBE;
            let mut ends = std::collections::HashMap::new();
            for tp in paused {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                if let Ok((_, high)) = consumer.fetch_watermarks(&tp.topic, tp.partition, left) {
                    let _ = ends.insert((tp.topic, tp.partition), high);
                }
            }
            consumer.context().set_paused_ends(ends);
            running.store(false, AtomicOrdering::SeqCst);
        }));
    }

    fn report_partitions(&self) {
        let paused = self.partitions.values().filter(|p| p.paused).count();
        metrics::partitions(&self.name, self.partitions.len(), paused);
    }

    async fn try_finish_revoke(&mut self) {
        let Some(r) = &self.pending_revoke else {
            return;
        };
        let in_flight: usize = r
            .partitions
            .iter()
            .filter_map(|tp| self.partitions.get(tp))
            .map(|p| p.queue.in_flight())
            .sum();
        let expired = Instant::now() >= r.deadline;
        if in_flight > 0 && !expired {
            return;
        }
        let Some(r) = self.pending_revoke.take() else {
            return;
        };
        if expired && in_flight > 0 {
            tracing::warn!(connection = %self.name, in_flight, "drain deadline passed on revoke; unfinished runs will be dispatched again by the next owner");
        }
        if !r.lost {
            self.commit_sync(&r.partitions).await;
        }
        for tp in &r.partitions {
            if let Some(p) = self.partitions.remove(tp) {
                p.cancel.cancel();
            }
            self.committer.forget(tp);
            let _ = self.dirty.remove(tp);
            for starved in self.starved.values_mut() {
                let _ = starved.remove(tp);
            }
        }
        self.report_partitions();
        let _ = r.ack.send(());
    }

    /// Stores and synchronously commits the commit offsets of `tps`.
    async fn commit_sync(&mut self, tps: &[TopicPartition]) {
        let mut tpl = TopicPartitionList::new();
        for tp in tps {
            if let Some(p) = self.partitions.get_mut(tp) {
                let _ = p.tracker.take_new_commit();
                if let Some((offset, metadata)) = p.tracker.commit() {
                    add_commit(&mut tpl, tp, offset, &metadata);
                }
            }
        }
        if tpl.count() == 0 {
            return;
        }
        let consumer = Arc::clone(&self.consumer);
        let name = self.name.clone();
        // Store first: librdkafka commits stored offsets again on close, and an older stored
        // offset must not replace this commit.
        let result = tokio::task::spawn_blocking(move || {
            consumer.store_offsets(&tpl)?;
            consumer.commit(&tpl, CommitMode::Sync)
        })
        .await;
        match result {
            Ok(Ok(())) => {
                metrics::commit(&name, true);
                tracing::info!(connection = %name, partitions = tps.len(), "offsets committed");
            }
            Ok(Err(e)) => {
                metrics::commit(&name, false);
                tracing::warn!(connection = %name, error = %e, "synchronous commit failed");
            }
            Err(e) => tracing::warn!(connection = %name, error = %e, "commit task failed"),
        }
    }

    async fn shut_down(mut self, stop: Arc<AtomicBool>, poll_thread: std::thread::JoinHandle<()>) {
        // The commit thread finishes its request and ends, so the final synchronous commit
        // below is the last one the broker sees.
        drop(self.commit_requests.take());
        if let Some(t) = self.commit_thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        tracing::info!(connection = %self.name, "stopping: draining runs in flight");
        for p in self.partitions.values_mut() {
            p.drain.cancel();
            for m in p.queue.clear_waiting() {
                self.buffered_bytes -= msg_bytes(&m);
            }
        }
        let deadline = Instant::now() + Duration::from_millis(self.config.drain_timeout_ms);
        loop {
            let in_flight: usize = self.partitions.values().map(|p| p.queue.in_flight()).sum();
            if in_flight == 0 {
                break;
            }
            tokio::select! {
                Some(e) = self.completions.recv() => self.on_worker_event(e),
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(connection = %self.name, in_flight, "drain deadline passed; unfinished runs will be dispatched again");
                    break;
                }
            }
        }
        for p in self.partitions.values() {
            p.cancel.cancel();
        }
        let lost: HashSet<TopicPartition> = self
            .pending_revoke
            .as_ref()
            .filter(|r| r.lost)
            .map(|r| r.partitions.iter().cloned().collect())
            .unwrap_or_default();
        let tps: Vec<TopicPartition> = self
            .partitions
            .keys()
            .filter(|tp| !lost.contains(*tp))
            .cloned()
            .collect();
        self.commit_sync(&tps).await;
        // A revoke that arrived with the shutdown is complete now: release the poll thread's
        // revoke callback at once instead of letting it wait for its deadline.
        if let Some(r) = self.pending_revoke.take() {
            let _ = r.ack.send(());
        }
        self.consumer.context().set_closing();
        stop.store(true, AtomicOrdering::SeqCst);
        self.tasks.close();
        // The poll thread must hold the last reference so that closing (which may run
        // callbacks) happens off the runtime.
        drop(self.consumer);
        drop(self.events);
        let _ = tokio::task::spawn_blocking(move || poll_thread.join()).await;
        tracing::info!(connection = %self.name, "consumer closed");
    }
}

/// What the commit thread is asked to commit: partitions with offsets and metadata.
type CommitBatch = Vec<(TopicPartition, i64, String)>;

/// Starts the connection's commit thread: it commits each batch synchronously (one request
/// at a time, off the runtime) and answers with the broker's verdict per partition, which an
/// asynchronous manual commit never reports (see [`super::committer`]). It ends when the
/// request sender is dropped.
fn spawn_commit_thread(
    connection: &str,
    consumer: Arc<Consumer_>,
    answers: mpsc::UnboundedSender<Vec<CommitResult>>,
) -> std::io::Result<(
    std::sync::mpsc::Sender<CommitBatch>,
    std::thread::JoinHandle<()>,
)> {
    let (tx, rx) = std::sync::mpsc::channel::<CommitBatch>();
    let name = connection.to_owned();
    let handle = std::thread::Builder::new()
        .name(format!("kafka-commit-{connection}"))
        .spawn(move || {
            while let Ok(batch) = rx.recv() {
                let mut tpl = TopicPartitionList::new();
                for (tp, offset, metadata) in &batch {
                    add_commit(&mut tpl, tp, *offset, metadata);
                }
                let refused = match consumer.commit(&tpl, CommitMode::Sync) {
                    Ok(())
                    | Err(rdkafka::error::KafkaError::ConsumerCommit(
                        rdkafka::types::RDKafkaErrorCode::NoOffset,
                    )) => None,
                    Err(e) => Some(e.to_string()),
                };
                metrics::commit(&name, refused.is_none());
                if let Some(reason) = &refused {
                    tracing::debug!(connection = %name, error = %reason, "offset commit refused");
                }
                let results = batch
                    .into_iter()
                    .map(|(tp, offset, metadata)| CommitResult {
                        tp,
                        offset,
                        metadata,
                        refused: refused.clone(),
                    })
                    .collect();
                if answers.send(results).is_err() {
                    break;
                }
            }
            drop(consumer);
        })?;
    Ok((tx, handle))
}

fn add_commit(tpl: &mut TopicPartitionList, tp: &TopicPartition, offset: i64, metadata: &str) {
    let mut elem = tpl.add_partition(&tp.topic, tp.partition);
    let _ = elem.set_offset(Offset::Offset(offset));
    elem.set_metadata(metadata);
}

fn msg_bytes(m: &OwnedMessage) -> usize {
    m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len) + 64
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
