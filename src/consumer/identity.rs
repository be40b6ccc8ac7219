//! Which log a partition is read from. A topic deleted and created again under the same name
//! is a new log with a new id (KIP-516), and librdkafka does not tell: it goes on fetching at
//! its position in the new log (records below it are never read) or, when the new log is
//! shorter, resets the position as `auto.offset.reset` says and logs one warning. And a
//! position can move back within one log (an offset reset, a truncation after an unclean
//! leader election).
//!
//! So the topics' ids are read when partitions are assigned (the consumer context), again
//! every [`INTERVAL`], soon after librdkafka hints at a change (an offset reset, an unknown
//! topic), and whenever a partition's position moved back: that partition runs nothing until
//! its log is identified, since its records must not run under the old topic's idempotency
//! keys. A new id restarts the partition's bookkeeping and moves the consumer to where
//! `auto.offset.reset` says.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::Offset;
use tokio::sync::mpsc;

use super::monitor::MovedBack;
use super::port::KafkaPort;
use crate::config::ConnectionConfig;
use crate::core::{Core, StaleCommit};
use crate::dispatch::event::TopicPartition;
use crate::run::spawn::KafkaShell;
use crate::telemetry::metrics;

/// How often the assigned topics' ids are read while nothing hints at a change.
const INTERVAL: Duration = Duration::from_secs(30);

/// How soon they are read again while a partition waits for its log to be identified, or
/// after a hint.
const SOON: Duration = Duration::from_secs(1);

/// How long one read may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Failed reads after which a partition waiting for its log runs under the id it had: a
/// cluster that cannot say must not stop it for good.
const GIVE_UP_AFTER: u32 = 5;

/// The topics' ids, by name, or why they could not be read.
pub(super) type TopicIds = Result<BTreeMap<String, Option<String>>, String>;

/// What a partition's identity check decided, for the supervisor to carry out.
pub(super) struct Seek {
    /// The partition.
    pub tp: TopicPartition,
    /// Where `auto.offset.reset` says a new log is read from.
    pub to: Offset,
}

/// The identity checks of one connection.
pub(super) struct IdentityWatch {
    connection: String,
    /// Where a new log is read from.
    reset: Offset,
    last: Option<Instant>,
    running: bool,
    /// A check is wanted soon (a hint, a move back, a topic missing).
    soon: bool,
    failures: u32,
    tx: mpsc::UnboundedSender<TopicIds>,
    /// The answers of the checks started.
    pub(super) rx: mpsc::UnboundedReceiver<TopicIds>,
    /// Partitions the consumer was moved for: their next move back is that move.
    seeking: HashSet<TopicPartition>,
    /// Partitions whose position moved back, said once each.
    logged: HashSet<TopicPartition>,
}

impl IdentityWatch {
    pub(super) fn new(connection: &str, config: &ConnectionConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            connection: connection.to_owned(),
            reset: reset_offset(config.kafka.get("auto.offset.reset").map(String::as_str)),
            last: None,
            running: false,
            soon: false,
            failures: 0,
            tx,
            rx,
            seeking: HashSet::new(),
            logged: HashSet::new(),
        }
    }

    /// Starts a check of the assigned topics' ids when one is due: every [`INTERVAL`] (the
    /// first one after the assignment's own), and every [`SOON`] while a check is wanted or
    /// a partition waits for its log.
    pub(super) fn tick<P: KafkaPort>(
        &mut self,
        now: Instant,
        consumer: &Arc<P>,
        core: &Core<KafkaShell>,
    ) {
        let partitions = core.partitions();
        if self.running || partitions.is_empty() {
            return;
        }
        let waiting = self.soon || partitions.unverified().next().is_some();
        if let Some(last) = self.last {
            let after = if waiting { SOON } else { INTERVAL };
            if now.saturating_duration_since(last) < after {
                return;
            }
        } else if !waiting {
            // The assignment read the ids: the first periodic check is an interval later.
            self.last = Some(now);
            return;
        }
        let mut topics: Vec<String> = partitions.iter().map(|p| p.tp.topic.clone()).collect();
        topics.sort();
        topics.dedup();
        self.running = true;
        self.soon = false;
        self.last = Some(now);
        let (consumer, tx) = (Arc::clone(consumer), self.tx.clone());
        super::port::start::<P>(move || {
            let ids = consumer
                .topic_ids(&topics, TIMEOUT)
                .map_err(|e| e.to_string());
            let _ = tx.send(ids);
        });
    }

    /// A check is wanted at once (librdkafka hinted at a topic deleted or created again).
    pub(super) fn want_now(&mut self) {
        self.soon = true;
        self.last = None;
    }

    /// A check's answer: each owned partition's topic id goes to the core. Returns the
    /// partitions whose topic was created again, for the consumer to move.
    pub(super) fn on_answer(&mut self, ids: TopicIds, core: &mut Core<KafkaShell>) -> Vec<Seek> {
        self.running = false;
        let connection = self.connection.as_str();
        let ids = match ids {
            Ok(ids) => {
                self.failures = 0;
                ids
            }
            Err(e) => {
                self.failures += 1;
                self.soon = true;
                let waiting: Vec<(TopicPartition, Option<Arc<str>>)> = core
                    .partitions()
                    .iter()
                    .filter(|p| p.unverified.is_some())
                    .map(|p| (p.tp.clone(), p.topic_id.clone()))
                    .collect();
                if self.failures >= GIVE_UP_AFTER && !waiting.is_empty() {
                    tracing::warn!(connection, error = %e, failures = self.failures, "cannot read topic ids; partitions whose position moved back run under the topic id they had");
                    for (tp, id) in waiting {
                        let _ = core.on_topic_id(&tp, id);
                    }
                } else {
                    tracing::debug!(connection, error = %e, "cannot read topic ids; trying again");
                }
                return Vec::new();
            }
        };
        let owned: Vec<TopicPartition> = core.partitions().iter().map(|p| p.tp.clone()).collect();
        let mut seeks = Vec::new();
        for tp in owned {
            let Some(id) = ids.get(&tp.topic) else {
                // Deleted and not created again (yet): asked again soon.
                self.soon = true;
                continue;
            };
            // The id known before (None: not read at the assignment) and the one the group's
            // commit named when assigned, for the log.
            let (before, committed_id) = core.partitions().by_tp(&tp).map_or((None, None), |p| {
                (p.topic_id.clone(), p.tracker.committed_topic_id().cloned())
            });
            if core.on_topic_id(&tp, id.as_deref().map(Arc::from)) {
                metrics::position_reset(connection, &tp.topic, "topic_recreated");
                tracing::warn!(connection, topic = %tp.topic, partition = tp.partition, topic_id = ?id,
                    previous_topic_id = ?before, committed_topic_id = ?committed_id,
                    reset = ?self.reset, "topic deleted and created again (or the group's commit was made under an older topic of the same name): its partition is read anew from where auto.offset.reset says, its new records run under the new topic id");
                let _ = self.seeking.insert(tp.clone());
                seeks.push(Seek { tp, to: self.reset });
            }
        }
        seeks
    }

    /// Partitions assigned with a group commit made under another topic of the same name
    /// (its metadata names another topic id): the core restarted them as new logs; each is
    /// said (a WARN), counted as a topic created again, and moved to where
    /// `auto.offset.reset` says.
    pub(super) fn on_stale_commits(&mut self, stale: Vec<StaleCommit>) -> Vec<Seek> {
        let connection = self.connection.as_str();
        stale
            .into_iter()
            .map(|s| {
                metrics::position_reset(connection, &s.tp.topic, "topic_recreated");
                tracing::warn!(connection, topic = %s.tp.topic, partition = s.tp.partition,
                    committed_topic_id = %s.committed_id, topic_id = %s.topic_id, reset = ?self.reset,
                    "the group's commit was made under an older topic of the same name (deleted and created again): its offset is not this topic's; the partition is read from where auto.offset.reset says");
                let _ = self.seeking.insert(s.tp.clone());
                Seek {
                    tp: s.tp,
                    to: self.reset,
                }
            })
            .collect()
    }

    /// A partition's position moved back: said (an ERROR once per partition, unless the
    /// connector moved it itself), counted, and its log identified soon.
    pub(super) fn on_moved_back(&mut self, m: &MovedBack) {
        let connection = self.connection.as_str();
        let (topic, partition) = (m.tp.topic.as_str(), m.tp.partition);
        self.soon = true;
        if self.seeking.remove(&m.tp) {
            tracing::info!(
                connection,
                topic,
                partition,
                offset = m.offset,
                "reading the topic created again from its start"
            );
            return;
        }
        metrics::position_reset(connection, topic, "moved_back");
        if self.logged.insert(m.tp.clone()) {
            tracing::error!(connection, topic, partition, expected = m.expected, offset = m.offset,
                "the partition's position moved back (an offset reset after an out-of-range fetch, a topic deleted and created again, a truncated log): its records from this offset run again, none is taken as handled without proof");
        } else {
            tracing::warn!(
                connection,
                topic,
                partition,
                expected = m.expected,
                offset = m.offset,
                "the partition's position moved back again; its records from this offset run again"
            );
        }
    }
}

/// Where a new log is read from, as `auto.offset.reset` says (the connector's default is
/// `earliest`; `error` reads it from its start too, since nothing of it was read).
fn reset_offset(auto_offset_reset: Option<&str>) -> Offset {
    match auto_offset_reset.map(str::to_ascii_lowercase).as_deref() {
        Some("latest" | "largest" | "end") => Offset::End,
        _ => Offset::Beginning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_log_is_read_from_where_auto_offset_reset_says() {
        assert_eq!(reset_offset(None), Offset::Beginning);
        assert_eq!(reset_offset(Some("earliest")), Offset::Beginning);
        assert_eq!(reset_offset(Some("smallest")), Offset::Beginning);
        assert_eq!(reset_offset(Some("LATEST")), Offset::End);
        assert_eq!(reset_offset(Some("largest")), Offset::End);
        assert_eq!(reset_offset(Some("error")), Offset::Beginning);
    }
}
