//! One owned partition and what the partition set ([`crate::core::partitions`]) hands out
//! about it: its slot, its trigger, its state, why it paused, what a message's arrival meant,
//! and the runs to start.

use std::sync::Arc;
use std::time::Instant;

use crate::core::batch::BatchLimits;
use crate::core::offsets::OffsetTracker;
use crate::core::scheduler::PartitionQueue;
use crate::core::shell::{AssignmentId, Shell};
use crate::core::types::{Ordering, TopicPartition};

/// An owned partition's slot. With the assignment's generation it names one assignment: a
/// completion from an earlier assignment of the same slot is recognised and ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PartitionId(pub(super) u32);

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
    /// The longest commit metadata, in characters (`commit_metadata_max_bytes`): a partition
    /// whose map might outgrow it pauses like one whose gap is full.
    pub metadata_max_chars: usize,
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
    /// Its topic's id (KIP-516), where the cluster has them: part of its records'
    /// idempotency keys, so a topic created again under the same name is a new log.
    pub topic_id: Option<Arc<str>>,
    /// The log it reads is not identified yet: nothing of it starts or is committed until
    /// [`PartitionSet::verify_topic_id`](crate::core::partitions::PartitionSet::verify_topic_id) says which topic it is.
    pub unverified: Option<Unverified>,
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
    /// Its topic was created again and the consumer is to move to where
    /// `auto.offset.reset` says: what arrives before the shell says it moved
    /// ([`PartitionSet::on_sought`](crate::core::partitions::PartitionSet::on_sought)) was
    /// read before the move (the new log from the old position, or the old log) and is
    /// dropped; it is read again from there.
    pub(super) awaiting_seek: bool,
    /// The group's committed offset when the partition was assigned.
    pub(super) start: Option<i64>,
    /// Paused in the consumer by this set, and why (None: flowing).
    pub paused: Option<PauseReason>,
    pub(super) buffered_bytes: usize,
    /// When the commit offset last moved (or the partition last had no backlog); offsets
    /// handled above a held record do not count.
    pub last_progress: Instant,
    /// Why the partition is reported stalled, while it is.
    pub stalled: Option<String>,
    /// Being revoked: nothing new starts.
    pub(super) revoking: bool,
    /// New runs wait: the broker refuses this partition's own commits.
    pub(super) commit_refused: bool,
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
    /// Bytes of its waiting messages (what it holds of the connection's budget).
    pub fn buffered_bytes(&self) -> usize {
        self.buffered_bytes
    }

    /// Messages waiting or in flight.
    pub fn backlog(&self) -> usize {
        self.queue.waiting() + self.queue.in_flight()
    }

    /// New runs wait because the broker refuses this partition's own commits.
    pub fn commit_refused(&self) -> bool {
        self.commit_refused
    }
}

/// Why the partition set paused a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseReason {
    /// Its own buffer holds `per_partition` waiting messages.
    Buffer,
    /// The connection holds half its byte budget or more, and this partition more than half
    /// its fair share of it (the budget divided by the partitions owned).
    Budget,
    /// The offsets handled above its gap reached their bound.
    Gap,
    /// The commit metadata describing the offsets handled above its gap might outgrow its
    /// budget (`commit_metadata_max_bytes`) with one more run.
    Metadata,
}

impl PauseReason {
    /// A short label (metrics, health).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Buffer => "buffer",
            Self::Budget => "budget",
            Self::Gap => "gap",
            Self::Metadata => "metadata",
        }
    }
}

/// Why a partition's log is not identified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unverified {
    /// Its position moved back: its bookkeeping started again from there.
    MovedBack,
    /// librdkafka hinted that a topic was deleted or created again.
    Hint,
}

/// What a message's arrival meant.
#[derive(Debug)]
pub enum Arrival<R> {
    /// Queued to run.
    Queued(PartitionId),
    /// Handled already, per the previous owner's commit metadata.
    AlreadyAccepted(PartitionId),
    /// Below what the assignment already received: the consumer's position moved back (see
    /// [`Received::MovedBack`](crate::core::offsets::Received::MovedBack)). The partition's bookkeeping started again from this record,
    /// which is queued: what was waiting was dropped and the runs in flight abandoned, and
    /// every record from here on runs (again).
    MovedBack {
        /// The partition (its new assignment).
        id: PartitionId,
        /// The offset the assignment expected next.
        expected: i64,
        /// The record's offset.
        offset: i64,
    },
    /// Its partition is not owned: the message, given back (for the log).
    NotAssigned(R),
    /// Read before the consumer moved to a new log's start (its topic was created again):
    /// dropped, and read again from there.
    BeforeSeek(PartitionId),
}

/// A partition whose position moved back with no message behind it (see
/// [`PartitionSet::on_position`](crate::core::partitions::PartitionSet::on_position)): its
/// bookkeeping started again from the position, as for [`Arrival::MovedBack`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositionMovedBack {
    /// The partition (its new assignment).
    pub id: PartitionId,
    /// The offset the assignment expected next.
    pub expected: i64,
    /// The position.
    pub offset: i64,
}

/// A run to start: the message, the permit it holds, and what its worker needs. What the
/// run is to do when its partition is revoked or lost comes later, as a [`RunSignal`](crate::core::shell::RunSignal) for
/// its assignment.
#[derive(Debug)]
pub struct Start<S: Shell> {
    /// Its partition.
    pub id: PartitionId,
    /// Its partition's assignment.
    pub generation: u64,
    /// Its topic's id, where the cluster has them (see [`Partition::topic_id`]).
    pub topic_id: Option<Arc<str>>,
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
    /// The assignment the run belongs to (what [`RunSignal`](crate::core::shell::RunSignal)s name).
    pub fn assignment(&self) -> AssignmentId {
        AssignmentId {
            id: self.id,
            generation: self.generation,
        }
    }
}

/// What [`PartitionSet::process`](crate::core::partitions::PartitionSet::process) asks of the consumer and the runtime.
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
