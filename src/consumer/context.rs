//! The librdkafka client context: logs into tracing, and rebalance callbacks that only hand
//! events to the async side.
//!
//! Why the revoke callback blocks: librdkafka releases revoked partitions when the callback
//! returns. The supervisor must first finish or abandon in-flight runs and commit what was
//! accepted, so the callback sends a `Revoked` event and waits for the supervisor's ack (or a
//! deadline). It never decodes, dispatches or takes a lock itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::TopicPartitionList;
use tokio::sync::mpsc;

use super::{AssignedPartition, ConsumerEvent};
use crate::clients::security::{
    classify_connect_error, ConnectFailure, MskIamSigner, SecurityContext,
};
use crate::dispatch::event::TopicPartition;

/// How long an assignment waits for the group's committed offsets (and their metadata): the
/// coordinator answers at once unless it moves or loads, which this bounds.
const COMMITTED_TIMEOUT: Duration = Duration::from_secs(10);

/// Context shared by the consumer of one connection.
pub struct ConnectorContext {
    /// What every client of the connection does: log forwarding, OAUTHBEARER tokens, the
    /// last connection failure.
    client: SecurityContext,
    events: mpsc::Sender<ConsumerEvent>,
    /// Set once the supervisor has committed for shutdown: callbacks then do nothing.
    closing: AtomicBool,
    /// Upper bound on how long a revoke callback waits for the supervisor.
    revoke_wait: Duration,
    /// Whether at least one broker was up at the last statistics report.
    brokers_up: AtomicBool,
    /// Whether any statistics report arrived yet.
    stats_seen: AtomicBool,
    /// Set when the broker refused an operation for lack of a permission.
    authorization_refused: AtomicBool,
    /// End offsets (last stable offsets) of paused partitions, queried by the supervisor: a
    /// paused partition is not fetched, so the statistics' end offset stops moving.
    paused_ends: Mutex<HashMap<(String, i32), i64>>,
    /// Assigned partitions, by topic, whose lag is reported; with, when the consumer starts at
    /// the end, the end offset first seen (where it started reading).
    assigned: Mutex<HashMap<String, HashMap<i32, Option<i64>>>>,
    /// Whether a partition without a committed offset is read from its end
    /// (`auto.offset.reset` latest), rather than from its beginning.
    start_at_end: bool,
    /// Rebalances seen (assignments and revocations): the poll task stays active after one.
    rebalances: AtomicU64,
    /// librdkafka reset a position or found a topic missing: the assigned topics' ids are
    /// read again soon (a topic deleted and created again changes only its id).
    identity_check: AtomicBool,
    /// The cluster left a request for topic ids unanswered: assignments do not wait for ids.
    ids_unanswered: AtomicBool,
}

impl ConnectorContext {
    pub(crate) fn new(
        connection: String,
        events: mpsc::Sender<ConsumerEvent>,
        revoke_wait: Duration,
        signer: Option<Arc<MskIamSigner>>,
    ) -> Self {
        Self {
            client: SecurityContext::new(&connection, signer),
            events,
            closing: AtomicBool::new(false),
            revoke_wait,
            brokers_up: AtomicBool::new(false),
            stats_seen: AtomicBool::new(false),
            authorization_refused: AtomicBool::new(false),
            paused_ends: Mutex::new(HashMap::new()),
            assigned: Mutex::new(HashMap::new()),
            start_at_end: false,
            rebalances: AtomicU64::new(0),
            identity_check: AtomicBool::new(false),
            ids_unanswered: AtomicBool::new(false),
        }
    }

    /// Whether librdkafka said something since the last call that may mean a topic was
    /// deleted and created again (an offset reset, an unknown topic or partition).
    pub(crate) fn take_identity_check(&self) -> bool {
        // Read first: the poll task asks once per message.
        self.identity_check.load(Ordering::Relaxed)
            && self.identity_check.swap(false, Ordering::SeqCst)
    }

    /// Notes what librdkafka said if it may mean a topic changed identity.
    fn note_identity_hint(&self, fac: &str, message: &str) {
        if is_identity_hint(fac, message) {
            self.identity_check.store(true, Ordering::SeqCst);
        }
    }

    /// How many rebalances (assignments, revocations) the consumer went through.
    pub(crate) fn rebalances(&self) -> u64 {
        self.rebalances.load(Ordering::SeqCst)
    }

    /// Says where the group starts reading a partition it never committed: at its end when
    /// `auto_offset_reset` is `latest` (or `largest`, `end`), else at its beginning. Lag
    /// before the first commit counts from there.
    pub(crate) fn with_offset_reset(mut self, auto_offset_reset: Option<&str>) -> Self {
        self.start_at_end = auto_offset_reset.is_some_and(|r| {
            ["latest", "largest", "end"]
                .iter()
                .any(|e| r.eq_ignore_ascii_case(e))
        });
        self
    }

    /// Partitions were assigned: their lag is reported from the next statistics.
    fn track_lag(&self, tpl: &TopicPartitionList) {
        let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        for e in tpl.elements() {
            let _ = assigned
                .entry(e.topic().to_owned())
                .or_default()
                .insert(e.partition(), None);
        }
    }

    /// Partitions are revoked: their lag series go away (the new owner reports them).
    fn forget_lag(&self, tpl: &TopicPartitionList) {
        let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        for e in tpl.elements() {
            if let Some(partitions) = assigned.get_mut(e.topic()) {
                let _ = partitions.remove(&e.partition());
                if partitions.is_empty() {
                    let _ = assigned.remove(e.topic());
                }
            }
            crate::telemetry::metrics::remove_consumer_lag(
                self.client.connection(),
                e.topic(),
                e.partition(),
            );
        }
    }

    /// Replaces the end offsets of the paused partitions (see [`lag`]).
    pub(crate) fn set_paused_ends(&self, ends: HashMap<(String, i32), i64>) {
        *self.paused_ends.lock().unwrap_or_else(|p| p.into_inner()) = ends;
    }

    /// The last authentication or TLS failure, while no broker is up.
    pub(crate) fn connect_failure(&self) -> Option<ConnectFailure> {
        self.client.last_failure()
    }

    /// Notes an error from librdkafka: connection failures for readiness, authorization
    /// refusals so the supervisor works out which permission is missing.
    pub(crate) fn note_error(&self, error: &KafkaError, reason: &str) {
        use rdkafka::types::RDKafkaErrorCode as C;
        if let Some(f) = classify_connect_error(error, reason) {
            if !matches!(f, ConnectFailure::Unreachable(_)) {
                self.client.record(f);
            }
        }
        if matches!(
            error.rdkafka_error_code(),
            Some(C::TopicAuthorizationFailed | C::GroupAuthorizationFailed)
        ) {
            self.authorization_refused.store(true, Ordering::SeqCst);
        }
    }

    /// Whether an authorization refusal was seen since the last call.
    pub(crate) fn take_authorization_refused(&self) -> bool {
        self.authorization_refused.swap(false, Ordering::SeqCst)
    }

    /// Brokers reachable, per librdkafka's last statistics (None before the first report).
    pub(crate) fn brokers_up(&self) -> Option<bool> {
        self.stats_seen
            .load(Ordering::SeqCst)
            .then(|| self.brokers_up.load(Ordering::SeqCst))
    }

    pub(crate) fn set_closing(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }
}

/// Whether a line librdkafka logged may mean that a topic was deleted or created again: a
/// topic that changed id (not its first id), went missing, or a position reset for another
/// reason than having no commit to start from.
fn is_identity_hint(fac: &str, message: &str) -> bool {
    const ZERO_ID: &str = "AAAAAAAAAAAAAAAAAAAAAA";
    (message.contains("changed id from") && !message.contains(&format!("from {ZERO_ID}")))
        || message.contains("nknown topic")
        || message.contains("UNKNOWN_TOPIC")
        || message.contains("does not exist")
        || (fac == "OFFSET"
            && message.contains("offset reset")
            && !message.contains("No offset stored"))
}

/// A partition's end: the statistics' last stable offset, or the one queried for a paused
/// partition when that is further; negative while unknown.
fn end_offset(ls_offset: i64, queried_end: Option<i64>) -> i64 {
    ls_offset.max(queried_end.unwrap_or(-1))
}

/// A partition's lag: its end minus its committed offset or, before the group's first commit,
/// minus where the consumer started (`start`); None while either is unknown.
fn lag(end: i64, committed: i64, start: i64) -> Option<i64> {
    let from = if committed >= 0 { committed } else { start };
    (end >= 0 && from >= 0).then(|| (end - from).max(0))
}

pub(crate) fn partitions_of(tpl: &TopicPartitionList) -> Vec<TopicPartition> {
    tpl.elements()
        .iter()
        .map(|e| TopicPartition {
            topic: e.topic().to_owned(),
            partition: e.partition(),
        })
        .collect()
}

/// How long an assignment waits for its topics' ids. A cluster that does not answer (seen:
/// librdkafka's mock cluster) is not asked again at later assignments: their records' keys
/// name the topic alone.
const TOPIC_IDS_TIMEOUT: Duration = Duration::from_secs(3);

impl ConnectorContext {
    /// The ids of the topics of `tpl` (none where the cluster has no ids or they could not
    /// be read: the records' idempotency keys then name the topic alone).
    fn topic_ids(
        &self,
        consumer: &BaseConsumer<Self>,
        tpl: &TopicPartitionList,
    ) -> HashMap<String, Option<Arc<str>>> {
        if self.ids_unanswered.load(Ordering::SeqCst) {
            return HashMap::new();
        }
        let mut topics: Vec<String> = tpl
            .elements()
            .iter()
            .map(|e| e.topic().to_owned())
            .collect();
        topics.sort();
        topics.dedup();
        match super::native::topic_ids(consumer.client(), &topics, TOPIC_IDS_TIMEOUT) {
            Ok(ids) => ids
                .into_iter()
                .map(|(t, id)| (t, id.map(Arc::from)))
                .collect(),
            Err(e) => {
                if matches!(
                    e,
                    KafkaError::AdminOp(rdkafka::types::RDKafkaErrorCode::OperationTimedOut)
                ) {
                    self.ids_unanswered.store(true, Ordering::SeqCst);
                }
                tracing::warn!(connection = %self.client.connection(), error = %e, "cannot read the assigned topics' ids; a topic deleted and created again is noticed only when its position moves back");
                HashMap::new()
            }
        }
    }
}

impl ClientContext for ConnectorContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        _oauthbearer_config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        self.client.oauth_token()
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.note_identity_hint(fac, log_message);
        self.client.log(level, fac, log_message);
    }

    /// librdkafka's statistics: broker reachability for readiness, consumer lag per assigned
    /// partition (the last stable offset, as reads are read_committed, minus the committed
    /// offset, or minus where the consumer started before the first commit).
    fn stats(&self, stats: rdkafka::Statistics) {
        let up = stats
            .brokers
            .values()
            .any(|b| b.nodeid >= 0 && b.state == "UP");
        self.brokers_up.store(up, Ordering::SeqCst);
        self.stats_seen.store(true, Ordering::SeqCst);
        if up {
            self.client.clear_failure();
        }
        let paused_ends = self.paused_ends.lock().unwrap_or_else(|p| p.into_inner());
        let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        for (topic, t) in &stats.topics {
            // Statistics also list partitions of the topics that are not (or no longer)
            // assigned here.
            let Some(assigned) = assigned.get_mut(topic.as_str()) else {
                continue;
            };
            for (partition, p) in &t.partitions {
                let Some(started_at_end) = assigned.get_mut(partition) else {
                    continue;
                };
                // Usually nothing is paused: no key is built then.
                let queried = if paused_ends.is_empty() {
                    None
                } else {
                    paused_ends.get(&(topic.clone(), *partition)).copied()
                };
                let end = end_offset(p.ls_offset, queried);
                let start = if self.start_at_end {
                    if started_at_end.is_none() && end >= 0 {
                        *started_at_end = Some(end);
                    }
                    started_at_end.unwrap_or(-1)
                } else {
                    // Read from the beginning: the log start offset, from fetch responses.
                    p.lo_offset
                };
                if let Some(lag) = lag(end, p.committed_offset, start) {
                    crate::telemetry::metrics::consumer_lag(
                        self.client.connection(),
                        topic,
                        *partition,
                        lag,
                    );
                }
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.note_identity_hint("", reason);
        self.note_error(&error, reason);
        tracing::warn!(target: "librdkafka", connection = %self.client.connection(), error = %error, "kafka client error: {reason}");
    }
}

impl ConsumerContext for ConnectorContext {
    /// Logs, errors and commit results arrive on the main queue; serve it every 50 ms rather
    /// than librdkafka's default of once a second, so they are seen promptly.
    fn main_queue_min_poll_interval(&self) -> rdkafka::util::Timeout {
        rdkafka::util::Timeout::After(Duration::from_millis(50))
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        self.rebalances.fetch_add(1, Ordering::SeqCst);
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        self.forget_lag(tpl);
        if self.is_closing() || tpl.count() == 0 {
            return;
        }
        let lost = consumer.assignment_lost();
        let (ack, done) = sync_channel(1);
        let event = ConsumerEvent::Revoked {
            partitions: partitions_of(tpl),
            lost,
            ack,
        };
        if self.events.blocking_send(event).is_ok() {
            let _ = done.recv_timeout(self.revoke_wait);
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) if !self.is_closing() && tpl.count() > 0 => {
                self.track_lag(tpl);
                // Read the commit metadata before any message of these partitions is returned
                // (messages are returned by poll, on this thread, after this callback).
                let committed = consumer.committed_offsets((*tpl).clone(), COMMITTED_TIMEOUT);
                if let Err(e) = &committed {
                    tracing::warn!(connection = %self.client.connection(), error = %e, "cannot read committed offsets; runs accepted above a gap may be offered again");
                }
                let ids = self.topic_ids(consumer, tpl);
                let partitions = partitions_of(tpl)
                    .into_iter()
                    .map(|tp| {
                        let elem = committed
                            .as_ref()
                            .ok()
                            .and_then(|c| Some((c, c.find_partition(&tp.topic, tp.partition)?)));
                        let (committed, metadata) = match elem {
                            Some((list, e)) => match e.offset() {
                                // Metadata is whatever a client of the group wrote: text
                                // that is not UTF-8 is foreign to us, and ignored.
                                rdkafka::Offset::Offset(o) => (
                                    Some(o),
                                    String::from_utf8(super::native::metadata_bytes(
                                        list,
                                        &tp.topic,
                                        tp.partition,
                                    ))
                                    .unwrap_or_default(),
                                ),
                                _ => (None, String::new()),
                            },
                            None => (None, String::new()),
                        };
                        AssignedPartition {
                            topic_id: ids.get(&tp.topic).cloned().flatten(),
                            tp,
                            committed,
                            metadata,
                        }
                    })
                    .collect();
                let _ = self
                    .events
                    .blocking_send(ConsumerEvent::Assigned(partitions));
            }
            Rebalance::Error(e) => {
                tracing::warn!(connection = %self.client.connection(), error = %e, "rebalance failed");
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{end_offset, lag};

    #[test]
    fn librdkafka_lines_that_may_mean_a_topic_was_created_again_are_hints() {
        use super::is_identity_hint;
        for (fac, line) in [
            ("METADATA", "Topic t changed id from Yvd90AUCS9WMdDuObAm7bQ to 6wRncditQ1qoX1Y7jQNsaA"),
            ("BROKERUA", "t [0]: broker unavailable: fetch: Broker: Unknown topic or partition"),
            ("TOPICPROP", "Topic t does not exist, allowing 22064ms for metadata propagation"),
            ("OFFSET", "t [0]: offset reset (at offset 1000 (leader epoch 0), broker 1) to offset BEGINNING (leader epoch -1): fetch failed due to requested offset not available on the broker"),
        ] {
            assert!(is_identity_hint(fac, line), "{line}");
        }
        for (fac, line) in [
            ("METADATA", "Topic t changed id from AAAAAAAAAAAAAAAAAAAAAA to Yvd90AUCS9WMdDuObAm7bQ"),
            ("OFFSET", "t [0]: offset reset (at offset INVALID (leader epoch -1), broker -1) to offset BEGINNING (leader epoch -1): no previously committed offset available: Local: No offset stored"),
            ("METADATA", "Topic t [0] Leader 1 Epoch 0"),
        ] {
            assert!(!is_identity_hint(fac, line), "{line}");
        }
    }

    #[test]
    fn the_end_is_the_further_of_statistics_and_query() {
        assert_eq!(end_offset(100, None), 100);
        // Paused: the statistics' end is stale, the queried one is further.
        assert_eq!(end_offset(50, Some(500)), 500);
        // Resumed: fetches moved past what was queried.
        assert_eq!(end_offset(700, Some(500)), 700);
        assert_eq!(end_offset(-1, None), -1);
        assert_eq!(end_offset(-1001, Some(20)), 20);
    }

    #[test]
    fn lag_counts_from_the_commit_or_else_from_the_start() {
        assert_eq!(lag(100, 40, 0), Some(60));
        assert_eq!(lag(100, 120, 0), Some(0));
        // Nothing committed yet (a group stuck on its first record): from where it started.
        assert_eq!(lag(100, -1001, 0), Some(100));
        assert_eq!(lag(100, -1001, 30), Some(70));
        // Unknown end or unknown start: no value yet.
        assert_eq!(lag(-1, 10, 0), None);
        assert_eq!(lag(100, -1001, -1001), None);
    }
}
