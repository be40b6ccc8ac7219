//! The supervisor of one connection: the loop that wires the consumer's events, the
//! [partition set](super::partitions), the [committer](super::committer) and its
//! [thread](super::commit_thread), the [monitor](super::monitor) and the workers.
//!
//! Each consumer event has its own small `on_*` method; the decisions live in the pure
//! modules, so this file only moves data between them and the consumer: messages in, runs
//! out, commits out, pauses and resumes out, and on revoke and shutdown a drain followed by a
//! synchronous commit.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::TopicPartitionList;
use thiserror::Error;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::commit_thread::{self, CommitAnswer, CommitBatch};
use super::committer::Committer;
use super::context::ConnectorContext;
use super::monitor::{Monitor, STALL_CHECK};
use super::partitions::{Actions, Arrival, Limits, PartitionId, PartitionSet, TriggerSlot};
use super::runs::{RunFinished, Runs, WorkerEvent};
use super::worker::TriggerRuntime;
use super::{consumer_config, AssignedPartition, ConsumerEvent, EVENT_CHANNEL};
use crate::admin::health::{HealthRegistry, Heartbeat};
use crate::codec::registry::RegistryClient;
use crate::codec::Decoder;
use crate::config::ConnectionConfig;
use crate::dispatch::event::TopicPartition;
use crate::dispatch::retry::Backoff;
use crate::dispatch::HttpDispatcher;
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

type Trigger = Arc<TriggerRuntime>;

struct PendingRevoke {
    partitions: Vec<TopicPartition>,
    lost: bool,
    ack: std::sync::mpsc::SyncSender<()>,
    deadline: Instant,
}

/// The commit and flow threads, while they run.
struct CommitChannel {
    requests: std::sync::mpsc::Sender<CommitBatch>,
    thread: std::thread::JoinHandle<()>,
    /// The fallback thread (see [`super::committer`], rule 6), while it is usable.
    fallback: Option<(
        std::sync::mpsc::Sender<CommitBatch>,
        std::thread::JoinHandle<()>,
    )>,
    /// The flow thread: pauses and resumes, in order, off the runtime.
    flow: (
        std::sync::mpsc::Sender<super::poll_loop::FlowOp>,
        std::thread::JoinHandle<()>,
    ),
}

/// Runs one connection.
pub struct ConnectionSupervisor {
    name: String,
    config: ConnectionConfig,
    consumer: Arc<Consumer_>,
    events: mpsc::Receiver<ConsumerEvent>,
    events_tx: mpsc::Sender<ConsumerEvent>,
    /// Each topic's trigger (topics matched by a pattern are added when first assigned).
    by_topic: HashMap<String, TriggerSlot<Trigger>>,
    /// Each trigger by name.
    by_name: HashMap<String, TriggerSlot<Trigger>>,
    /// Every trigger once.
    triggers: Vec<Trigger>,
    partitions: PartitionSet<Trigger>,
    /// Reused between rounds of [`ConnectionSupervisor::process`].
    actions: Actions<Trigger>,
    /// Starts runs; their ends arrive on `completions`.
    runs: Runs,
    completions: mpsc::UnboundedReceiver<WorkerEvent>,
    /// The commit rule: what to commit and when (see [`super::committer`]).
    committer: Committer,
    /// New runs wait because the broker refuses commits (a rebalance).
    holding: bool,
    /// None before `run` and after shutdown began.
    commits: Option<CommitChannel>,
    commit_answers: mpsc::UnboundedReceiver<CommitAnswer>,
    commit_answers_tx: mpsc::UnboundedSender<CommitAnswer>,
    monitor: Monitor,
    pending_revoke: Option<PendingRevoke>,
    /// Beaten once per turn of the event loop (`/livez`).
    heartbeat: Heartbeat,
    /// Each partition's records received and not yet handled (the lag in seconds).
    unhandled: HashMap<PartitionId, super::record_age::Unhandled>,
}

/// Most worker events handled before the loop looks at what may start.
const COMPLETIONS_AT_ONCE: usize = 256;

/// Accepted offsets reach the group within this interval plus one round trip. Commits are
/// sent one request at a time from the commit thread, so a crash offers again only what was
/// accepted in that window; the broker sees at most 100 commits a second per connection, and
/// none while nothing is accepted.
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
    pub producer: Option<crate::produce::producer::IdempotentProducer>,
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
            .any(crate::config::TriggerConfig::dead_letters);
        let producer = if dead_letters || produces {
            Some(
                crate::produce::producer::IdempotentProducer::try_new(name, config).map_err(
                    |source| SupervisorError::Kafka {
                        connection: name.to_owned(),
                        source,
                    },
                )?,
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
        let mut by_topic = HashMap::new();
        let mut by_name = HashMap::new();
        let mut triggers = Vec::new();
        for (tname, t) in &config.triggers {
            let dispatcher = HttpDispatcher::try_new(&t.dispatcher)
                .map_err(|e| setup(format!("trigger {tname} dispatcher: {e}")))?;
            let permits = Arc::new(Semaphore::new(t.concurrency));
            let runtime = Arc::new(TriggerRuntime {
                connection: name.to_owned(),
                group: config.group_id().to_owned(),
                name: tname.clone(),
                config: t.clone(),
                dispatcher,
                permits: Arc::clone(&permits),
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
                metrics: std::sync::OnceLock::new(),
                cloudevents: crate::dispatch::cloudevents::CloudEvents::for_dispatcher(
                    &t.dispatcher,
                    config
                        .kafka
                        .get("bootstrap.servers")
                        .map_or("", String::as_str),
                ),
            });
            let slot = TriggerSlot {
                index: triggers.len(),
                ordering: t.ordering,
                permits,
                runtime: Arc::clone(&runtime),
                batch: t.batch.as_ref().map(super::batch::BatchLimits::from),
            };
            for topic in t.topics.iter().filter(|t| !crate::config::is_pattern(t)) {
                let _ = by_topic.insert(topic.clone(), slot.clone());
            }
            let _ = by_name.insert(tname.clone(), slot);
            triggers.push(runtime);
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
        let (runs, completions) = Runs::new(name, config.group_id());
        let (commit_answers_tx, commit_answers) = mpsc::unbounded_channel();
        Ok(Self {
            name: name.to_owned(),
            config: config.clone(),
            consumer: Arc::new(consumer),
            events,
            events_tx,
            by_topic,
            by_name,
            triggers,
            partitions: PartitionSet::new(Limits {
                per_partition: config.max_buffered_per_partition,
                max_bytes: config.max_buffered_bytes,
                max_tracked_above: super::offsets::MAX_TRACKED_ABOVE,
            }),
            actions: Actions::default(),
            runs,
            completions,
            committer: Committer::new(COMMIT_INTERVAL, COMMIT_HOLD_LIMIT).with_fallback(),
            holding: false,
            commits: None,
            commit_answers,
            commit_answers_tx,
            heartbeat: health.heartbeat(name),
            monitor: Monitor::new(name, health, registry),
            pending_revoke: None,
            unhandled: HashMap::new(),
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
        let (requests, thread) = commit_thread::spawn(
            &self.name,
            Arc::clone(&self.consumer),
            self.commit_answers_tx.clone(),
        )
        .map_err(|e| SupervisorError::Thread(self.name.clone(), e))?;
        let fallback = if self.uses_fallback() {
            let signer = self.consumer.context().signer();
            Some(
                commit_thread::spawn_fallback(
                    &self.name,
                    &self.config,
                    signer,
                    Arc::clone(&self.consumer),
                    self.commit_answers_tx.clone(),
                )
                .map_err(|e| SupervisorError::Thread(self.name.clone(), e))?,
            )
        } else {
            self.committer.fallback_unavailable();
            None
        };
        let flow = super::poll_loop::spawn_flow_thread(&self.name, Arc::clone(&self.consumer))
            .map_err(|e| SupervisorError::Thread(self.name.clone(), e))?;
        self.commits = Some(CommitChannel {
            requests,
            thread,
            fallback,
            flow,
        });

        metrics::register_connection(&self.name, self.triggers.iter().map(|t| t.name.as_str()));
        self.runs.register(&self.triggers);
        // The stall check also bounds how long the loop goes without a turn when idle (1 s):
        // the heartbeat below then says whether the loop is wedged (`/livez`).
        let mut stall_check = tokio::time::interval(STALL_CHECK);
        stall_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.heartbeat.beat();
            let revoke_deadline = self.pending_revoke.as_ref().map(|r| r.deadline);
            let commit_due = self.next_commit_due();
            let batch_due = self.partitions.next_batch_due();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(e) = self.completions.recv() => {
                    self.on_worker_event(e);
                    // Whatever else finished meanwhile, before deciding what starts next.
                    for _ in 0..COMPLETIONS_AT_ONCE {
                        match self.completions.try_recv() {
                            Ok(e) => self.on_worker_event(e),
                            Err(_) => break,
                        }
                    }
                }
                _ = sleep_until_opt(revoke_deadline) => {}
                _ = stall_check.tick() => {
                    self.monitor.check(
                        &self.config, &self.consumer, &mut self.partitions, &self.triggers, &self.runs.tasks,
                    );
                    self.report_lag_seconds();
                }
                _ = sleep_until_opt(commit_due) => {}
                _ = sleep_until_opt(batch_due) => {}
                Some(answer) = self.commit_answers.recv() => self.on_commit_answer(answer),
                event = self.events.recv(), if self.pending_revoke.is_none() => match event {
                    Some(e) => self.on_event(e),
                    None => break,
                },
            }
            if self.pending_revoke.is_some() {
                self.try_finish_revoke().await;
            }
            self.update_hold();
            self.process();
            self.send_commits();
        }
        // Stopping is bounded by the drain deadline, not by the liveness bound.
        self.heartbeat.retire();
        self.shut_down(stop, poll_thread).await;
        Ok(())
    }

    fn on_event(&mut self, event: ConsumerEvent) {
        match event {
            ConsumerEvent::Messages(batch) => self.on_messages(batch),
            ConsumerEvent::Positions(positions) => {
                for (tp, position) in positions {
                    self.partitions.on_position(&tp, position);
                }
            }
            ConsumerEvent::Assigned(assigned) => self.on_assigned(assigned),
            ConsumerEvent::Revoked {
                partitions,
                lost,
                ack,
            } => self.on_revoked(partitions, lost, ack),
            ConsumerEvent::Committed(results) => {
                self.committer.on_results(Instant::now(), &results);
            }
            ConsumerEvent::Error(e) => {
                self.consumer.context().note_error(&e, &e.to_string());
                tracing::warn!(connection = %self.name, error = %e, "kafka consumer error");
            }
        }
    }

    /// Whether commits may also go out through the transactional fallback: configured so,
    /// and the classic protocol (the consumer protocol's heartbeats never hold commits).
    fn uses_fallback(&self) -> bool {
        let kip848 = self
            .config
            .kafka
            .get("group.protocol")
            .is_some_and(|p| p.eq_ignore_ascii_case("consumer"));
        self.config.commit_fallback == crate::config::CommitFallback::Transactional && !kip848
    }

    fn on_commit_answer(&mut self, answer: CommitAnswer) {
        let now = Instant::now();
        match answer {
            CommitAnswer::Consumer(results) => self.committer.on_answer(now, &results),
            CommitAnswer::Fallback(results) => self.committer.on_fallback_answer(now, &results),
            CommitAnswer::FallbackUnavailable(reason) => {
                tracing::warn!(connection = %self.name, error = %reason,
                    prefix = commit_thread::FALLBACK_ID_PREFIX,
                    "the transactional commit fallback is unavailable (grant WRITE and DESCRIBE on the transactional ids with this prefix, or set commit_fallback = \"off\"): commits made during a rebalance wait for it to end");
                self.committer.fallback_unavailable();
                if let Some(c) = &mut self.commits {
                    c.fallback = None;
                }
            }
        }
    }

    fn on_messages(&mut self, batch: Vec<OwnedMessage>) {
        // Counted per run of messages of one topic, not per message.
        let mut run: Option<(String, u64)> = None;
        for msg in batch {
            match &mut run {
                Some((topic, n)) if topic == msg.topic() => *n += 1,
                _ => {
                    if let Some((topic, n)) = run.take() {
                        metrics::consumed(&self.name, &topic, n);
                    }
                    run = Some((msg.topic().to_owned(), 1));
                }
            }
            self.on_message(msg);
        }
        if let Some((topic, n)) = run {
            metrics::consumed(&self.name, &topic, n);
        }
    }

    fn on_message(&mut self, msg: OwnedMessage) {
        let offset = msg.offset();
        let timestamp = msg.timestamp().to_millis();
        match self.partitions.on_message(msg) {
            Arrival::Queued(id) => {
                let commit_offset = self
                    .partitions
                    .get(id)
                    .and_then(|p| p.tracker.commit_offset());
                self.unhandled
                    .entry(id)
                    .or_default()
                    .push(offset, timestamp, commit_offset);
            }
            Arrival::AlreadyAccepted(id) => {
                if let Some(p) = self.partitions.get(id) {
                    metrics::handled(&self.name, &p.trigger.runtime.name, "already_accepted");
                    tracing::debug!(connection = %self.name, topic = %p.tp.topic, partition = p.tp.partition, offset, "handled already; not dispatched again");
                }
            }
            Arrival::AlreadyReceived(id) => {
                if let Some(p) = self.partitions.get(id) {
                    tracing::debug!(connection = %self.name, topic = %p.tp.topic, partition = p.tp.partition, offset, "delivered again while waiting or in flight; not dispatched twice");
                }
            }
            Arrival::NotAssigned(msg) => {
                tracing::warn!(connection = %self.name, topic = msg.topic(), partition = msg.partition(), offset, "message for a partition not assigned; ignored");
            }
        }
    }

    fn on_assigned(&mut self, assigned: Vec<AssignedPartition>) {
        metrics::rebalance(&self.name, "assign");
        self.committer.rebalanced();
        // librdkafka can keep a partition's pause flag across revoke and re-assign; a new
        // assignment starts unpaused, in librdkafka as in the partition set.
        let mut fresh = TopicPartitionList::new();
        for a in &assigned {
            let _ = fresh.add_partition(&a.tp.topic, a.tp.partition);
        }
        if fresh.count() > 0 {
            // Through the flow thread, behind any pause decided before the revoke.
            self.pause_or_resume(false, fresh);
        }
        let now = Instant::now();
        for a in assigned {
            let Some(trigger) = self.trigger_of(&a.tp.topic) else {
                tracing::warn!(connection = %self.name, topic = %a.tp.topic, partition = a.tp.partition, "assigned a partition of a topic no trigger consumes; its messages are ignored");
                continue;
            };
            tracing::info!(connection = %self.name, topic = %a.tp.topic, partition = a.tp.partition, "partition assigned");
            self.partitions.assign(a, trigger, now);
        }
        self.report_partitions();
    }

    /// The trigger of `topic`: named by one, or matched by a pattern (then remembered).
    fn trigger_of(&mut self, topic: &str) -> Option<TriggerSlot<Trigger>> {
        if let Some(slot) = self.by_topic.get(topic) {
            return Some(slot.clone());
        }
        let (name, _) = self.config.trigger_for(topic)?;
        let slot = self.by_name.get(name)?.clone();
        tracing::info!(connection = %self.name, topic, trigger = name, "topic matched by the trigger's pattern");
        let _ = self.by_topic.insert(topic.to_owned(), slot.clone());
        Some(slot)
    }

    fn on_revoked(
        &mut self,
        partitions: Vec<TopicPartition>,
        lost: bool,
        ack: std::sync::mpsc::SyncSender<()>,
    ) {
        metrics::rebalance(&self.name, if lost { "lost" } else { "revoke" });
        tracing::info!(connection = %self.name, partitions = partitions.len(), lost, "partitions revoked");
        // A batch waiting for its bounds goes out now, before the drain.
        if !lost {
            self.flush_batches(Some(&partitions));
        }
        // Waiting messages will be read again by the next owner.
        self.partitions.begin_revoke(&partitions, lost);
        let deadline = Instant::now() + Duration::from_millis(self.config.drain_timeout_ms);
        self.pending_revoke = Some(PendingRevoke {
            partitions,
            lost,
            ack,
            deadline,
        });
    }

    fn on_worker_event(&mut self, event: WorkerEvent) {
        match event {
            WorkerEvent::Finished(f) => self.on_run_finished(f),
            WorkerEvent::Yielded(trigger) => self.partitions.wake_starved(trigger),
        }
    }

    fn on_run_finished(&mut self, f: RunFinished) {
        self.runs
            .in_flight_add(f.trigger, -(f.records.len() as f64));
        let handled: Vec<(i64, bool)> = f
            .records
            .iter()
            .map(|(offset, outcome)| (*offset, outcome.is_handled()))
            .collect();
        let known = if f.batch {
            self.partitions
                .on_batch_completion(f.id, f.generation, &handled)
        } else {
            let (offset, handled) = handled[0];
            self.partitions
                .on_completion(f.id, f.generation, &f.key, offset, handled)
        };
        if known.is_none() {
            return;
        }
        if let Some(p) = self.partitions.get(f.id) {
            let metrics = p.trigger.runtime.metrics();
            for (_, outcome) in f.records.iter().filter(|(_, o)| o.is_handled()) {
                metrics.handled(outcome.label());
            }
        }
        for (offset, outcome) in &f.records {
            f.span.record("tessel.outcome", outcome.label());
            if outcome.is_handled() && !f.span.is_disabled() {
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

    /// Pauses or resumes `tpl` through the flow thread (in the order decided), or here while
    /// it does not run (before `run`, during shutdown).
    fn pause_or_resume(&self, pause: bool, tpl: TopicPartitionList) {
        let tpl = match &self.commits {
            Some(c) => match c.flow.0.send(super::poll_loop::FlowOp {
                pause,
                partitions: tpl,
            }) {
                Ok(()) => return,
                Err(std::sync::mpsc::SendError(op)) => op.partitions,
            },
            None => tpl,
        };
        let result = if pause {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        if let Err(e) = result {
            let what = if pause { "pause" } else { "resume" };
            tracing::warn!(connection = %self.name, error = %e, "cannot {what} partitions");
        }
    }

    /// Applies what the partition set decided: starts runs, pauses and resumes partitions.
    fn process(&mut self) {
        let mut actions = std::mem::take(&mut self.actions);
        self.partitions.process(Instant::now(), &mut actions);
        for start in actions.starts.drain(..) {
            self.runs.spawn(start);
        }
        let changed = !actions.pause.is_empty() || !actions.resume.is_empty();
        for (list, pause) in [(&mut actions.pause, true), (&mut actions.resume, false)] {
            if list.is_empty() {
                continue;
            }
            let mut tpl = TopicPartitionList::with_capacity(list.len());
            for tp in list.drain(..) {
                let _ = tpl.add_partition(&tp.topic, tp.partition);
            }
            self.pause_or_resume(pause, tpl);
        }
        if changed {
            self.report_partitions();
        }
        self.actions = actions;
    }

    /// Starts the batches of `tps` (None: all) waiting for their bounds, before a revoke or
    /// the shutdown drains them.
    fn flush_batches(&mut self, tps: Option<&[TopicPartition]>) {
        let mut actions = std::mem::take(&mut self.actions);
        self.partitions.flush_batches(tps, &mut actions);
        if !actions.starts.is_empty() {
            tracing::info!(connection = %self.name, batches = actions.starts.len(), "sending the batches waiting in partitions being drained");
        }
        for start in actions.starts.drain(..) {
            self.runs.spawn(start);
        }
        self.actions = actions;
    }

    /// Reports each assigned partition's lag in seconds: the age of its oldest record
    /// received and not yet handled.
    fn report_lag_seconds(&mut self) {
        let now = super::record_age::now_ms();
        for p in self.partitions.iter() {
            let Some(id) = self.partitions.id_of(&p.tp.topic, p.tp.partition) else {
                continue;
            };
            let age_ms = self
                .unhandled
                .get_mut(&id)
                .map_or(0, |u| u.oldest_age_ms(p.tracker.commit_offset(), now));
            metrics::consumer_lag_seconds(
                &self.name,
                &p.tp.topic,
                p.tp.partition,
                age_ms as f64 / 1000.0,
            );
        }
    }

    /// When the loop must wake to send commits: a send slot for moved commit offsets, or a
    /// wanted commit's (re)send time.
    fn next_commit_due(&self) -> Option<Instant> {
        let now = Instant::now();
        let slot = self
            .partitions
            .commits_pending()
            .then(|| self.committer.next_take(now))
            .flatten();
        [
            slot,
            self.committer.next_due(),
            self.committer.next_fallback_due(now),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Sends the commits that are due, in one request to the commit thread. Moved commit
    /// offsets are taken from the partition set (their metadata encoded) only when a request
    /// may go out, and stored for librdkafka's auto-commit, the backstop.
    fn send_commits(&mut self) {
        let Some(channel) = &self.commits else {
            return;
        };
        let now = Instant::now();
        if self.partitions.commits_pending() && self.committer.can_take(now) {
            let mut store = TopicPartitionList::new();
            let committer = &mut self.committer;
            self.partitions.take_commits(now, |tp, offset, metadata| {
                commit_thread::add(&mut store, tp, offset, &metadata);
                committer.want(now, tp.clone(), offset, metadata);
            });
            if store.count() > 0 {
                if let Err(e) = self.consumer.store_offsets(&store) {
                    tracing::warn!(connection = %self.name, error = %e, "cannot store offsets");
                }
            }
        }
        let fallback = self.committer.take_fallback(now);
        if !fallback.is_empty() {
            if let Some((requests, _)) = &channel.fallback {
                if requests.send(fallback).is_err() {
                    self.committer.fallback_unavailable();
                }
            }
        }
        let due = self.committer.take_due(now);
        if due.is_empty() {
            return;
        }
        if channel.requests.send(due).is_err() {
            tracing::error!(connection = %self.name, "the commit thread is gone; commits rely on auto-commit until restart");
            self.commits = None;
        }
    }

    /// Starts or ends the hold on new runs while the broker refuses commits.
    fn update_hold(&mut self) {
        let holding = self.committer.holding(Instant::now());
        if holding == self.holding {
            return;
        }
        self.holding = holding;
        self.partitions.set_holding(holding);
        if holding {
            match self.committer.refusing().map(|(_, r)| r.to_owned()) {
                Some(reason) => tracing::warn!(connection = %self.name, error = %reason,
                    "the broker refuses offset commits (a rebalance in progress?): new runs wait, refused commits are sent again"),
                // librdkafka holds a commit back while the group rebalances (classic protocol:
                // until every member rejoined or a dead one's session expired).
                None => {
                    tracing::warn!(connection = %self.name, waited_ms = super::committer::UNANSWERED_HOLD.as_millis() as u64,
                    "an offset commit is unanswered (a rebalance in progress?): new runs wait until it is answered")
                }
            }
        } else if self.committer.refusing().is_some() {
            tracing::warn!(connection = %self.name, limit_s = COMMIT_HOLD_LIMIT.as_secs(),
                "offset commits refused for too long: dispatching again; a crash now may offer accepted runs again");
        } else {
            tracing::info!(connection = %self.name, "offset commits accepted again: new runs start");
        }
    }

    fn report_partitions(&self) {
        metrics::partitions(
            &self.name,
            self.partitions.len(),
            self.partitions.paused_count(),
        );
    }

    /// Completes a pending revoke once its runs have finished (or its deadline passed): the
    /// latest state is committed synchronously (unless the assignment was lost), the
    /// partitions are forgotten and librdkafka is released.
    async fn try_finish_revoke(&mut self) {
        let Some(r) = &self.pending_revoke else {
            return;
        };
        let in_flight = self.partitions.in_flight_of(&r.partitions);
        let expired = Instant::now() >= r.deadline;
        // A commit request still out (the consumer's, which the commit thread may not even
        // have handed to librdkafka yet, or the fallback's) could land after the final commit
        // and move the offset back: its answer comes first.
        let commits_out = self.committer.request_out() || self.committer.fallback_busy();
        if (in_flight > 0 || commits_out) && !expired {
            return;
        }
        let Some(r) = self.pending_revoke.take() else {
            return;
        };
        if expired && in_flight > 0 {
            tracing::warn!(connection = %self.name, in_flight, "drain deadline passed on revoke; unfinished runs will be dispatched again by the next owner");
        }
        if !r.lost {
            let commits = self.final_commits(r.partitions.iter());
            // The answer can wait behind the group's rebalance (see commit_sync), which Kafka
            // bounds, not the liveness bound: the loop is waiting, not wedged.
            let commit = commit_thread::commit_sync(&self.name, &self.consumer, commits);
            self.heartbeat.beating_while(commit).await;
        }
        for tp in &r.partitions {
            if let Some(id) = self.partitions.id_of(&tp.topic, tp.partition) {
                let _ = self.unhandled.remove(&id);
            }
            metrics::remove_consumer_lag_seconds(&self.name, &tp.topic, tp.partition);
            let _ = self.partitions.remove(tp);
            self.committer.forget(tp);
        }
        self.report_partitions();
        let _ = r.ack.send(());
    }

    fn final_commits<'a>(&mut self, tps: impl Iterator<Item = &'a TopicPartition>) -> CommitBatch {
        tps.filter_map(|tp| {
            let (offset, metadata) = self.partitions.final_commit(tp)?;
            Some((tp.clone(), offset, metadata))
        })
        .collect()
    }

    async fn shut_down(mut self, stop: Arc<AtomicBool>, poll_thread: std::thread::JoinHandle<()>) {
        // The commit thread finishes its request and ends, so the final synchronous commit
        // below is the last one the broker sees.
        if let Some(c) = self.commits.take() {
            drop(c.requests);
            let fallback = c.fallback.map(|(requests, thread)| {
                drop(requests);
                thread
            });
            let (flow, flow_thread) = c.flow;
            drop(flow);
            let _ = tokio::task::spawn_blocking(move || {
                let _ = c.thread.join();
                let _ = flow_thread.join();
                if let Some(t) = fallback {
                    let _ = t.join();
                }
            })
            .await;
        }
        tracing::info!(connection = %self.name, "stopping: draining runs in flight");
        self.flush_batches(None);
        self.partitions.drain_all();
        let deadline = Instant::now() + Duration::from_millis(self.config.drain_timeout_ms);
        loop {
            let in_flight = self.partitions.in_flight();
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
        self.partitions.cancel_all();
        let lost: HashSet<TopicPartition> = self
            .pending_revoke
            .as_ref()
            .filter(|r| r.lost)
            .map(|r| r.partitions.iter().cloned().collect())
            .unwrap_or_default();
        let tps: Vec<TopicPartition> = self
            .partitions
            .iter()
            .map(|p| p.tp.clone())
            .filter(|tp| !lost.contains(tp))
            .collect();
        let commits = self.final_commits(tps.iter());
        // The consumer is still a member (librdkafka's threads run the group protocol): a
        // commit refused while the group rebalances is tried again once the rebalance ends
        // (librdkafka's own commit on close could race the same window).
        let retry = Some(commit_thread::FINAL_COMMIT_RETRY);
        commit_thread::commit_sync_retrying(&self.name, &self.consumer, commits, retry).await;
        // A revoke that arrived with the shutdown is complete now: release the poll thread's
        // revoke callback at once instead of letting it wait for its deadline.
        if let Some(r) = self.pending_revoke.take() {
            let _ = r.ack.send(());
        }
        self.consumer.context().set_closing();
        stop.store(true, AtomicOrdering::SeqCst);
        self.runs.tasks.close();
        // The poll thread must hold the last reference so that closing (which may run
        // callbacks) happens off the runtime.
        drop(self.consumer);
        drop(self.events);
        let _ = tokio::task::spawn_blocking(move || poll_thread.join()).await;
        tracing::info!(connection = %self.name, "consumer closed");
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
