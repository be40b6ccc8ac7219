//! The partitions one connection owns, as a pure state machine: assignments and their
//! generations, each partition's queue of waiting messages and its offset tracker, the byte
//! budget, pause and resume decisions, and which partitions have something to do.
//!
//! No consumer, no runtime, no clock of its own: the supervisor feeds it consumer events and
//! worker completions and applies what [`PartitionSet::process`] returns (runs to start,
//! partitions to pause or resume) and what [`PartitionSet::take_commits`] returns (commit
//! offsets for the [committer](crate::core::committer)).
//!
//! Per event the work is O(1) in the number of partitions: a partition is addressed by a
//! [`PartitionId`] (a slot index, no hashing of topic names), only partitions marked dirty are
//! visited, and commit metadata is encoded when a commit goes out, not per handled message.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::core::offsets::{GapHold, OffsetTracker, Received, TrackerLimits};
use crate::core::scheduler::PartitionQueue;
use crate::core::shell::{AssignmentId, Record, RunSignal, Shell};
use crate::core::types::Ordering;
use crate::core::types::TopicPartition;
use crate::core::AssignedPartition;

pub use super::partition::{
    Actions, Arrival, Limits, Partition, PartitionId, PauseReason, PositionMovedBack, Start,
    TriggerSlot, Unverified,
};
pub use super::starts::{msg_bytes, raw_bytes};
use super::starts::{start_batch, start_ready};

/// The partitions of one connection.
#[derive(Debug)]
pub struct PartitionSet<S: Shell> {
    slots: Vec<Option<Partition<S>>>,
    free: Vec<u32>,
    index: HashMap<String, HashMap<i32, PartitionId>>,
    generation: u64,
    limits: Limits,
    /// Partitions with something to do: start messages, pause or resume.
    dirty: Vec<PartitionId>,
    /// Partitions that had startable messages but no permit, per trigger index.
    starved: Vec<Vec<PartitionId>>,
    /// Partitions whose commit offset may have moved since commits were last taken.
    commit_pending: Vec<PartitionId>,
    buffered_bytes: usize,
    /// Whether the byte budget was pressed (half of it held or more) at the last check.
    global_full: bool,
    /// New runs wait (the broker refuses commits).
    holding: bool,
    /// Batch triggers' partitions waiting for `max_wait`: when, which, which assignment.
    batch_timers: Vec<(Instant, PartitionId, u64)>,
    /// What runs already started are to do (drain, abandon), in the order decided.
    signals: Vec<RunSignal>,
}

impl<S: Shell> PartitionSet<S> {
    /// No partitions yet.
    pub fn new(limits: Limits) -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            index: HashMap::new(),
            generation: 0,
            limits,
            dirty: Vec::new(),
            starved: Vec::new(),
            commit_pending: Vec::new(),
            buffered_bytes: 0,
            global_full: false,
            holding: false,
            batch_timers: Vec::new(),
            signals: Vec::new(),
        }
    }

    /// The owned partition `tp`, if any.
    pub fn id_of(&self, topic: &str, partition: i32) -> Option<PartitionId> {
        self.index.get(topic)?.get(&partition).copied()
    }

    /// The partition in slot `id`.
    pub fn get(&self, id: PartitionId) -> Option<&Partition<S>> {
        self.slots.get(id.0 as usize)?.as_ref()
    }

    fn get_mut(&mut self, id: PartitionId) -> Option<&mut Partition<S>> {
        self.slots.get_mut(id.0 as usize)?.as_mut()
    }

    /// The partition `tp`, if owned.
    pub fn by_tp(&self, tp: &TopicPartition) -> Option<&Partition<S>> {
        self.get(self.id_of(&tp.topic, tp.partition)?)
    }

    /// Every owned partition.
    pub fn iter(&self) -> impl Iterator<Item = &Partition<S>> {
        self.slots.iter().flatten()
    }

    /// Every owned partition, to update its stall report.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Partition<S>> {
        self.slots.iter_mut().flatten()
    }

    /// How many partitions are owned.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether no partition is owned.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many owned partitions are paused.
    pub fn paused_count(&self) -> usize {
        self.iter().filter(|p| p.paused.is_some()).count()
    }

    /// Bytes of waiting messages, all partitions together.
    pub fn buffered_bytes(&self) -> usize {
        self.buffered_bytes
    }

    /// Runs started and not finished, all partitions together.
    pub fn in_flight(&self) -> usize {
        self.iter().map(|p| p.queue.in_flight()).sum()
    }

    /// Runs started and not finished in `tps`.
    pub fn in_flight_of(&self, tps: &[TopicPartition]) -> usize {
        tps.iter()
            .filter_map(|tp| self.by_tp(tp))
            .map(|p| p.queue.in_flight())
            .sum()
    }

    fn mark_dirty(dirty: &mut Vec<PartitionId>, p: &mut Partition<S>, id: PartitionId) {
        if !p.dirty {
            p.dirty = true;
            dirty.push(id);
        }
    }

    fn mark_all_dirty(&mut self) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(p) = slot {
                Self::mark_dirty(&mut self.dirty, p, PartitionId(i as u32));
            }
        }
    }

    /// `a` was assigned to this member, for `trigger`. A new assignment starts unpaused and
    /// with nothing queued; an earlier assignment of the same partition still held here is
    /// replaced and its runs abandoned.
    pub fn assign(&mut self, a: AssignedPartition, trigger: TriggerSlot<S>, now: Instant) {
        if let Some(old) = self.id_of(&a.tp.topic, a.tp.partition) {
            let _ = self.remove_id(old);
        }
        self.generation += 1;
        let (topic, partition) = (a.tp.topic.clone(), a.tp.partition);
        if self.starved.len() <= trigger.index {
            self.starved.resize_with(trigger.index + 1, Vec::new);
        }
        let p = Partition {
            // A batch trigger's partition sends its records in offset order.
            queue: PartitionQueue::new(if trigger.batch.is_some() {
                Ordering::Partition
            } else {
                trigger.ordering
            }),
            trigger,
            generation: self.generation,
            unverified: None,
            tracker: {
                let mut t = OffsetTracker::from_committed_with(
                    a.committed,
                    &a.metadata,
                    TrackerLimits {
                        max_above: self.limits.max_tracked_above,
                        metadata_max_chars: self.limits.metadata_max_chars,
                    },
                );
                t.set_topic_id(a.topic_id.clone());
                t
            },
            topic_id: a.topic_id,
            received_any: false,
            position_reset: false,
            awaiting_seek: false,
            start: a.committed,
            paused: None,
            buffered_bytes: 0,
            last_progress: now,
            stalled: None,
            revoking: false,
            commit_refused: false,
            batch_bytes: 0,
            batch_since: None,
            batch_timer: false,
            dirty: false,
            starved: false,
            commit_changed: false,
            tp: a.tp,
        };
        let id = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(p);
                PartitionId(i)
            }
            None => {
                self.slots.push(Some(p));
                PartitionId((self.slots.len() - 1) as u32)
            }
        };
        let _ = self.index.entry(topic).or_default().insert(partition, id);
    }

    /// Whether `tp`'s group commit, as read when it was assigned, was made under another
    /// topic of the same name than the one it reads now (its metadata names another topic id
    /// than the partition's): the topic was deleted and created again, and a commit decided for
    /// the old one landed on the new one (Kafka keeps a group's offsets by name). Returns the
    /// two ids (the commit's, the partition's).
    pub fn committed_under_other_topic(&self, tp: &TopicPartition) -> Option<(Arc<str>, Arc<str>)> {
        let p = self.by_tp(tp)?;
        let now = p.topic_id.as_ref()?;
        if !p.tracker.committed_under_other_topic(Some(now)) {
            return None;
        }
        Some((Arc::clone(p.tracker.committed_topic_id()?), Arc::clone(now)))
    }

    /// The partition `tp` was assigned with a commit made under another topic of the same
    /// name ([`Self::committed_under_other_topic`]): its offset and map say nothing of this
    /// log, which is read from where `auto.offset.reset` says, as a topic created again while
    /// owned is ([`Self::restart_log`]; the consumer must move it). Returns the two ids
    /// (the commit's, the partition's) if it did.
    pub fn restart_stale_commit(&mut self, tp: &TopicPartition) -> Option<(Arc<str>, Arc<str>)> {
        let ids = self.committed_under_other_topic(tp)?;
        let id = self.id_of(&tp.topic, tp.partition)?;
        self.restart_to_seek(id, Some(Arc::clone(&ids.1)))?;
        Some(ids)
    }

    /// [`Self::restart_log`] for a log the consumer must first move to where
    /// `auto.offset.reset` says: what arrives before the move is dropped.
    fn restart_to_seek(
        &mut self,
        id: PartitionId,
        topic_id: Option<Arc<str>>,
    ) -> Option<PartitionId> {
        let id = self.restart_log(id, topic_id)?;
        self.slots[id.0 as usize].as_mut()?.awaiting_seek = true;
        Some(id)
    }

    /// [`Self::restart_log`] for a partition whose position moved back: the log read now may
    /// be another topic's of the same name (deleted and created again), so nothing of it runs
    /// until its topic's id is read again.
    fn restart_moved_back(&mut self, id: PartitionId) -> Option<PartitionId> {
        let topic_id = self.get(id)?.topic_id.clone();
        let id = self.restart_log(id, topic_id)?;
        self.slots[id.0 as usize].as_mut()?.unverified = Some(Unverified::MovedBack);
        Some(id)
    }

    /// The partition in slot `id` reads a log other than the one its bookkeeping describes
    /// (its topic was deleted and created again: `topic_id` is the new one; or its position
    /// moved back): it starts again as a new assignment with nothing committed, keeping its
    /// trigger and its pause (the consumer still has it paused; the next round decides). Its
    /// waiting records are dropped and its runs abandoned: their outcome says nothing of the
    /// new log. Returns its new slot.
    pub fn restart_log(
        &mut self,
        id: PartitionId,
        topic_id: Option<Arc<str>>,
    ) -> Option<PartitionId> {
        let old = self.get(id)?;
        let (tp, trigger, paused, last_progress) = (
            old.tp.clone(),
            old.trigger.clone(),
            old.paused,
            old.last_progress,
        );
        let a = AssignedPartition {
            tp: tp.clone(),
            committed: None,
            metadata: String::new(),
            topic_id,
        };
        self.assign(a, trigger, last_progress);
        let id = self.id_of(&tp.topic, tp.partition)?;
        let p = self.slots[id.0 as usize].as_mut()?;
        p.paused = paused;
        Self::mark_dirty(&mut self.dirty, p, id);
        Some(id)
    }

    /// The shell read `tp`'s topic id: `topic_id` (None: the cluster has no ids, or it
    /// could not be read). A partition whose position moved back takes it and may start
    /// runs; one whose topic now has another id reads a new log ([`Self::restart_log`]), and
    /// true is returned: the consumer must move to where `auto.offset.reset` says.
    pub fn verify_topic_id(&mut self, tp: &TopicPartition, topic_id: Option<Arc<str>>) -> bool {
        let Some(id) = self.id_of(&tp.topic, tp.partition) else {
            return false;
        };
        let Some(p) = self.slots[id.0 as usize].as_mut() else {
            return false;
        };
        if p.unverified.take().is_some() {
            Self::mark_dirty(&mut self.dirty, p, id);
            Self::mark_commit_changed(&mut self.commit_pending, p, id);
        }
        match (&p.topic_id, &topic_id) {
            // Another topic now (created again, perhaps more than once, since the partition
            // was assigned): what it holds, even from a position that moved back since, may
            // be an older log's. It starts again, read from where auto.offset.reset says.
            (Some(old), Some(new)) if old != new => {
                let _ = self.restart_to_seek(id, topic_id);
                true
            }
            // The same log: its position moved back within it, or the hint was for another
            // topic. With no id to compare (none read at assignment), the new one is taken;
            // but a group commit naming another id was made under an older topic of the
            // same name: the partition starts again from where auto.offset.reset says.
            (None, Some(_)) => {
                p.topic_id = topic_id.clone();
                p.tracker.set_topic_id(topic_id);
                self.restart_stale_commit(tp).is_some()
            }
            _ => false,
        }
    }

    /// librdkafka hinted that a topic may have been deleted or created again: every
    /// partition runs and commits nothing until its topic's id is read again
    /// ([`Self::verify_topic_id`]), so nothing read from a new log runs under the old topic's
    /// keys or moves the group's offsets.
    pub fn suspect_topics(&mut self) {
        for p in self.slots.iter_mut().flatten() {
            if p.unverified.is_none() {
                p.unverified = Some(Unverified::Hint);
            }
        }
    }

    /// Partitions whose log is not identified yet (their position moved back).
    pub fn unverified(&self) -> impl Iterator<Item = &TopicPartition> {
        self.iter()
            .filter(|p| p.unverified.is_some())
            .map(|p| &p.tp)
    }

    /// A message arrived from the consumer.
    pub fn on_message(&mut self, msg: S::Record) -> Arrival<S::Record> {
        let Some(id) = self.id_of(msg.topic(), msg.partition()) else {
            return Arrival::NotAssigned(msg);
        };
        let Some(p) = self.slots[id.0 as usize].as_mut() else {
            return Arrival::NotAssigned(msg);
        };
        if p.awaiting_seek {
            return Arrival::BeforeSeek(id);
        }
        p.received_any = true;
        match p.tracker.received(msg.offset()) {
            Received::Dispatch => {}
            Received::AlreadyAccepted => {
                // The commit may move past it.
                Self::mark_commit_changed(&mut self.commit_pending, p, id);
                return Arrival::AlreadyAccepted(id);
            }
            Received::MovedBack { expected } => {
                let offset = msg.offset();
                // Its records must not run under the old topic's idempotency keys.
                let Some(id) = self.restart_moved_back(id) else {
                    return Arrival::NotAssigned(msg);
                };
                let _ = self.on_message(msg);
                return Arrival::MovedBack {
                    id,
                    expected,
                    offset,
                };
            }
        }
        let bytes = msg_bytes(&msg);
        p.buffered_bytes += bytes;
        self.buffered_bytes += bytes;
        if p.trigger.batch.is_some() {
            p.batch_bytes += raw_bytes(&msg);
        }
        let key = msg.key().map(<[u8]>::to_vec);
        p.queue.push(key, msg);
        Self::mark_dirty(&mut self.dirty, p, id);
        Arrival::Queued(id)
    }

    fn mark_commit_changed(pending: &mut Vec<PartitionId>, p: &mut Partition<S>, id: PartitionId) {
        if !p.commit_changed {
            p.commit_changed = true;
            pending.push(id);
        }
    }

    /// The consumer moved `tp` to where `auto.offset.reset` says, as
    /// [`Self::verify_topic_id`] asked: what arrives from now on is read from there.
    pub fn on_sought(&mut self, tp: &TopicPartition) {
        let Some(id) = self.id_of(&tp.topic, tp.partition) else {
            return;
        };
        if let Some(p) = self.slots[id.0 as usize].as_mut() {
            p.awaiting_seek = false;
        }
    }

    /// librdkafka reported the next offset it will return for `tp` (None: no position yet).
    pub fn on_position(
        &mut self,
        tp: &TopicPartition,
        position: Option<i64>,
    ) -> Option<PositionMovedBack> {
        let id = self.id_of(&tp.topic, tp.partition)?;
        let p = self.slots[id.0 as usize].as_mut()?;
        // Read before the consumer moved to the new log's start.
        if p.awaiting_seek {
            return None;
        }
        // A position is trusted once librdkafka has started this assignment from the group's
        // commit: it reported no position yet, or one at or before the committed offset, or
        // returned a message. Until then it may be left over from an earlier assignment and
        // ahead of what was handled. Trusted positions move the commit past transaction
        // markers and aborted records even when no message of this assignment ever arrives.
        match position {
            None => p.position_reset = true,
            Some(o) if p.start.is_some_and(|s| o <= s) => p.position_reset = true,
            Some(_) => {}
        }
        let (Some(o), true) = (position, p.received_any || p.position_reset) else {
            return None;
        };
        // Behind what this assignment already read, with no message: the consumer went back
        // (an offset reset after an out-of-range fetch, a log cut by an unclean leader
        // election) and what it read since were transaction markers or aborted records, or
        // nothing yet. The bookkeeping starts again from the position, as for a message
        // that arrives behind it (`Received::MovedBack`): the commit may go back to it, and
        // the log is identified first.
        if let Some(expected) = p.tracker.seen().filter(|s| o < *s) {
            return self.restart_at(id, expected, o, false);
        }
        p.tracker.position(o);
        Self::mark_commit_changed(&mut self.commit_pending, p, id);
        None
    }

    /// See [`Core::on_log_end`](super::Core::on_log_end). Nothing for another assignment
    /// of `tp`, one the consumer is being moved for, or an end at or past what it read.
    pub fn on_log_end(
        &mut self,
        tp: &TopicPartition,
        generation: u64,
        end: i64,
    ) -> Option<PositionMovedBack> {
        let id = self.id_of(&tp.topic, tp.partition)?;
        let p = self.slots[id.0 as usize].as_mut()?;
        // (An end below 0 is no offset: nothing to go by.)
        if p.generation != generation || p.awaiting_seek || end < 0 {
            return None;
        }
        let expected = p.tracker.seen().filter(|s| end < *s)?;
        // The log below the end is as it was, but what of it was handled above the commit
        // offset is kept nowhere once the bookkeeping starts again: read again from there.
        let from = p.tracker.commit_offset().map_or(end, |c| c.min(end));
        self.restart_at(id, expected, from, true)
    }

    /// The partition in slot `id`, which expected `expected` next, starts its bookkeeping
    /// again from `from` ([`Self::restart_moved_back`]), with positions trusted from there;
    /// `awaiting_seek`: the consumer is still to be moved there, and what arrives first is
    /// dropped.
    fn restart_at(
        &mut self,
        id: PartitionId,
        expected: i64,
        from: i64,
        awaiting_seek: bool,
    ) -> Option<PositionMovedBack> {
        let id = self.restart_moved_back(id)?;
        let p = self.slots[id.0 as usize].as_mut()?;
        p.position_reset = true;
        p.awaiting_seek = awaiting_seek;
        p.tracker.position(from);
        Self::mark_commit_changed(&mut self.commit_pending, p, id);
        Some(PositionMovedBack {
            id,
            expected,
            offset: from,
        })
    }

    /// A run started by [`Start`] ended: each record's offset and whether it is handled
    /// (accepted, skipped or dead-lettered: its offset may be committed); `key` is the run's
    /// (None for a batch). Returns the trigger index whose permit came free, or None for a
    /// run of an earlier assignment.
    pub fn on_run_finished(
        &mut self,
        id: PartitionId,
        generation: u64,
        key: &Option<Vec<u8>>,
        records: &[(i64, bool)],
    ) -> Option<usize> {
        let current = self
            .slots
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .is_some_and(|p| p.generation == generation);
        if !current {
            // A run of an earlier assignment (revoked, or its log started again) ended: its
            // permit came free, for whichever trigger it held one of. Rare: every trigger's
            // starved partitions may try again.
            for index in 0..self.starved.len() {
                self.wake_starved(index);
            }
            return None;
        }
        let p = self.slots.get_mut(id.0 as usize)?.as_mut()?;
        let mut any = false;
        for &(offset, handled) in records {
            p.queue.finished(key);
            if handled {
                p.tracker.handled(offset);
                any = true;
            }
        }
        if any {
            Self::mark_commit_changed(&mut self.commit_pending, p, id);
        }
        Self::mark_dirty(&mut self.dirty, p, id);
        let trigger = p.trigger.index;
        self.wake_starved(trigger);
        Some(trigger)
    }

    /// Records of a run started by [`Start`] come back without an outcome: the run ended
    /// outside a revoke or stop without handling them (its task panicked outside an
    /// attempt, say). Unless the partition is draining they wait again at the head of their
    /// key, which stays held, and start again; otherwise they are dropped like other waiting
    /// records. Call before [`Self::on_run_finished`] for the run's other records. False for
    /// a run of an earlier assignment.
    pub fn on_run_returned(
        &mut self,
        id: PartitionId,
        generation: u64,
        key: &Option<Vec<u8>>,
        records: Vec<S::Record>,
    ) -> bool {
        let Some(Some(p)) = self.slots.get_mut(id.0 as usize) else {
            return false;
        };
        if p.generation != generation {
            return false;
        }
        // Last first: each goes to the head.
        for msg in records.into_iter().rev() {
            if p.revoking {
                p.queue.finished(key);
                continue;
            }
            let bytes = msg_bytes(&msg);
            p.buffered_bytes += bytes;
            self.buffered_bytes += bytes;
            if p.trigger.batch.is_some() {
                p.batch_bytes += raw_bytes(&msg);
            }
            // A batch holds no key: each record goes back under its own.
            let k = match key {
                Some(_) => key.clone(),
                None => msg.key().map(<[u8]>::to_vec),
            };
            p.queue.requeue(k, msg);
        }
        Self::mark_dirty(&mut self.dirty, p, id);
        true
    }

    /// When a batch trigger's partition next needs processing for `max_wait`.
    pub fn next_batch_due(&self) -> Option<Instant> {
        self.batch_timers.iter().map(|(at, _, _)| *at).min()
    }

    /// A permit of the trigger with `index` came free: its starved partitions may start
    /// messages again.
    pub fn wake_starved(&mut self, index: usize) {
        let Some(starved) = self.starved.get_mut(index) else {
            return;
        };
        for id in std::mem::take(starved) {
            if let Some(Some(p)) = self.slots.get_mut(id.0 as usize) {
                p.starved = false;
                Self::mark_dirty(&mut self.dirty, p, id);
            }
        }
    }

    /// Whether new runs wait because the broker refuses the connection's commits.
    pub fn holding(&self) -> bool {
        self.holding
    }

    /// New runs wait while `holding` (the broker refuses commits); when the hold ends every
    /// partition may start messages again.
    pub fn set_holding(&mut self, holding: bool) {
        if self.holding && !holding {
            self.mark_all_dirty();
        }
        self.holding = holding;
    }

    /// New runs of `tp` wait while `hold` (the broker refuses its own commits).
    pub fn set_partition_hold(&mut self, tp: &TopicPartition, hold: bool) {
        let Some(id) = self.id_of(&tp.topic, tp.partition) else {
            return;
        };
        if let Some(p) = self.slots[id.0 as usize].as_mut() {
            p.commit_refused = hold;
            Self::mark_dirty(&mut self.dirty, p, id);
        }
    }

    /// Batch triggers: before `tps` (None: every partition) are revoked or drained, each of
    /// their partitions with records waiting for a batch and none out starts that batch at
    /// once (one, within the batch bounds), if a permit is free and runs may start. Its worker
    /// makes one attempt (the partition's drain stops retries); what it does not get accepted
    /// is not committed. Records beyond it are then dropped with the other waiting ones.
    pub fn flush_batches(
        &mut self,
        now: Instant,
        tps: Option<&[TopicPartition]>,
        out: &mut Actions<S>,
    ) {
        if self.holding {
            return;
        }
        let ids: Vec<PartitionId> = match tps {
            Some(tps) => tps
                .iter()
                .filter_map(|tp| self.id_of(&tp.topic, tp.partition))
                .collect(),
            None => (0..self.slots.len() as u32).map(PartitionId).collect(),
        };
        for id in ids {
            let Some(Some(p)) = self.slots.get_mut(id.0 as usize) else {
                continue;
            };
            // Nothing starts of a log not identified, nor of a partition whose commits the
            // broker refuses, here as anywhere.
            if p.trigger.batch.is_none() || p.revoking || p.unverified.is_some() || p.commit_refused
            {
                continue;
            }
            // Due now, whatever the bounds say.
            let _ = start_batch(
                p,
                id,
                now,
                true,
                &mut self.buffered_bytes,
                &mut self.batch_timers,
                out,
            );
        }
    }

    /// `tps` are being revoked (or were `lost`): waiting messages are dropped (the next owner
    /// reads them again), retries stop, and with a lost assignment attempts in progress are
    /// abandoned. Nothing of them starts any more.
    pub fn begin_revoke(&mut self, tps: &[TopicPartition], lost: bool) {
        for tp in tps {
            let Some(id) = self.id_of(&tp.topic, tp.partition) else {
                continue;
            };
            let Some(Some(p)) = self.slots.get_mut(id.0 as usize) else {
                continue;
            };
            let a = Self::drain(p, id, &mut self.buffered_bytes, &mut self.signals);
            if lost {
                self.signals.push(RunSignal::Abandon(a));
            }
        }
    }

    /// Stops every partition's retries and drops waiting messages (shutdown).
    pub fn drain_all(&mut self) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(p) = slot {
                let id = PartitionId(i as u32);
                let _ = Self::drain(p, id, &mut self.buffered_bytes, &mut self.signals);
            }
        }
    }

    /// Partition `p` in slot `id` starts nothing more: its waiting messages are dropped (their
    /// bytes leave the connection's budget) and its runs are told to stop retrying.
    fn drain(
        p: &mut Partition<S>,
        id: PartitionId,
        buffered_bytes: &mut usize,
        signals: &mut Vec<RunSignal>,
    ) -> AssignmentId {
        p.revoking = true;
        let _ = p.queue.clear_waiting();
        p.batch_bytes = 0;
        p.batch_since = None;
        *buffered_bytes -= std::mem::take(&mut p.buffered_bytes);
        let a = AssignmentId {
            id,
            generation: p.generation,
        };
        signals.push(RunSignal::Drain(a));
        a
    }

    /// Hands over the run signals decided since the last call, in order.
    pub fn take_signals(&mut self, mut signal: impl FnMut(RunSignal)) {
        self.signals.drain(..).for_each(&mut signal);
    }

    /// The latest commit offset and metadata of `tp`, for the synchronous commit of a revoke
    /// or shutdown.
    pub fn final_commit(&mut self, tp: &TopicPartition) -> Option<(i64, String)> {
        let id = self.id_of(&tp.topic, tp.partition)?;
        let p = self.get_mut(id)?;
        // A log not identified may be a new topic's: its offsets are not committed.
        if p.unverified.is_some() {
            return None;
        }
        let _ = p.tracker.take_new_commit();
        p.tracker.commit()
    }

    /// Forgets `tp` (its revoke is complete); its runs still in progress are abandoned.
    pub fn remove(&mut self, tp: &TopicPartition) -> bool {
        match self.id_of(&tp.topic, tp.partition) {
            Some(id) => self.remove_id(id),
            None => false,
        }
    }

    fn remove_id(&mut self, id: PartitionId) -> bool {
        let Some(p) = self.slots.get_mut(id.0 as usize).and_then(Option::take) else {
            return false;
        };
        self.signals.push(RunSignal::Abandon(AssignmentId {
            id,
            generation: p.generation,
        }));
        self.buffered_bytes -= p.buffered_bytes;
        if let Some(parts) = self.index.get_mut(&p.tp.topic) {
            let _ = parts.remove(&p.tp.partition);
            if parts.is_empty() {
                let _ = self.index.remove(&p.tp.topic);
            }
        }
        // Rebalances are rare: forgetting the slot in the work lists may cost a scan.
        self.dirty.retain(|x| *x != id);
        self.commit_pending.retain(|x| *x != id);
        self.batch_timers.retain(|(_, x, _)| *x != id);
        for starved in &mut self.starved {
            starved.retain(|x| *x != id);
        }
        self.free.push(id.0);
        true
    }

    /// Whether a commit offset may have moved since [`PartitionSet::take_commits`] last ran.
    pub fn commits_pending(&self) -> bool {
        !self.commit_pending.is_empty()
    }

    /// Calls `commit` with each partition's commit offset and metadata that moved since the
    /// last call (encoding the metadata once per call, not per handled message).
    pub fn take_commits(
        &mut self,
        now: Instant,
        mut commit: impl FnMut(&TopicPartition, i64, String),
    ) {
        for id in std::mem::take(&mut self.commit_pending) {
            let Some(Some(p)) = self.slots.get_mut(id.0 as usize) else {
                continue;
            };
            if p.unverified.is_some() {
                // Committed once its log is identified (verify_topic_id marks it again).
                p.commit_changed = false;
                continue;
            }
            p.commit_changed = false;
            let before = p.tracker.stored_offset();
            if let Some((offset, metadata)) = p.tracker.take_new_commit() {
                // Progress is the commit offset moving. Metadata alone changes while later
                // keys run past a record held at the gap: that record is still stuck.
                if before.is_none_or(|b| offset > b) {
                    p.last_progress = now;
                }
                commit(&p.tp, offset, metadata);
            }
        }
    }

    /// Works through the partitions that changed: starts what ordering, the hold and the
    /// triggers' permits allow, and decides pauses and resumes, into `out`. Only changed
    /// partitions are visited, so thousands of idle partitions cost nothing.
    pub fn process(&mut self, now: Instant, out: &mut Actions<S>) {
        // Batch triggers' partitions whose `max_wait` passed.
        if !self.batch_timers.is_empty() {
            let slots = &mut self.slots;
            let dirty = &mut self.dirty;
            self.batch_timers.retain(|&(at, id, generation)| {
                if at > now {
                    return true;
                }
                if let Some(Some(p)) = slots.get_mut(id.0 as usize) {
                    if p.generation == generation {
                        p.batch_timer = false;
                        Self::mark_dirty(dirty, p, id);
                    }
                }
                false
            });
        }
        // The budget is pressed from half of it on, and again not pressed only at a quarter.
        // While pressed, a partition holding more than half of its fair share (the budget
        // divided by the partitions owned) pauses and the others keep flowing: a partition
        // whose records wait behind a parked key never holds the budget against the rest.
        // Those flowing stay below half their share, half the budget together, and those
        // paused hold what they had when it became pressed (about half), so the connection
        // holds at most the budget (plus what reaches it before a pause takes effect).
        let full = if self.buffered_bytes >= self.limits.max_bytes / 2 {
            true
        } else if self.buffered_bytes <= self.limits.max_bytes / 4 {
            false
        } else {
            self.global_full
        };
        if full != self.global_full {
            // The budget changed state: every partition may need pausing or resuming.
            self.global_full = full;
            self.mark_all_dirty();
        }
        let per_partition = self.limits.per_partition;
        let share = self.limits.max_bytes / self.len().max(1);
        let mut dirty = std::mem::take(&mut self.dirty);
        for id in dirty.drain(..) {
            let Some(Some(p)) = self.slots.get_mut(id.0 as usize) else {
                continue;
            };
            p.dirty = false;
            // Memory is short (the partition's buffer or the connection's byte budget is
            // full), or the gap is (a batch would be the record at the gap alone whatever
            // else came): a batch trigger sends what waits rather than wait for more.
            let pressed = full
                || p.queue.waiting() >= per_partition
                || p.tracker.gap_hold(p.queue.in_flight()).is_some();
            if !p.revoking
                && !self.holding
                && p.unverified.is_none()
                && !p.commit_refused
                && start_ready(
                    p,
                    id,
                    now,
                    pressed,
                    &mut self.buffered_bytes,
                    &mut self.batch_timers,
                    out,
                )
                && !p.starved
            {
                p.starved = true;
                self.starved[p.trigger.index].push(id);
            }
            if p.revoking {
                continue;
            }
            let waiting = p.queue.waiting();
            // A full gap (or a commit map at its budget) pauses only once the record at the
            // gap was received: a new owner can load a full gap from the commit metadata
            // before it fetched anything, and pausing then would keep that record from ever
            // arriving.
            let gap_hold = match p.tracker.gap_head() {
                Some(_) => p.tracker.gap_hold(p.queue.in_flight()),
                None => None,
            };
            let holds_budget = full && waiting > 0 && p.buffered_bytes > share / 2;
            let reason = if gap_hold == Some(GapHold::Tracked) {
                Some(PauseReason::Gap)
            } else if gap_hold == Some(GapHold::Metadata) {
                Some(PauseReason::Metadata)
            } else if waiting >= per_partition {
                Some(PauseReason::Buffer)
            } else if holds_budget {
                Some(PauseReason::Budget)
            } else {
                None
            };
            match (p.paused, reason) {
                (None, Some(r)) => {
                    p.paused = Some(r);
                    out.pause.push(p.tp.clone());
                }
                (Some(_), Some(r)) => p.paused = Some(r),
                (Some(_), None) => {
                    // Resumed only once well below what paused it, so it does not flap.
                    let budget_ok = !full || p.buffered_bytes <= share / 4;
                    if waiting <= per_partition / 2 && budget_ok {
                        p.paused = None;
                        out.resume.push(p.tp.clone());
                    }
                }
                (None, None) => {}
            }
        }
        // Keep the vector's capacity for the next round.
        if self.dirty.is_empty() {
            self.dirty = dirty;
        }
    }
}

#[cfg(test)]
#[path = "partitions_tests.rs"]
mod tests;
