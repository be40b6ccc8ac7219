//! The partitions one connection owns, as a pure state machine: assignments and their
//! generations, each partition's queue of waiting messages and its offset tracker, the byte
//! budget, pause and resume decisions, and which partitions have something to do.
//!
//! No consumer, no runtime, no clock of its own: the supervisor feeds it consumer events and
//! worker completions and applies what [`PartitionSet::process`] returns (runs to start,
//! partitions to pause or resume) and what [`PartitionSet::take_commits`] returns (commit
//! offsets for the [committer](super::committer)).
//!
//! Per event the work is O(1) in the number of partitions: a partition is addressed by a
//! [`PartitionId`] (a slot index, no hashing of topic names), only partitions marked dirty are
//! visited, and commit metadata is encoded when a commit goes out, not per handled message.

use std::collections::HashMap;
use std::sync::Arc;

use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::batch::BatchLimits;
use super::offsets::{OffsetTracker, Received};
use super::scheduler::PartitionQueue;
use super::AssignedPartition;
use crate::config::Ordering;
use crate::dispatch::event::TopicPartition;

/// An owned partition's slot. With the assignment's generation it names one assignment: a
/// completion from an earlier assignment of the same slot is recognised and ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PartitionId(u32);

/// What the partition set needs to know of a trigger; `runtime` is whatever the caller hands
/// to its workers (the trigger's clients and configuration).
#[derive(Clone, Debug)]
pub struct TriggerSlot<T> {
    /// A small number identifying the trigger within the connection (its starved set).
    pub index: usize,
    /// How its messages may run in parallel.
    pub ordering: Ordering,
    /// Its concurrency limit.
    pub permits: Arc<Semaphore>,
    /// Handed to each run started.
    pub runtime: T,
    /// A batch trigger's bounds: its partitions start one batch at a time, in offset order.
    pub batch: Option<BatchLimits>,
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
    /// ([`MAX_TRACKED_ABOVE`](super::offsets::MAX_TRACKED_ABOVE)).
    pub max_tracked_above: usize,
}

/// One owned partition.
#[derive(Debug)]
pub struct Partition<T> {
    /// Which partition.
    pub tp: TopicPartition,
    /// Its trigger.
    pub trigger: TriggerSlot<T>,
    /// Which assignment of the partition this is.
    pub generation: u64,
    /// Waiting messages and keys in flight.
    pub queue: PartitionQueue<OwnedMessage>,
    /// Which offsets are handled, and so what may be committed.
    pub tracker: OffsetTracker,
    /// Positions are trusted only after a message of this assignment arrived or librdkafka
    /// showed it started from the commit (`position_reset`): a position left over from an
    /// earlier assignment of the partition could be ahead of what was handled.
    received_any: bool,
    /// librdkafka reported no position, or one at or before `start`, in this assignment.
    position_reset: bool,
    /// The group's committed offset when the partition was assigned.
    start: Option<i64>,
    /// Paused in the consumer by this set.
    pub paused: bool,
    buffered_bytes: usize,
    /// Stops retries of this partition's messages (revoke, shutdown).
    pub drain: CancellationToken,
    /// Abandons even attempts in progress (lost assignment, drain deadline).
    pub cancel: CancellationToken,
    /// When the commit offset last moved (or the partition last had no backlog); offsets
    /// handled above a held record do not count.
    pub last_progress: Instant,
    /// Why the partition is reported stalled, while it is.
    pub stalled: Option<String>,
    /// Being revoked: nothing new starts.
    revoking: bool,
    /// Batch triggers: key and value bytes of the waiting records.
    batch_bytes: usize,
    /// Batch triggers: since when the first waiting record waits (set when the partition is
    /// next processed after it arrived, or when the batch before it went out).
    batch_since: Option<Instant>,
    /// Batch triggers: a wake-up for `max_wait` is registered.
    batch_timer: bool,
    dirty: bool,
    starved: bool,
    commit_changed: bool,
}

impl<T> Partition<T> {
    /// Messages waiting or in flight.
    pub fn backlog(&self) -> usize {
        self.queue.waiting() + self.queue.in_flight()
    }
}

/// What a message's arrival meant.
#[derive(Debug)]
pub enum Arrival {
    /// Queued to run.
    Queued(PartitionId),
    /// Handled already (by this owner or, per the commit metadata, the previous one).
    AlreadyAccepted(PartitionId),
    /// Waiting or in flight already: delivered twice by the consumer.
    AlreadyReceived(PartitionId),
    /// Its partition is not owned: the message, given back (for the log).
    NotAssigned(OwnedMessage),
}

/// A run to start: the message, the permit it holds, and what its worker needs.
#[derive(Debug)]
pub struct Start<T> {
    /// Its partition.
    pub id: PartitionId,
    /// Its partition's assignment.
    pub generation: u64,
    /// Its key (for ordering, given back on completion).
    pub key: Option<Vec<u8>>,
    /// The message (a batch's first).
    pub msg: OwnedMessage,
    /// A batch trigger's further records of the batch, in offset order (empty otherwise).
    pub batch: Vec<OwnedMessage>,
    /// One of the trigger's concurrency permits.
    pub permit: OwnedSemaphorePermit,
    /// The trigger's runtime.
    pub trigger: T,
    /// The trigger's index (see [`TriggerSlot::index`]).
    pub trigger_index: usize,
    /// See [`Partition::drain`].
    pub drain: CancellationToken,
    /// See [`Partition::cancel`].
    pub cancel: CancellationToken,
}

/// What [`PartitionSet::process`] asks of the consumer and the runtime.
#[derive(Debug)]
pub struct Actions<T> {
    /// Runs to start.
    pub starts: Vec<Start<T>>,
    /// Partitions to pause.
    pub pause: Vec<TopicPartition>,
    /// Partitions to resume.
    pub resume: Vec<TopicPartition>,
}

impl<T> Default for Actions<T> {
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
pub struct PartitionSet<T> {
    slots: Vec<Option<Partition<T>>>,
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
}

impl<T: Clone> PartitionSet<T> {
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
        }
    }

    /// The owned partition `tp`, if any.
    pub fn id_of(&self, topic: &str, partition: i32) -> Option<PartitionId> {
        self.index.get(topic)?.get(&partition).copied()
    }

    /// The partition in slot `id`.
    pub fn get(&self, id: PartitionId) -> Option<&Partition<T>> {
        self.slots.get(id.0 as usize)?.as_ref()
    }

    fn get_mut(&mut self, id: PartitionId) -> Option<&mut Partition<T>> {
        self.slots.get_mut(id.0 as usize)?.as_mut()
    }

    /// The partition `tp`, if owned.
    pub fn by_tp(&self, tp: &TopicPartition) -> Option<&Partition<T>> {
        self.get(self.id_of(&tp.topic, tp.partition)?)
    }

    /// Every owned partition.
    pub fn iter(&self) -> impl Iterator<Item = &Partition<T>> {
        self.slots.iter().flatten()
    }

    /// Every owned partition, to update its stall report.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Partition<T>> {
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

    fn mark_dirty(dirty: &mut Vec<PartitionId>, p: &mut Partition<T>, id: PartitionId) {
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
    pub fn assign(&mut self, a: AssignedPartition, trigger: TriggerSlot<T>, now: Instant) {
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
            drain: CancellationToken::new(),
            cancel: CancellationToken::new(),
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
    pub fn on_message(&mut self, msg: OwnedMessage) -> Arrival {
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

    fn mark_commit_changed(pending: &mut Vec<PartitionId>, p: &mut Partition<T>, id: PartitionId) {
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

    /// A run started by [`Start`] ended; `handled` when it was accepted, skipped or
    /// dead-lettered (its offset may be committed). Returns the trigger index whose permit
    /// came free, or None for a run of an earlier assignment.
    pub fn on_completion(
        &mut self,
        id: PartitionId,
        generation: u64,
        key: &Option<Vec<u8>>,
        offset: i64,
        handled: bool,
    ) -> Option<usize> {
        let p = self.slots.get_mut(id.0 as usize)?.as_mut()?;
        if p.generation != generation {
            return None;
        }
        p.queue.finished(key);
        if handled {
            p.tracker.handled(offset);
            Self::mark_commit_changed(&mut self.commit_pending, p, id);
        }
        Self::mark_dirty(&mut self.dirty, p, id);
        let trigger = p.trigger.index;
        self.wake_starved(trigger);
        Some(trigger)
    }

    /// A batch started by [`Start`] ended: each record's offset and whether it is handled.
    /// Returns the trigger index whose permit came free, or None for a batch of an earlier
    /// assignment.
    pub fn on_batch_completion(
        &mut self,
        id: PartitionId,
        generation: u64,
        records: &[(i64, bool)],
    ) -> Option<usize> {
        let p = self.slots.get_mut(id.0 as usize)?.as_mut()?;
        if p.generation != generation {
            return None;
        }
        let mut any = false;
        for &(offset, handled) in records {
            p.queue.finished(&None);
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
        out: &mut Actions<T>,
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
            let Some(p) = self.get_mut(id) else {
                continue;
            };
            p.revoking = true;
            let _ = p.queue.clear_waiting();
            p.batch_bytes = 0;
            p.batch_since = None;
            let freed = std::mem::take(&mut p.buffered_bytes);
            p.drain.cancel();
            if lost {
                p.cancel.cancel();
            }
            self.buffered_bytes -= freed;
        }
    }

    /// Stops every partition's retries and drops waiting messages (shutdown).
    pub fn drain_all(&mut self) {
        for p in self.slots.iter_mut().flatten() {
            p.revoking = true;
            let _ = p.queue.clear_waiting();
            p.batch_bytes = 0;
            p.batch_since = None;
            self.buffered_bytes -= std::mem::take(&mut p.buffered_bytes);
            p.drain.cancel();
        }
    }

    /// Abandons every attempt still in progress.
    pub fn cancel_all(&self) {
        for p in self.iter() {
            p.cancel.cancel();
        }
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
        p.cancel.cancel();
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
    pub fn process(&mut self, now: Instant, out: &mut Actions<T>) {
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

/// Starts the messages of `p` that ordering and the trigger's permits allow. Returns true
/// when a message could have started but no permit was free.
fn start_ready<T: Clone>(
    p: &mut Partition<T>,
    id: PartitionId,
    now: Instant,
    pressed: bool,
    buffered_bytes: &mut usize,
    batch_timers: &mut Vec<(Instant, PartitionId, u64)>,
    out: &mut Actions<T>,
) -> bool {
    if p.trigger.batch.is_some() {
        return start_batch(p, id, now, pressed, buffered_bytes, batch_timers, out);
    }
    loop {
        if p.queue.waiting() == 0 {
            return false;
        }
        // With the gap full only the record at the gap may start: it is what closes it.
        let gap_head = if p.tracker.gap_full() {
            match p.tracker.gap_head() {
                Some(head) => Some(head),
                None => return false,
            }
        } else {
            None
        };
        let Ok(permit) = Arc::clone(&p.trigger.permits).try_acquire_owned() else {
            return true;
        };
        let popped = match gap_head {
            None => p.queue.pop_startable(),
            Some(head) => p.queue.pop_startable_if(|m| m.offset() == head),
        };
        let Some((key, msg)) = popped else {
            return false;
        };
        let bytes = msg_bytes(&msg);
        p.buffered_bytes -= bytes;
        *buffered_bytes -= bytes;
        out.starts.push(Start {
            id,
            generation: p.generation,
            key,
            msg,
            batch: Vec::new(),
            permit,
            trigger: p.trigger.runtime.clone(),
            trigger_index: p.trigger.index,
            drain: p.drain.clone(),
            cancel: p.cancel.clone(),
        });
    }
}

/// A batch trigger's partition: starts its next batch when none is in flight and one is due
/// (see [`BatchLimits::due`]; `now_due`: whatever its bounds say), or registers a wake-up for
/// `max_wait`. Returns true when a batch was due but no permit was free.
fn start_batch<T: Clone>(
    p: &mut Partition<T>,
    id: PartitionId,
    now: Instant,
    now_due: bool,
    buffered_bytes: &mut usize,
    batch_timers: &mut Vec<(Instant, PartitionId, u64)>,
    out: &mut Actions<T>,
) -> bool {
    let Some(limits) = p.trigger.batch else {
        return false;
    };
    let waiting = p.queue.waiting();
    if waiting == 0 {
        p.batch_since = None;
        return false;
    }
    let since = *p.batch_since.get_or_insert(now);
    // One batch of a partition at a time: its records' keys and the commit stay in order.
    // With nothing in flight the first waiting record is the one at the gap, so a full gap
    // does not hold the batch back: it is what closes the gap.
    if p.queue.in_flight() > 0 {
        return false;
    }
    if !limits.due(waiting, p.batch_bytes, Some(since), now, now_due) {
        if !p.batch_timer {
            p.batch_timer = true;
            batch_timers.push((since + limits.max_wait, id, p.generation));
        }
        return false;
    }
    let Ok(permit) = Arc::clone(&p.trigger.permits).try_acquire_owned() else {
        return true;
    };
    let n = limits.take(p.queue.iter_fifo().map(raw_bytes));
    let mut records = Vec::with_capacity(n);
    for _ in 0..n {
        let Some((_, msg)) = p.queue.pop_fifo() else {
            break;
        };
        let bytes = msg_bytes(&msg);
        p.buffered_bytes -= bytes;
        *buffered_bytes -= bytes;
        p.batch_bytes -= raw_bytes(&msg);
        records.push(msg);
    }
    // Records still waiting wait from now (no batch of the partition could go out before).
    p.batch_since = (p.queue.waiting() > 0).then_some(now);
    let mut records = records.into_iter();
    let Some(msg) = records.next() else {
        return false;
    };
    out.starts.push(Start {
        id,
        generation: p.generation,
        key: None,
        msg,
        batch: records.collect(),
        permit,
        trigger: p.trigger.runtime.clone(),
        trigger_index: p.trigger.index,
        drain: p.drain.clone(),
        cancel: p.cancel.clone(),
    });
    false
}

/// A record's key and value bytes (what `batch.max_bytes` bounds).
pub fn raw_bytes(m: &OwnedMessage) -> usize {
    m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len)
}

/// What a waiting message costs in memory besides its key and payload: the owned copy, its
/// topic name, the queue entry and the allocator's share. Measured (session 6): with 64
/// partitions paused by the byte budget, RSS grew by about 500 bytes per buffered message of
/// 100 bytes; 64 made the 64 MiB budget let RSS reach 255 MiB.
const MESSAGE_OVERHEAD: usize = 384;

/// What a waiting message counts against the byte budget.
pub fn msg_bytes(m: &OwnedMessage) -> usize {
    m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len) + MESSAGE_OVERHEAD
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Timestamp;

    fn tp(p: i32) -> TopicPartition {
        TopicPartition {
            topic: "t".into(),
            partition: p,
        }
    }

    fn msg(p: i32, offset: i64, key: &str) -> OwnedMessage {
        OwnedMessage::new(
            Some(vec![0; 36]),
            Some(key.as_bytes().to_vec()),
            "t".into(),
            Timestamp::NotAvailable,
            p,
            offset,
            None,
        )
    }

    fn trigger(permits: usize, ordering: Ordering) -> TriggerSlot<&'static str> {
        TriggerSlot {
            index: 0,
            ordering,
            permits: Arc::new(Semaphore::new(permits)),
            runtime: "trigger",
            batch: None,
        }
    }

    fn assigned(p: i32, committed: Option<i64>, metadata: &str) -> AssignedPartition {
        AssignedPartition {
            tp: tp(p),
            committed,
            metadata: metadata.into(),
        }
    }

    fn set(per_partition: usize, max_bytes: usize) -> PartitionSet<&'static str> {
        PartitionSet::new(Limits {
            per_partition,
            max_bytes,
            max_tracked_above: super::super::offsets::MAX_TRACKED_ABOVE,
        })
    }

    fn commits(s: &mut PartitionSet<&'static str>) -> Vec<(i32, i64, String)> {
        let mut out = Vec::new();
        s.take_commits(Instant::now(), |tp, o, m| out.push((tp.partition, o, m)));
        out
    }

    fn process(s: &mut PartitionSet<&'static str>) -> Actions<&'static str> {
        let mut out = Actions::default();
        s.process(Instant::now(), &mut out);
        out
    }

    fn finish(s: &mut PartitionSet<&'static str>, start: Start<&'static str>, handled: bool) {
        let offset = start.msg.offset();
        drop(start.permit);
        let _ = s.on_completion(start.id, start.generation, &start.key, offset, handled);
    }

    #[test]
    fn an_offset_is_committed_only_once_its_run_and_every_earlier_one_is_handled() {
        let mut s = set(100, 1 << 20);
        s.assign(
            assigned(0, Some(0), ""),
            trigger(8, Ordering::Key),
            Instant::now(),
        );
        for o in 0..3 {
            assert!(matches!(
                s.on_message(msg(0, o, &format!("k{o}"))),
                Arrival::Queued(_)
            ));
        }
        let mut starts = process(&mut s).starts;
        assert_eq!(starts.len(), 3);
        assert!(
            commits(&mut s).is_empty(),
            "nothing handled, nothing to commit"
        );
        let third = starts.pop().unwrap();
        let second = starts.pop().unwrap();
        let first = starts.pop().unwrap();
        finish(&mut s, third, true);
        // Offset 2 is handled above the gap at 0: the commit stays at 0 and names 2.
        assert_eq!(commits(&mut s), vec![(0, 0, "tk1:0:2".to_owned())]);
        finish(&mut s, second, false);
        assert!(commits(&mut s).is_empty(), "an abandoned run moves nothing");
        finish(&mut s, first, true);
        assert_eq!(commits(&mut s), vec![(0, 1, "tk1:1:1".to_owned())]);
        assert!(!s.commits_pending());
    }

    #[test]
    fn metadata_is_encoded_once_per_take_however_many_runs_were_handled() {
        let mut s = set(10_000, 1 << 30);
        s.assign(
            assigned(0, Some(0), ""),
            trigger(10_000, Ordering::Unordered),
            Instant::now(),
        );
        for o in 0..1000 {
            let _ = s.on_message(msg(0, o, "k"));
        }
        let starts = process(&mut s).starts;
        for st in starts.into_iter().skip(1) {
            finish(&mut s, st, true);
        }
        // 999 handled above the gap at 0, one take: one commit.
        let c = commits(&mut s);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].1, 0);
    }

    #[test]
    fn a_revoked_partition_drops_its_waiting_messages_and_a_new_assignment_starts_afresh() {
        let mut s = set(2, 1 << 20);
        s.assign(
            assigned(0, Some(0), ""),
            trigger(1, Ordering::Key),
            Instant::now(),
        );
        for o in 0..4 {
            let _ = s.on_message(msg(0, o, "same"));
        }
        let out = process(&mut s);
        assert_eq!(out.starts.len(), 1);
        assert_eq!(out.pause, vec![tp(0)], "3 waiting ≥ 2: paused");
        assert!(s.buffered_bytes() > 0);
        let in_flight = out.starts.into_iter().next().unwrap();
        s.begin_revoke(&[tp(0)], false);
        assert_eq!(s.buffered_bytes(), 0);
        assert!(in_flight.drain.is_cancelled());
        assert!(
            !in_flight.cancel.is_cancelled(),
            "a revoke lets the attempt finish"
        );
        assert_eq!(s.in_flight_of(&[tp(0)]), 1);
        assert!(process(&mut s).starts.is_empty());
        finish(&mut s, in_flight.clone_for_test(), true);
        assert_eq!(s.in_flight_of(&[tp(0)]), 0);
        assert_eq!(s.final_commit(&tp(0)), Some((1, String::new())));
        assert!(s.remove(&tp(0)));
        assert!(in_flight.cancel.is_cancelled());
        // Assigned back: unpaused, nothing queued, a new generation.
        s.assign(
            assigned(0, Some(1), ""),
            trigger(1, Ordering::Key),
            Instant::now(),
        );
        let p = s.by_tp(&tp(0)).unwrap();
        assert!(!p.paused);
        assert_ne!(p.generation, in_flight.generation);
        assert_eq!(p.backlog(), 0);
        // A completion of the earlier assignment changes nothing.
        assert_eq!(
            s.on_completion(in_flight.id, in_flight.generation, &in_flight.key, 1, true),
            None
        );
        assert!(!s.commits_pending());
        assert!(matches!(
            s.on_message(msg(0, 1, "same")),
            Arrival::Queued(_)
        ));
        assert_eq!(process(&mut s).starts.len(), 1);
    }

    #[test]
    fn a_lost_partition_abandons_its_attempts_at_once() {
        let mut s = set(10, 1 << 20);
        s.assign(
            assigned(0, None, ""),
            trigger(4, Ordering::Key),
            Instant::now(),
        );
        let _ = s.on_message(msg(0, 5, "a"));
        let st = process(&mut s).starts.pop().unwrap();
        s.begin_revoke(&[tp(0)], true);
        assert!(st.cancel.is_cancelled());
    }

    #[test]
    fn a_full_partition_pauses_and_resumes_at_half() {
        let mut s = set(4, 1 << 20);
        s.assign(
            assigned(0, Some(0), ""),
            trigger(1, Ordering::Partition),
            Instant::now(),
        );
        for o in 0..6 {
            let _ = s.on_message(msg(0, o, "k"));
        }
        let out = process(&mut s);
        assert_eq!(out.pause, vec![tp(0)]);
        assert!(s.by_tp(&tp(0)).unwrap().paused);
        let mut run = out.starts.into_iter().next().unwrap();
        // 5 waiting, then 4, 3, 2: resumed when 2 (half of 4) are left.
        for left in [4, 3, 2] {
            finish(&mut s, run, true);
            let out = process(&mut s);
            assert_eq!(s.by_tp(&tp(0)).unwrap().queue.waiting(), left);
            assert_eq!(out.resume.is_empty(), left > 2, "waiting {left}");
            run = out.starts.into_iter().next().unwrap();
        }
        assert_eq!(s.paused_count(), 0);
    }

    #[test]
    fn the_byte_budget_pauses_every_partition_with_waiting_messages() {
        // Room for 3 messages.
        let each = msg_bytes(&msg(0, 0, "a"));
        let mut s = set(100, 3 * each);
        for p in 0..2 {
            s.assign(
                assigned(p, Some(0), ""),
                trigger(0, Ordering::Key),
                Instant::now(),
            );
        }
        let _ = s.on_message(msg(0, 0, "a"));
        let _ = s.on_message(msg(0, 1, "a"));
        assert!(process(&mut s).pause.is_empty());
        let _ = s.on_message(msg(1, 0, "a"));
        let out = process(&mut s);
        let mut paused = out.pause.clone();
        paused.sort_by_key(|t| t.partition);
        assert_eq!(paused, vec![tp(0), tp(1)]);
        // Dropping partition 1's message leaves two, not below half the budget.
        s.begin_revoke(&[tp(1)], false);
        assert!(process(&mut s).resume.is_empty());
        let _ = s.remove(&tp(1));
        s.begin_revoke(&[tp(0)], false);
        let _ = s.remove(&tp(0));
        assert_eq!(s.buffered_bytes(), 0);
    }

    #[test]
    fn a_partition_starved_of_permits_starts_when_another_partition_frees_one() {
        let mut s = set(100, 1 << 20);
        let t = trigger(1, Ordering::Key);
        s.assign(assigned(0, Some(0), ""), t.clone(), Instant::now());
        s.assign(assigned(1, Some(0), ""), t, Instant::now());
        let _ = s.on_message(msg(0, 0, "a"));
        let first = process(&mut s).starts.pop().unwrap();
        let _ = s.on_message(msg(1, 0, "b"));
        assert!(process(&mut s).starts.is_empty(), "no permit");
        finish(&mut s, first, true);
        let starts = process(&mut s).starts;
        assert_eq!(starts.len(), 1);
        assert_eq!(starts[0].msg.partition(), 1);
    }

    #[test]
    fn nothing_starts_while_holding_and_everything_may_start_after() {
        let mut s = set(100, 1 << 20);
        s.assign(
            assigned(0, Some(0), ""),
            trigger(4, Ordering::Key),
            Instant::now(),
        );
        s.set_holding(true);
        let _ = s.on_message(msg(0, 0, "a"));
        assert!(process(&mut s).starts.is_empty());
        s.set_holding(false);
        assert_eq!(process(&mut s).starts.len(), 1);
    }

    #[test]
    fn a_redelivered_or_already_accepted_message_is_not_queued_again() {
        let mut s = set(100, 1 << 20);
        // The previous owner handled 11 above its commit at 10.
        s.assign(
            assigned(0, Some(10), "tk1:10:1"),
            trigger(4, Ordering::Key),
            Instant::now(),
        );
        assert!(matches!(s.on_message(msg(0, 10, "a")), Arrival::Queued(_)));
        assert!(matches!(
            s.on_message(msg(0, 11, "b")),
            Arrival::AlreadyAccepted(_)
        ));
        assert!(matches!(
            s.on_message(msg(0, 10, "a")),
            Arrival::AlreadyReceived(_)
        ));
        assert!(matches!(
            s.on_message(msg(7, 0, "a")),
            Arrival::NotAssigned(_)
        ));
        let st = process(&mut s).starts;
        assert_eq!(st.len(), 1);
        for x in st {
            finish(&mut s, x, true);
        }
        assert_eq!(commits(&mut s), vec![(0, 12, String::new())]);
    }

    #[test]
    fn a_position_left_from_an_earlier_assignment_is_not_trusted() {
        let mut s = set(100, 1 << 20);
        s.assign(
            assigned(0, Some(10), ""),
            trigger(4, Ordering::Key),
            Instant::now(),
        );
        // A position ahead of the commit before any message or reset: ignored.
        s.on_position(&tp(0), Some(50));
        assert!(commits(&mut s).is_empty());
        // No position (fetch restarting from the commit), then one past two aborted records.
        s.on_position(&tp(0), None);
        s.on_position(&tp(0), Some(13));
        assert_eq!(commits(&mut s), vec![(0, 13, String::new())]);
    }

    #[test]
    fn only_the_commit_offset_moving_is_progress() {
        let mut s = set(100, 1 << 20);
        s.assign(
            assigned(0, Some(0), ""),
            trigger(8, Ordering::Key),
            Instant::now(),
        );
        for (o, k) in [(0, "held"), (1, "a"), (2, "b")] {
            let _ = s.on_message(msg(0, o, k));
        }
        let mut starts = process(&mut s).starts.into_iter();
        let held = starts.next().unwrap();
        let assigned_at = s.by_tp(&tp(0)).unwrap().last_progress;
        // Later keys are handled: the commit's metadata changes, its offset stays at 0.
        let later = Instant::now() + std::time::Duration::from_secs(5);
        for st in starts {
            finish(&mut s, st, true);
        }
        let mut taken = Vec::new();
        s.take_commits(later, |_, o, m| taken.push((o, m)));
        assert_eq!(taken, vec![(0, "tk1:0:1-2".to_owned())]);
        assert_eq!(
            s.by_tp(&tp(0)).unwrap().last_progress,
            assigned_at,
            "no progress"
        );
        finish(&mut s, held, true);
        s.take_commits(later, |_, _, _| {});
        assert_eq!(
            s.by_tp(&tp(0)).unwrap().last_progress,
            later,
            "the offset moved"
        );
    }

    #[test]
    fn a_partition_with_a_full_gap_pauses_and_starts_nothing() {
        let mut s = set(1_000_000, 1 << 40);
        let n = super::super::offsets::MAX_TRACKED_ABOVE as i64 + 2;
        s.assign(
            assigned(0, Some(0), ""),
            trigger(1 << 20, Ordering::Unordered),
            Instant::now(),
        );
        for o in 0..n {
            let _ = s.on_message(msg(0, o, "k"));
        }
        let mut out = Actions::default();
        s.process(Instant::now(), &mut out);
        // Offset 0 stays in flight; everything above it is handled.
        let mut starts = out.starts.into_iter();
        let parked = starts.next().unwrap();
        for st in starts {
            finish(&mut s, st, true);
        }
        let _ = s.on_message(msg(0, n, "k"));
        let out = process(&mut s);
        assert!(out.starts.is_empty(), "gap full: nothing new starts");
        assert!(s.by_tp(&tp(0)).unwrap().paused);
        finish(&mut s, parked, true);
        let out = process(&mut s);
        assert_eq!(out.resume, vec![tp(0)]);
        assert_eq!(out.starts.len(), 1);
    }

    /// The handover wedge: a new owner loads a full gap from the previous owner's commit
    /// metadata, so the gap is full before anything started. The record at the gap must
    /// start (and nothing else of a single-record trigger until the gap closes), whatever
    /// the ordering or trigger kind, and the partition then drains.
    #[test]
    fn a_new_owner_of_a_full_gap_starts_the_record_at_the_gap_and_drains() {
        let max = super::super::offsets::MAX_TRACKED_ABOVE as i64;
        let metadata = format!("tk1:0:1-{max}");
        let slots = [
            trigger(8, Ordering::Key),
            trigger(8, Ordering::Partition),
            trigger(8, Ordering::Unordered),
            batch_trigger(8, 3, 1 << 20),
        ];
        for slot in slots {
            let batch = slot.batch.is_some();
            let mut s = set(100, 1 << 20);
            s.assign(assigned(0, Some(0), &metadata), slot, Instant::now());
            // The consumer reads from the committed offset 0: the record at the gap, then
            // records the metadata lists as handled, then new ones.
            for o in 0..3 {
                let _ = s.on_message(msg(0, o, if o == 0 { "parked" } else { "other" }));
            }
            for o in max + 1..max + 4 {
                let _ = s.on_message(msg(0, o, "other"));
            }
            let mut started = Vec::new();
            let mut paused = false;
            let mut resumed = false;
            // Later rounds run past any batch's max_wait.
            let mut now = Instant::now();
            for round in 0..10 {
                let mut out = Actions::default();
                s.process(now, &mut out);
                now += std::time::Duration::from_secs(2);
                paused |= out.pause.contains(&tp(0));
                resumed |= out.resume.contains(&tp(0));
                if round == 0 {
                    assert_eq!(out.starts.len(), 1, "one run starts at the gap");
                    assert_eq!(offsets_of(&out.starts[0])[0], 0);
                    if !batch {
                        assert!(out.starts[0].batch.is_empty());
                    }
                }
                for st in out.starts {
                    let offsets = offsets_of(&st);
                    started.extend(offsets.iter().copied());
                    drop(st.permit);
                    if batch {
                        let done: Vec<(i64, bool)> = offsets.iter().map(|o| (*o, true)).collect();
                        let _ = s.on_batch_completion(st.id, st.generation, &done);
                    } else {
                        let _ = s.on_completion(st.id, st.generation, &st.key, offsets[0], true);
                    }
                }
            }
            started.sort_unstable();
            assert!(
                paused && resumed,
                "paused while the gap was full, then resumed"
            );
            assert_eq!(started, vec![0, max + 1, max + 2, max + 3]);
            assert_eq!(commits(&mut s), vec![(0, max + 4, String::new())]);
        }
    }

    #[test]
    fn a_batch_goes_out_when_its_partition_buffer_or_the_byte_budget_is_full() {
        // Four waiting records fill the partition's buffer: the batch of ten goes out with
        // them rather than wait for records the paused partition will not fetch.
        let mut s = set(4, 1 << 20);
        s.assign(
            assigned(0, Some(0), ""),
            batch_trigger(8, 10, 1 << 20),
            Instant::now(),
        );
        for o in 0..3 {
            let _ = s.on_message(msg(0, o, "k"));
        }
        assert!(process(&mut s).starts.is_empty());
        let _ = s.on_message(msg(0, 3, "k"));
        let out = process(&mut s);
        assert_eq!(offsets_of(&out.starts[0]), vec![0, 1, 2, 3]);
        // The byte budget: each record counts 37 bytes and the overhead.
        let mut s = set(100, 2 * (37 + MESSAGE_OVERHEAD));
        s.assign(
            assigned(0, Some(0), ""),
            batch_trigger(8, 10, 1 << 20),
            Instant::now(),
        );
        let _ = s.on_message(msg(0, 0, "k"));
        assert!(process(&mut s).starts.is_empty());
        let _ = s.on_message(msg(0, 1, "k"));
        assert_eq!(offsets_of(&process(&mut s).starts[0]), vec![0, 1]);
    }

    #[test]
    fn a_waiting_batch_goes_out_at_once_when_its_partition_is_revoked() {
        let mut s = set(100, 1 << 20);
        s.assign(
            assigned(0, Some(0), ""),
            batch_trigger(8, 10, 1 << 20),
            Instant::now(),
        );
        s.assign(
            assigned(1, Some(0), ""),
            batch_trigger(8, 10, 1 << 20),
            Instant::now(),
        );
        for o in 0..3 {
            let _ = s.on_message(msg(0, o, "k"));
            let _ = s.on_message(msg(1, o, "k"));
        }
        // Below every bound: nothing goes out yet.
        assert!(process(&mut s).starts.is_empty());
        let mut out = Actions::default();
        s.flush_batches(Instant::now(), Some(&[tp(0)]), &mut out);
        assert_eq!(out.starts.len(), 1, "only the revoked partition");
        let b = out.starts.pop().unwrap();
        assert_eq!(offsets_of(&b), vec![0, 1, 2]);
        s.begin_revoke(&[tp(0)], false);
        let _ = s.on_batch_completion(b.id, b.generation, &[(0, true), (1, true), (2, true)]);
        assert_eq!(s.final_commit(&tp(0)).unwrap().0, 3);
        // A partition with a batch out flushes nothing more; neither does a holding set.
        let mut s2 = set(100, 1 << 20);
        s2.assign(
            assigned(0, Some(0), ""),
            batch_trigger(8, 2, 1 << 20),
            Instant::now(),
        );
        for o in 0..3 {
            let _ = s2.on_message(msg(0, o, "k"));
        }
        assert_eq!(process(&mut s2).starts.len(), 1);
        let mut out = Actions::default();
        s2.flush_batches(Instant::now(), None, &mut out);
        assert!(out.starts.is_empty());
        s.set_holding(true);
        s.flush_batches(Instant::now(), None, &mut out);
        assert!(out.starts.is_empty());
    }

    fn batch_trigger(
        permits: usize,
        max_records: usize,
        max_bytes: usize,
    ) -> TriggerSlot<&'static str> {
        TriggerSlot {
            batch: Some(BatchLimits {
                max_records,
                max_bytes,
                max_wait: std::time::Duration::from_millis(1000),
            }),
            ..trigger(permits, Ordering::Key)
        }
    }

    fn offsets_of(start: &Start<&'static str>) -> Vec<i64> {
        std::iter::once(&start.msg)
            .chain(&start.batch)
            .map(Message::offset)
            .collect()
    }

    #[test]
    fn a_batch_goes_out_at_max_records_in_offset_order_one_per_partition_at_a_time() {
        let mut s = set(100, 1 << 20);
        s.assign(
            assigned(0, Some(0), ""),
            batch_trigger(8, 3, 1 << 20),
            Instant::now(),
        );
        for o in 0..7 {
            let _ = s.on_message(msg(0, o, if o % 2 == 0 { "a" } else { "b" }));
        }
        let mut out = process(&mut s);
        assert_eq!(out.starts.len(), 1, "one batch of a partition at a time");
        let first = out.starts.pop().unwrap();
        assert_eq!(offsets_of(&first), vec![0, 1, 2]);
        assert!(
            process(&mut s).starts.is_empty(),
            "the next waits for the first"
        );
        // Nothing is committed before the batch is handled.
        assert!(commits(&mut s).is_empty());
        let _ = s.on_batch_completion(
            first.id,
            first.generation,
            &[(0, true), (1, true), (2, true)],
        );
        assert_eq!(commits(&mut s), vec![(0, 3, String::new())]);
        let second = process(&mut s).starts.pop().unwrap();
        assert_eq!(offsets_of(&second), vec![3, 4, 5]);
        // A record not handled (abandoned) holds the commit below it.
        let _ = s.on_batch_completion(
            second.id,
            second.generation,
            &[(3, true), (4, false), (5, true)],
        );
        let c = commits(&mut s);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].1, 4);
        // One record is left: it waits for max_wait.
        let mut out = Actions::default();
        s.process(Instant::now(), &mut out);
        assert!(out.starts.is_empty());
        let due = s.next_batch_due().expect("a wake-up for max_wait");
        s.process(due, &mut out);
        assert_eq!(offsets_of(&out.starts[0]), vec![6]);
        assert!(s.next_batch_due().is_none());
    }

    #[test]
    fn a_batch_respects_max_bytes_and_an_oversized_record_goes_alone() {
        let mut s = set(100, 1 << 20);
        // Each test record has a 36-byte value and a 1-byte key: 37 bytes.
        s.assign(
            assigned(0, Some(0), ""),
            batch_trigger(8, 100, 80),
            Instant::now(),
        );
        for o in 0..5 {
            let _ = s.on_message(msg(0, o, "k"));
        }
        let b = process(&mut s).starts.pop().unwrap();
        assert_eq!(offsets_of(&b), vec![0, 1]);
        let _ = s.on_batch_completion(b.id, b.generation, &[(0, true), (1, true)]);
        let b = process(&mut s).starts.pop().unwrap();
        assert_eq!(offsets_of(&b), vec![2, 3]);
        let mut s = set(100, 1 << 20);
        s.assign(
            assigned(0, Some(0), ""),
            batch_trigger(8, 100, 10),
            Instant::now(),
        );
        let _ = s.on_message(msg(0, 0, "k"));
        let _ = s.on_message(msg(0, 1, "k"));
        assert_eq!(offsets_of(&process(&mut s).starts[0]), vec![0]);
    }

    #[test]
    fn batches_of_different_partitions_run_in_parallel_up_to_the_permits() {
        let mut s = set(100, 1 << 20);
        let t = batch_trigger(2, 2, 1 << 20);
        for p in 0..3 {
            s.assign(assigned(p, Some(0), ""), t.clone(), Instant::now());
            for o in 0..2 {
                let _ = s.on_message(msg(p, o, "k"));
            }
        }
        let out = process(&mut s);
        assert_eq!(out.starts.len(), 2, "two permits");
        let mut parts: Vec<i32> = out.starts.iter().map(|b| b.msg.partition()).collect();
        parts.sort_unstable();
        parts.dedup();
        assert_eq!(parts.len(), 2);
        let first = out.starts.into_iter().next().unwrap();
        let offsets: Vec<(i64, bool)> = offsets_of(&first).into_iter().map(|o| (o, true)).collect();
        drop(first.permit);
        let _ = s.on_batch_completion(first.id, first.generation, &offsets);
        assert_eq!(
            process(&mut s).starts.len(),
            1,
            "the third partition's batch starts"
        );
    }

    #[test]
    fn revoking_drops_a_waiting_batch_and_commits_only_what_was_handled() {
        let mut s = set(100, 1 << 20);
        s.assign(
            assigned(0, Some(0), ""),
            batch_trigger(8, 2, 1 << 20),
            Instant::now(),
        );
        for o in 0..3 {
            let _ = s.on_message(msg(0, o, "k"));
        }
        let b = process(&mut s).starts.pop().unwrap();
        s.begin_revoke(&[tp(0)], false);
        assert_eq!(s.buffered_bytes(), 0);
        let _ = s.on_batch_completion(b.id, b.generation, &[(0, true), (1, true)]);
        assert_eq!(s.final_commit(&tp(0)).unwrap().0, 2);
        assert!(process(&mut s).starts.is_empty());
    }

    impl<T: Clone> Start<T> {
        /// A copy holding a fresh permit-less stand-in, for tests that finish a run and keep
        /// looking at it.
        fn clone_for_test(&self) -> Start<T> {
            Start {
                id: self.id,
                generation: self.generation,
                key: self.key.clone(),
                msg: self.msg.clone(),
                batch: self.batch.clone(),
                permit: Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap(),
                trigger: self.trigger.clone(),
                trigger_index: self.trigger_index,
                drain: self.drain.clone(),
                cancel: self.cancel.clone(),
            }
        }
    }
}
