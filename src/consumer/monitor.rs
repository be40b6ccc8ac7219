//! The monitor of one connection: once a second it works out which partitions are stalled
//! and why, probes the registry and the brokers, looks for missing permissions after a
//! refusal, follows paused partitions' end offsets for the lag metric, and reports the
//! connection's health to `/health`, the log and the metrics.
//!
//! The decisions are pure functions ([`stall_reason`], [`PermissionCheck`]) tested alone; the
//! probes run off the supervisor's loop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::time::Instant;
use tokio_util::task::TaskTracker;

use crate::consumer::port::KafkaPort;
use crate::core::batch::BatchLimits;
use std::collections::HashMap;

use rdkafka::message::Message as _;

use crate::admin::health::{ConnectionHealth, HealthRegistry};
use crate::codec::registry::RegistryClient;
use crate::config::ConnectionConfig;
use crate::core::partitions::{Arrival, PartitionId, PartitionSet, PauseReason};
use crate::core::shell::Shell;
use crate::dispatch::event::TopicPartition;
use crate::run::spawn::KafkaShell;
use crate::run::TriggerRuntime;
use crate::telemetry::metrics;

/// How often stalls are looked for (and readiness refreshed).
pub(super) const STALL_CHECK: Duration = Duration::from_secs(1);

/// How often the health of an idle connection is checked (its event loop's only timer then):
/// a third of [`LIVENESS_BOUND`](crate::admin::health::LIVENESS_BOUND), so an idle loop
/// still turns well within it.
pub(super) const IDLE_CHECK: Duration = Duration::from_secs(10);

/// When a connection's health is checked next: every [`STALL_CHECK`] while it is busy
/// (messages buffered, runs in flight) or has nothing assigned (starting, failing, or a
/// member without partitions, whose assignment `/health` should show at once), every
/// [`IDLE_CHECK`] once idle. An idle connection so wakes its event loop every 10 s, not
/// every second.
#[derive(Debug)]
pub(super) struct CheckClock {
    last: Instant,
    busy: bool,
}

impl CheckClock {
    /// A clock whose first check is due at once.
    pub(super) fn new(now: Instant) -> Self {
        Self {
            last: now.checked_sub(IDLE_CHECK).unwrap_or(now),
            busy: true,
        }
    }

    /// When the next check is due.
    pub(super) fn due(&self) -> Instant {
        self.last + if self.busy { STALL_CHECK } else { IDLE_CHECK }
    }

    /// Notes a turn of the loop: a connection that became busy is checked every second.
    pub(super) fn busy_if<S: Shell>(&mut self, partitions: &PartitionSet<S>) {
        if !self.busy {
            self.busy = is_busy(partitions);
        }
    }

    /// A check was made at `now`.
    pub(super) fn checked<S: Shell>(&mut self, now: Instant, partitions: &PartitionSet<S>) {
        self.checked_when(now, is_busy(partitions));
    }

    fn checked_when(&mut self, now: Instant, busy: bool) {
        self.last = now;
        self.busy = busy;
    }
}

fn is_busy<S: Shell>(partitions: &PartitionSet<S>) -> bool {
    partitions.is_empty() || partitions.buffered_bytes() > 0 || partitions.in_flight() > 0
}

/// How often the end offsets of paused partitions are queried for the lag metric.
const PAUSED_END_PROBE: Duration = Duration::from_secs(5);

/// How often the schema registry is probed for readiness.
const REGISTRY_PROBE: Duration = Duration::from_secs(5);

/// How often missing permissions are looked for again while they are reported.
const PERMISSION_RECHECK: Duration = Duration::from_secs(10);

/// What is known of a partition with a backlog and no progress, for [`stall_reason`].
#[derive(Debug, Clone, Default)]
pub(super) struct StallFacts {
    /// Messages waiting or in flight.
    pub backlog: usize,
    /// Since the commit offset last moved.
    pub without_progress: Duration,
    /// The trigger was stopped by a configuration error.
    pub trigger_stopped: bool,
    /// The trigger's latest failure within the stall window.
    pub recent_failure: Option<String>,
    /// The partition's commit offset.
    pub commit_offset: Option<i64>,
    /// The partition is paused, and why.
    pub paused: Option<PauseReason>,
    /// Bytes of its waiting messages.
    pub buffered_bytes: usize,
    /// The offsets handled above the commit offset reached their bound: the partition is
    /// paused until the record at the commit offset is handled.
    pub gap_full: bool,
    /// Its runs and commits wait until its topic's id is read again (librdkafka hinted that
    /// the topic was deleted or created again, or its position moved back).
    pub awaiting_topic_id: bool,
    /// New runs wait: the broker refuses its commits (its own, or the connection's).
    pub commits_refused: bool,
}

/// How long a partition may go without progress before it counts as stalled: `stall_after`,
/// and for a batch trigger also the time its batch may wait for records (`max_wait_ms`), since
/// a quiet partition's waiting batch makes no progress until then by design.
pub(super) fn stall_window(stall_after: Duration, batch: Option<&BatchLimits>) -> Duration {
    stall_after.saturating_add(batch.map_or(Duration::ZERO, |b| b.max_wait))
}

/// Why a partition is stalled, if it is: a backlog and no progress for `after`.
pub(super) fn stall_reason(f: &StallFacts, after: Duration) -> Option<String> {
    if f.backlog == 0 || f.without_progress < after {
        return None;
    }
    Some(if f.trigger_stopped {
        "trigger stopped by a configuration error".to_owned()
    } else if f.awaiting_topic_id {
        "holding its runs and commits until its topic's id is read: the topic may have been \
         deleted or created again, or its position moved back (an offset reset, a truncated \
         log); the topic cannot be described yet, or is gone"
            .to_owned()
    } else if f.commits_refused {
        match f.commit_offset {
            Some(o) => format!(
                "new runs wait: the broker refuses the commit of offset {o} (see the \
                 commit errors in the log)"
            ),
            None => "new runs wait: the broker refuses its commits (see the commit errors in \
                     the log)"
                .to_owned(),
        }
    } else if let Some(failure) = &f.recent_failure {
        match f.commit_offset {
            Some(o) => format!("key parked at offset {o}: a message is being retried ({failure})"),
            None => format!("key parked: a message is being retried ({failure})"),
        }
    } else if f.gap_full {
        let bound = crate::core::offsets::MAX_TRACKED_ABOVE;
        match f.commit_offset {
            Some(o) => format!(
                "paused at the gap bound: {bound} records handled above offset {o} wait for it"
            ),
            None => format!("paused at the gap bound: {bound} records handled above a gap"),
        }
    } else if f.paused == Some(PauseReason::Metadata) {
        match f.commit_offset {
            Some(o) => format!(
                "paused at the commit metadata's budget: the records handled above offset {o} \
                 fill commit_metadata_max_bytes; only the record at {o} runs"
            ),
            None => "paused at the commit metadata's budget (commit_metadata_max_bytes)".to_owned(),
        }
    } else if f.paused == Some(PauseReason::Budget) {
        format!(
            "paused: the connection's byte budget (max_buffered_bytes) is full and this partition holds {} bytes of it",
            f.buffered_bytes
        )
    } else if f.paused.is_some() {
        "paused: the partition's buffer is full".to_owned()
    } else {
        "waiting for runs in flight".to_owned()
    })
}

/// When to diagnose permissions: after an authorization refusal, and again every
/// [`PERMISSION_RECHECK`] while some are reported missing.
#[derive(Debug, Default)]
pub(super) struct PermissionCheck {
    last: Option<Instant>,
    wanted: bool,
}

impl PermissionCheck {
    /// Whether a diagnosis should start now; `refused`: a refusal was seen since the last
    /// call; `reported`: permissions are reported missing now.
    pub(super) fn due(&mut self, now: Instant, refused: bool, reported: bool) -> bool {
        self.wanted |= refused;
        let rested = self
            .last
            .is_none_or(|t| now.saturating_duration_since(t) >= PERMISSION_RECHECK);
        if !(self.wanted || reported) || !rested {
            return false;
        }
        self.wanted = false;
        self.last = Some(now);
        true
    }
}

/// The monitor's state between checks.
pub(super) struct Monitor {
    name: String,
    health: HealthRegistry,
    registry: Option<Arc<RegistryClient>>,
    registry_reachable: Arc<AtomicBool>,
    last_registry_probe: Option<Instant>,
    last_paused_end_probe: Option<Instant>,
    paused_end_probe_running: Arc<AtomicBool>,
    /// The last query found paused partitions (so the next one clears them).
    paused_ends_reported: bool,
    /// Where the probe says which paused partitions' logs end below what they read.
    events: tokio::sync::mpsc::Sender<crate::consumer::ConsumerEvent>,
    /// Permissions found missing by the last diagnosis (see [`crate::clients::probe`]).
    missing_permissions: Arc<Mutex<Vec<String>>>,
    permissions: PermissionCheck,
}

impl Monitor {
    /// A monitor reporting to `health` under `name`.
    pub(super) fn new(
        name: &str,
        health: HealthRegistry,
        registry: Option<Arc<RegistryClient>>,
        events: tokio::sync::mpsc::Sender<crate::consumer::ConsumerEvent>,
    ) -> Self {
        Self {
            name: name.to_owned(),
            health,
            registry_reachable: Arc::new(AtomicBool::new(registry.is_none())),
            registry,
            last_registry_probe: None,
            last_paused_end_probe: None,
            paused_end_probe_running: Arc::new(AtomicBool::new(false)),
            paused_ends_reported: false,
            events,
            missing_permissions: Arc::new(Mutex::new(Vec::new())),
            permissions: PermissionCheck::default(),
        }
    }

    /// One check: stalls, probes, permissions, readiness.
    pub(super) fn check<P: KafkaPort>(
        &mut self,
        config: &ConnectionConfig,
        consumer: &Arc<P>,
        partitions: &mut PartitionSet<KafkaShell>,
        triggers: &[Arc<TriggerRuntime>],
        tasks: &TaskTracker,
    ) {
        self.probe_registry();
        let brokers_up = consumer.brokers_up();
        if let Some(up) = brokers_up {
            metrics::brokers_up(&self.name, up);
        }
        self.check_permissions(config, consumer.take_authorization_refused(), tasks);
        let mut health = ConnectionHealth {
            brokers_up: brokers_up.unwrap_or(false),
            registry_reachable: self.registry_reachable.load(Ordering::SeqCst),
            assigned_partitions: partitions.len(),
            kafka_error: consumer.connect_failure(),
            missing_permissions: self
                .missing_permissions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            ..ConnectionHealth::default()
        };
        let after = Duration::from_millis(config.stall_after_ms);
        let now = crate::clock::now();
        let holding = partitions.holding();
        for p in partitions.iter_mut() {
            let backlog = p.backlog();
            // A trigger an operator paused is not stalled: it waits as asked.
            if backlog == 0 || p.trigger.runtime.control.paused() {
                p.last_progress = now;
            }
            let without_progress = now.saturating_duration_since(p.last_progress);
            let after = stall_window(after, p.trigger.batch.as_ref());
            // The rest (a lock, the commit offset) is looked up only for a stalled partition.
            let reason = (backlog > 0 && without_progress >= after)
                .then(|| {
                    let trigger = &p.trigger.runtime;
                    stall_reason(
                        &StallFacts {
                            backlog,
                            without_progress,
                            trigger_stopped: trigger.stopped.load(Ordering::SeqCst),
                            recent_failure: trigger.recent_failure(after),
                            commit_offset: p.tracker.commit_offset(),
                            paused: p.paused,
                            buffered_bytes: p.buffered_bytes(),
                            gap_full: p.tracker.gap_full(),
                            awaiting_topic_id: p.unverified.is_some(),
                            commits_refused: holding || p.commit_refused(),
                        },
                        after,
                    )
                })
                .flatten();
            let tp = &p.tp;
            match (&p.stalled, &reason) {
                (None, Some(r)) => tracing::warn!(connection = %self.name, topic = %tp.topic,
                    partition = tp.partition, reason = %r,
                    stalled_for_ms = without_progress.as_millis() as u64, "partition stalled"),
                (Some(_), None) => tracing::info!(connection = %self.name, topic = %tp.topic,
                    partition = tp.partition, "partition progressing again"),
                _ => {}
            }
            p.stalled = reason;
            if let Some(r) = &p.stalled {
                let _ = health.stalled_partitions.insert(tp.to_string(), r.clone());
            }
        }
        for t in triggers {
            // A refused dead-letter write is retried with backoff (at most max_backoff_ms
            // apart), so a refusal within twice that is still current.
            let window = Duration::from_millis(t.config.retry.max_backoff_ms.saturating_mul(2))
                .max(STALL_CHECK * 10);
            if let Some(p) = t.recent_missing_permission(window) {
                if !health.missing_permissions.contains(&p) {
                    health.missing_permissions.push(p);
                }
            }
            if t.stopped.load(Ordering::SeqCst) {
                let reason = t.recent_failure(Duration::MAX).unwrap_or_default();
                let _ = health.stopped_triggers.insert(t.name.clone(), reason);
            }
            health.parked_keys += t.control.parked_count();
            if t.control.paused() {
                let reason = t.control.target().reason.unwrap_or_default();
                let _ = health.paused_triggers.insert(t.name.clone(), reason);
            }
        }
        metrics::stalled(&self.name, health.stalled_partitions.len());
        self.health.set(&self.name, health);
        self.probe_paused_ends(consumer, partitions);
    }

    fn probe_registry(&mut self) {
        let Some(registry) = &self.registry else {
            return;
        };
        if self
            .last_registry_probe
            .is_some_and(|t| crate::clock::now().saturating_duration_since(t) < REGISTRY_PROBE)
        {
            return;
        }
        self.last_registry_probe = Some(crate::clock::now());
        let registry = Arc::clone(registry);
        let flag = Arc::clone(&self.registry_reachable);
        drop(tokio::spawn(async move {
            let ok = registry.probe().await.is_ok();
            flag.store(ok, Ordering::SeqCst);
        }));
    }

    /// After the broker refused an operation for lack of a permission (and while one is
    /// reported missing), works out which permissions are missing with the same probes as
    /// `tessel-kafka check`, off the runtime, and reports them in the log and `/health`.
    fn check_permissions(&mut self, config: &ConnectionConfig, refused: bool, tasks: &TaskTracker) {
        let reported = !self
            .missing_permissions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty();
        if !self.permissions.due(crate::clock::now(), refused, reported) {
            return;
        }
        let name = self.name.clone();
        let config = config.clone();
        let slot = Arc::clone(&self.missing_permissions);
        drop(tasks.spawn_blocking(move || {
            let missing = crate::clients::probe::missing_consumer_permissions(&name, &config);
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
        }));
    }

    /// Queries the end offsets of paused partitions (off the async threads, one probe at a
    /// time), so their lag keeps following the log while they are not fetched.
    fn probe_paused_ends<P: KafkaPort>(
        &mut self,
        consumer: &Arc<P>,
        partitions: &PartitionSet<KafkaShell>,
    ) {
        if self
            .last_paused_end_probe
            .is_some_and(|t| crate::clock::now().saturating_duration_since(t) < PAUSED_END_PROBE)
            || self.paused_end_probe_running.load(Ordering::SeqCst)
        {
            return;
        }
        self.last_paused_end_probe = Some(crate::clock::now());
        // An operator's pause stops the fetch too (its trigger's partitions). Each with its
        // assignment and what it had read: an end below that, asked after it was read, is a
        // log cut or replaced while not fetched.
        let paused: Vec<(TopicPartition, u64, Option<i64>)> = partitions
            .iter()
            .filter(|p| p.paused.is_some() || p.trigger.runtime.control.paused())
            .map(|p| (p.tp.clone(), p.generation, p.tracker.seen()))
            .collect();
        if paused.is_empty() && !self.paused_ends_reported {
            return;
        }
        self.paused_ends_reported = !paused.is_empty();
        self.paused_end_probe_running.store(true, Ordering::SeqCst);
        let running = Arc::clone(&self.paused_end_probe_running);
        let consumer = Arc::clone(consumer);
        let events = self.events.clone();
        crate::consumer::port::start::<P>(move || {
            // One deadline for the whole probe, so an unreachable cluster holds this
            // thread (and the consumer) only briefly.
            let deadline = crate::clock::now() + PAUSED_END_PROBE;
            let mut ends = std::collections::HashMap::new();
            let mut cut = Vec::new();
            for (tp, generation, read) in paused {
                let left = deadline.saturating_duration_since(crate::clock::now());
                if left.is_zero() {
                    break;
                }
                if let Ok(high) = consumer.high_watermark(&tp, left) {
                    if read.is_some_and(|read| high < read) {
                        cut.push((tp.clone(), generation, high));
                    }
                    let _ = ends.insert((tp.topic, tp.partition), high);
                }
            }
            consumer.set_paused_ends(ends);
            // Rare; if the supervisor's queue is full, the next probe asks again.
            if !cut.is_empty() {
                let _ = events.try_send(crate::consumer::ConsumerEvent::LogEnds(cut));
            }
            running.store(false, Ordering::SeqCst);
        });
    }
}

/// Each partition's records received and not yet handled: the lag in seconds.
#[derive(Default)]
pub(super) struct LagSeconds(HashMap<PartitionId, crate::core::record_age::Unhandled>);

impl LagSeconds {
    /// A record at `offset` stamped `timestamp_ms` was queued in partition `id`.
    pub(super) fn queued<S: Shell>(
        &mut self,
        partitions: &PartitionSet<S>,
        id: PartitionId,
        offset: i64,
        timestamp_ms: Option<i64>,
    ) {
        let commit_offset = partitions.get(id).and_then(|p| p.tracker.commit_offset());
        self.0
            .entry(id)
            .or_default()
            .push(offset, timestamp_ms, commit_offset);
    }

    /// Reports each assigned partition's lag in seconds: the age of its oldest record
    /// received and not yet handled.
    pub(super) fn report<S: Shell>(&mut self, connection: &str, partitions: &PartitionSet<S>) {
        let now = crate::clock::now_ms();
        for p in partitions.iter() {
            let Some(id) = partitions.id_of(&p.tp.topic, p.tp.partition) else {
                continue;
            };
            let age_ms = self
                .0
                .get_mut(&id)
                .map_or(0, |u| u.oldest_age_ms(p.tracker.commit_offset(), now));
            metrics::consumer_lag_seconds(
                connection,
                &p.tp.topic,
                p.tp.partition,
                age_ms as f64 / 1000.0,
            );
        }
    }

    /// `revoked` left the assignment (and `partitions`).
    pub(super) fn forget<S: Shell>(
        &mut self,
        connection: &str,
        partitions: &PartitionSet<S>,
        revoked: &[TopicPartition],
    ) {
        self.0.retain(|id, _| partitions.get(*id).is_some());
        for tp in revoked {
            metrics::remove_consumer_lag_seconds(connection, &tp.topic, tp.partition);
        }
    }
}

/// A partition whose position moved back: where it was expected to go on, and the offset it
/// went on from.
#[derive(Debug)]
pub(super) struct MovedBack {
    pub tp: TopicPartition,
    pub expected: i64,
    pub offset: i64,
}

/// Hands `batch` to the core: counted per run of messages of one topic (not per message),
/// each queued record's timestamp noted for the lag in seconds, the others logged. Returns
/// the partitions whose position moved back.
pub(super) fn intake(
    connection: &str,
    core: &mut crate::core::Core<KafkaShell>,
    lag: &mut LagSeconds,
    batch: Vec<rdkafka::message::OwnedMessage>,
) -> Vec<MovedBack> {
    let mut moved = Vec::new();
    let mut run: Option<(String, u64)> = None;
    for msg in batch {
        match &mut run {
            Some((topic, n)) if topic == msg.topic() => *n += 1,
            _ => {
                if let Some((topic, n)) = run.replace((msg.topic().to_owned(), 1)) {
                    metrics::consumed(connection, &topic, n);
                }
            }
        }
        let (offset, timestamp) = (msg.offset(), msg.timestamp().to_millis());
        match core.on_message(msg) {
            Arrival::Queued(id) => lag.queued(core.partitions(), id, offset, timestamp),
            Arrival::MovedBack {
                id,
                expected,
                offset,
            } => {
                lag.queued(core.partitions(), id, offset, timestamp);
                if let Some(p) = core.partitions().get(id) {
                    moved.push(MovedBack {
                        tp: p.tp.clone(),
                        expected,
                        offset,
                    });
                }
            }
            arrival => log_arrival(connection, core.partitions(), &arrival, offset),
        }
    }
    if let Some((topic, n)) = run {
        metrics::consumed(connection, &topic, n);
    }
    moved
}

/// Logs a message that was not queued.
fn log_arrival(
    connection: &str,
    partitions: &PartitionSet<KafkaShell>,
    arrival: &Arrival<rdkafka::message::OwnedMessage>,
    offset: i64,
) {
    match arrival {
        Arrival::Queued(_) => {}
        Arrival::AlreadyAccepted(id) => {
            if let Some(p) = partitions.get(*id) {
                p.trigger.runtime.metrics().handled("already_accepted");
                tracing::debug!(connection, topic = %p.tp.topic, partition = p.tp.partition, offset, "handled already; not dispatched again");
            }
        }
        Arrival::MovedBack { .. } => {}
        Arrival::BeforeSeek(id) => {
            if let Some(p) = partitions.get(*id) {
                tracing::debug!(connection, topic = %p.tp.topic, partition = p.tp.partition, offset, "read before the move to the new log's start; read again from there");
            }
        }
        Arrival::NotAssigned(msg) => {
            tracing::warn!(
                connection,
                topic = msg.topic(),
                partition = msg.partition(),
                offset,
                "message for a partition not assigned; ignored"
            );
        }
    }
}

/// Logs a change of the hold on new runs (rule 4 of the commit rule).
pub(super) fn log_hold(connection: &str, change: &crate::core::HoldChange) {
    let expired = change.expired;
    if let Some(tp) = &change.partition {
        let (topic, partition) = (tp.topic.as_str(), tp.partition);
        let reason = change.reason.as_deref().unwrap_or_default();
        match (change.holding, expired) {
            (true, _) => tracing::warn!(connection, topic, partition, error = %reason,
                "the broker refuses this partition's offset commits: its new runs wait, the other partitions go on"),
            (false, true) => tracing::warn!(connection, topic, partition, error = %reason,
                "this partition's offset commits refused for too long: dispatching again; a crash now may offer accepted runs again"),
            (false, false) => tracing::info!(
                connection,
                topic,
                partition,
                "this partition's offset commits accepted again: its new runs start"
            ),
        }
        return;
    }
    match (change.holding, change.reason.as_deref()) {
        (true, Some(reason)) => tracing::warn!(connection, error = %reason,
            "the broker refuses offset commits (a rebalance in progress?): new runs wait, refused commits are sent again"),
        // librdkafka holds a commit back while the group rebalances (classic protocol: until
        // every member rejoined or a dead one's session expired).
        (true, None) => tracing::warn!(connection, waited_ms = crate::core::committer::UNANSWERED_HOLD.as_millis() as u64,
            "an offset commit is unanswered (a rebalance in progress?): new runs wait until it is answered"),
        (false, _) if expired => tracing::warn!(connection,
            "offset commits refused for too long: dispatching again; a crash now may offer accepted runs again"),
        (false, _) => tracing::info!(connection, "offset commits accepted again: new runs start"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(30);

    fn stalled(f: StallFacts) -> Option<String> {
        stall_reason(&f, AFTER)
    }

    /// An idle connection's loop wakes every 10 s, not every second, and still turns well
    /// within the liveness bound (`/livez` must not call an idle loop wedged); it is checked
    /// every second again as soon as it is busy.
    #[test]
    fn an_idle_connection_is_checked_every_ten_seconds_and_a_busy_one_every_second() {
        use crate::admin::health::LIVENESS_BOUND;
        assert!(IDLE_CHECK * 3 <= LIVENESS_BOUND);
        let t0 = Instant::now();
        let mut clock = CheckClock::new(t0);
        assert!(clock.due() <= t0, "the first check is due at once");
        clock.checked_when(t0, true);
        assert_eq!(clock.due(), t0 + STALL_CHECK);
        clock.checked_when(t0 + STALL_CHECK, false);
        assert_eq!(clock.due(), t0 + STALL_CHECK + IDLE_CHECK);
        // Nothing assigned: busy (the assignment shows in /health within a second).
        clock.busy_if(&PartitionSet::<KafkaShell>::new(
            crate::core::partitions::Limits {
                per_partition: 10,
                max_bytes: 1000,
                max_tracked_above: 10,
                metadata_max_chars: 4096,
            },
        ));
        assert_eq!(clock.due(), t0 + STALL_CHECK * 2);
    }

    #[test]
    fn a_waiting_batch_is_not_a_stall_before_its_wait_is_over() {
        assert_eq!(stall_window(AFTER, None), AFTER);
        let limits = BatchLimits {
            max_records: 500,
            max_bytes: 1 << 20,
            max_wait: Duration::from_secs(120),
        };
        let window = stall_window(AFTER, Some(&limits));
        assert_eq!(window, Duration::from_secs(150));
        // A batch waiting its 120 s on a quiet partition, 100 s in: longer than stall_after,
        // still not stalled; once the wait and stall_after are both over without progress, it is.
        let facts = |secs| StallFacts {
            backlog: 3,
            without_progress: Duration::from_secs(secs),
            ..StallFacts::default()
        };
        assert!(stall_reason(&facts(100), window).is_none());
        assert!(stall_reason(&facts(150), window).is_some());
    }

    #[test]
    fn no_backlog_or_recent_progress_is_no_stall() {
        let idle = StallFacts {
            backlog: 0,
            without_progress: AFTER * 10,
            ..StallFacts::default()
        };
        assert_eq!(stalled(idle), None);
        let busy = StallFacts {
            backlog: 5,
            without_progress: AFTER - Duration::from_millis(1),
            ..StallFacts::default()
        };
        assert_eq!(stalled(busy), None);
    }

    #[test]
    fn a_partition_waiting_for_its_topic_id_or_a_refused_commit_says_so() {
        let base = StallFacts {
            backlog: 3,
            without_progress: AFTER,
            commit_offset: Some(41),
            paused: Some(PauseReason::Budget),
            ..StallFacts::default()
        };
        let unverified = StallFacts {
            awaiting_topic_id: true,
            commits_refused: true,
            ..base.clone()
        };
        assert!(stalled(unverified)
            .unwrap()
            .starts_with("holding its runs and commits until its topic's id is read"));
        let refused = StallFacts {
            commits_refused: true,
            ..base.clone()
        };
        assert_eq!(
            stalled(refused).unwrap(),
            "new runs wait: the broker refuses the commit of offset 41 (see the commit errors in the log)"
        );
        let refused_none = StallFacts {
            commits_refused: true,
            commit_offset: None,
            ..base.clone()
        };
        assert!(stalled(refused_none)
            .unwrap()
            .starts_with("new runs wait: the broker refuses its commits"));
        // A trigger stopped by its configuration says that first; without either, the
        // budget's reason as before.
        let stopped = StallFacts {
            trigger_stopped: true,
            awaiting_topic_id: true,
            ..base.clone()
        };
        assert_eq!(
            stalled(stopped).unwrap(),
            "trigger stopped by a configuration error"
        );
        assert!(stalled(base)
            .unwrap()
            .starts_with("paused: the connection's byte budget"));
    }

    #[test]
    fn the_reason_names_the_most_specific_cause() {
        let base = StallFacts {
            backlog: 3,
            without_progress: AFTER,
            commit_offset: Some(41),
            ..StallFacts::default()
        };
        assert_eq!(stalled(base.clone()).unwrap(), "waiting for runs in flight");
        let paused = StallFacts {
            paused: Some(PauseReason::Buffer),
            ..base.clone()
        };
        let budget = StallFacts {
            paused: Some(PauseReason::Budget),
            buffered_bytes: 600_000,
            ..base.clone()
        };
        assert_eq!(
            stalled(budget).unwrap(),
            "paused: the connection's byte budget (max_buffered_bytes) is full and this partition holds 600000 bytes of it"
        );
        assert_eq!(
            stalled(paused.clone()).unwrap(),
            "paused: the partition's buffer is full"
        );
        let at_gap = StallFacts {
            gap_full: true,
            ..paused.clone()
        };
        assert_eq!(
            stalled(at_gap).unwrap(),
            format!(
                "paused at the gap bound: {} records handled above offset 41 wait for it",
                crate::core::offsets::MAX_TRACKED_ABOVE
            )
        );
        let at_budget = StallFacts {
            paused: Some(PauseReason::Metadata),
            ..paused.clone()
        };
        assert_eq!(
            stalled(at_budget).unwrap(),
            "paused at the commit metadata's budget: the records handled above offset 41 fill \
             commit_metadata_max_bytes; only the record at 41 runs"
        );
        let parked = StallFacts {
            recent_failure: Some("dispatcher failing: HTTP 503".into()),
            gap_full: true,
            ..paused
        };
        assert_eq!(
            stalled(parked.clone()).unwrap(),
            "key parked at offset 41: a message is being retried (dispatcher failing: HTTP 503)"
        );
        let stopped = StallFacts {
            trigger_stopped: true,
            ..parked
        };
        assert_eq!(
            stalled(stopped).unwrap(),
            "trigger stopped by a configuration error"
        );
    }

    #[test]
    fn permissions_are_diagnosed_after_a_refusal_and_rechecked_while_missing() {
        let mut c = PermissionCheck::default();
        let t0 = Instant::now();
        assert!(
            !c.due(t0, false, false),
            "nothing refused, nothing reported"
        );
        assert!(c.due(t0, true, false), "a refusal: diagnose");
        assert!(
            !c.due(t0 + Duration::from_secs(1), true, true),
            "not twice within 10 s"
        );
        // The refusal seen meanwhile is remembered for when the rest ends.
        assert!(c.due(t0 + PERMISSION_RECHECK, false, false));
        assert!(
            !c.due(t0 + PERMISSION_RECHECK * 2, false, false),
            "nothing left to look at"
        );
        assert!(
            c.due(t0 + PERMISSION_RECHECK * 3, false, true),
            "reported missing: recheck"
        );
    }
}
