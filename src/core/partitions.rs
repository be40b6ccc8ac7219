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
use std::time::Instant;

use crate::config::Ordering;
use crate::core::batch::BatchLimits;
use crate::core::offsets::{OffsetTracker, Received};
use crate::core::scheduler::PartitionQueue;
use crate::core::shell::{AssignmentId, Record, RunSignal, Shell};
use crate::core::AssignedPartition;
use crate::dispatch::event::TopicPartition;

pub use super::starts::{msg_bytes, raw_bytes};
use super::starts::{start_batch, start_ready};

/// An owned partition's slot. With the assignment's generation it names one assignment: a
/// completion from an earlier assignment of the same slot is recognised and ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PartitionId(u32);

/// What the partition set needs to know of a trigger; `runtime` is whatever the shell hands
/// to its runs (the trigger's clients, configuration and permits).
#[derive(Debug)]
pub struct TriggerSlot<S: Shell> {
    /// A small number identifying the trigger within the connection (its starved set).
    pub index: usize,
    /// How its messages may run in parallel.
    pub ordering: Ordering,
    /// Handed to each run started; its permits bound its concurrency.
    pub runtime: S::Trigger,
    /// A batch trigger's bounds: its partitions start one batch at a time, in offset order.
    pub batch: Option<BatchLimits>,
}

impl<S: Shell> Clone for TriggerSlot<S> {
    fn clone(&self) -> Self {
        Self {
            index: self.index,
            ordering: self.ordering,
            runtime: self.runtime.clone(),
            batch: self.batch,
        }
    }
}

/// Buffering limits of a connection.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// A partition with this many waiting messages pauses; it resumes at half.
    pub per_partition: usize,
    /// Waiting messages of all partitions together, in bytes: above it every partition with
    /// waiting messages pauses; they resume below half.
    pub max_bytes: usize,
    /// Offsets handled above a gap at which a partition pauses
    /// ([`MAX_TRACKED_ABOVE`](crate::core::offsets::MAX_TRACKED_ABOVE)).
    pub max_tracked_above: usize,
}

/// One owned partition.
#[derive(Debug)]
pub struct Partition<S: Shell> {
    /// Which partition.
    pub tp: TopicPartition,
    /// Its trigger.
    pub trigger: TriggerSlot<S>,
    /// Which assignment of the partition this is.
    pub generation: u64,
    /// Waiting messages and keys in flight.
    pub queue: PartitionQueue<S::Record>,
    /// Which offsets are handled, and so what may be committed.
    pub tracker: OffsetTracker,
    /// Positions are trusted only after a message of this assignment arrived or librdkafka
    /// showed it started from the commit (`position_reset`): a position left over from an
    /// earlier assignment of the partition could be ahead of what was handled.
    pub(super) received_any: bool,
    /// librdkafka reported no position, or one at or before `start`, in this assignment.
    pub(super) position_reset: bool,
    /// The group's committed offset when the partition was assigned.
    pub(super) start: Option<i64>,
    /// Paused in the consumer by this set.
    pub paused: bool,
    pub(super) buffered_bytes: usize,
    /// When the commit offset last moved (or the partition last had no backlog); offsets
    /// handled above a held record do not count.
    pub last_progress: Instant,
    /// Why the partition is reported stalled, while it is.
    pub stalled: Option<String>,
    /// Being revoked: nothing new starts.
    pub(super) revoking: bool,
    /// Batch triggers: key and value bytes of the waiting records.
    pub(super) batch_bytes: usize,
    /// Batch triggers: since when the first waiting record waits (set when the partition is
    /// next processed after it arrived, or when the batch before it went out).
    pub(super) batch_since: Option<Instant>,
    /// Batch triggers: a wake-up for `max_wait` is registered.
    pub(super) batch_timer: bool,
    pub(super) dirty: bool,
    pub(super) starved: bool,
    pub(super) commit_changed: bool,
}

impl<S: Shell> Partition<S> {
    /// Messages waiting or in flight.
    pub fn backlog(&self) -> usize {
        self.queue.waiting() + self.queue.in_flight()
    }
}

/// What a message's arrival meant.
#[derive(Debug)]
pub enum Arrival<R> {
    /// Queued to run.
    Queued(PartitionId),
    /// Handled already (by this owner or, per the commit metadata, the previous one).
    AlreadyAccepted(PartitionId),
    /// Waiting or in flight already: delivered twice by the consumer.
    AlreadyReceived(PartitionId),
    /// Its partition is not owned: the message, given back (for the log).
    NotAssigned(R),
}

/// A run to start: the message, the permit it holds, and what its worker needs. What the
/// run is to do when its partition is revoked or lost comes later, as a [`RunSignal`] for
/// its assignment.
#[derive(Debug)]
pub struct Start<S: Shell> {
    /// Its partition.
    pub id: PartitionId,
    /// Its partition's assignment.
    pub generation: u64,
    /// Its key (for ordering, given back on completion).
    pub key: Option<Vec<u8>>,
    /// The message (a batch's first).
    pub msg: S::Record,
    /// A batch trigger's further records of the batch, in offset order (empty otherwise).
    pub batch: Vec<S::Record>,
    /// One of the trigger's concurrency permits.
    pub permit: S::Permit,
    /// The trigger's runtime.
    pub trigger: S::Trigger,
    /// The trigger's index (see [`TriggerSlot::index`]).
    pub trigger_index: usize,
}

impl<S: Shell> Start<S> {
    /// The assignment the run belongs to (what [`RunSignal`]s name).
    pub fn assignment(&self) -> AssignmentId {
        AssignmentId {
            id: self.id,
            generation: self.generation,
        }
    }
}

/// What [`PartitionSet::process`] asks of the consumer and the runtime.
#[derive(Debug)]
pub struct Actions<S: Shell> {
    /// Runs to start.
    pub starts: Vec<Start<S>>,
    /// Partitions to pause.
    pub pause: Vec<TopicPartition>,
    /// Partitions to resume.
    pub resume: Vec<TopicPartition>,
}

impl<S: Shell> Default for Actions<S> {
    fn default() -> Self {
        Self {
            starts: Vec::new(),
            pause: Vec::new(),
            resume: Vec::new(),
        }
    }
}

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
    /// Whether the byte budget was exceeded at the last check.
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
        self.iter().filter(|p| p.paused).count()
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
            tracker: OffsetTracker::from_committed_bounded(
                a.committed,
                &a.metadata,
                self.limits.max_tracked_above,
            ),
            received_any: false,
            position_reset: false,
            start: a.committed,
            paused: false,
            buffered_bytes: 0,
            last_progress: now,
            stalled: None,
            revoking: false,
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

    /// A message arrived from the consumer.
    pub fn on_message(&mut self, msg: S::Record) -> Arrival<S::Record> {
        let Some(id) = self.id_of(msg.topic(), msg.partition()) else {
            return Arrival::NotAssigned(msg);
        };
        let Some(p) = self.slots[id.0 as usize].as_mut() else {
            return Arrival::NotAssigned(msg);
        };
        p.received_any = true;
        match p.tracker.received(msg.offset()) {
            Received::Dispatch => {}
            Received::AlreadyAccepted => {
                // The commit may move past it.
                Self::mark_commit_changed(&mut self.commit_pending, p, id);
                return Arrival::AlreadyAccepted(id);
            }
            Received::AlreadyReceived => return Arrival::AlreadyReceived(id),
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

    /// librdkafka reported the next offset it will return for `tp` (None: no position yet).
    pub fn on_position(&mut self, tp: &TopicPartition, position: Option<i64>) {
        let Some(id) = self.id_of(&tp.topic, tp.partition) else {
            return;
        };
        let Some(p) = self.slots[id.0 as usize].as_mut() else {
            return;
        };
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
        if let (Some(o), true) = (position, p.received_any || p.position_reset) {
            p.tracker.position(o);
            Self::mark_commit_changed(&mut self.commit_pending, p, id);
        }
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
        let p = self.slots.get_mut(id.0 as usize)?.as_mut()?;
        if p.generation != generation {
            return None;
        }
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

    /// New runs wait while `holding` (the broker refuses commits); when the hold ends every
    /// partition may start messages again.
    pub fn set_holding(&mut self, holding: bool) {
        if self.holding && !holding {
            self.mark_all_dirty();
        }
        self.holding = holding;
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
            if p.trigger.batch.is_none() || p.revoking {
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
        // Full at the budget, and again not full only at half of it.
        let full = if self.buffered_bytes >= self.limits.max_bytes {
            true
        } else if self.buffered_bytes <= self.limits.max_bytes / 2 {
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
        let mut dirty = std::mem::take(&mut self.dirty);
        for id in dirty.drain(..) {
            let Some(Some(p)) = self.slots.get_mut(id.0 as usize) else {
                continue;
            };
            p.dirty = false;
            // Memory is short (the partition's buffer or the connection's byte budget is
            // full): a batch trigger sends what waits rather than wait for more.
            let pressed = full || p.queue.waiting() >= per_partition || p.tracker.gap_full();
            if !p.revoking
                && !self.holding
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
            // A full gap pauses only once the record at the gap was received: a new owner
            // can load a full gap from the commit metadata before it fetched anything, and
            // pausing then would keep that record from ever arriving.
            let gap_full = p.tracker.gap_full() && p.tracker.gap_head().is_some();
            if !p.paused && (waiting >= per_partition || (full && waiting > 0) || gap_full) {
                p.paused = true;
                out.pause.push(p.tp.clone());
            } else if p.paused && waiting <= per_partition / 2 && !full && !gap_full {
                p.paused = false;
                out.resume.push(p.tp.clone());
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
