//! What the core needs of whoever drives it, as types it does not look into: the records the
//! consumer hands over, the triggers runs are started for, and their concurrency permits. The
//! daemon plugs in rdkafka's messages and tokio's semaphores
//! ([`KafkaShell`](crate::run::spawn::KafkaShell)); the simulator and the unit tests plug in
//! plain values. What the core wants done to runs already started (stop retrying, abandon)
//! goes out as [`RunSignal`] commands, so it holds no task handle or token either.

use std::fmt::Debug;

use super::partitions::PartitionId;

/// A record as the consumer handed it over: what the core reads of it.
pub trait Record: Debug {
    /// Its topic.
    fn topic(&self) -> &str;
    /// Its partition.
    fn partition(&self) -> i32;
    /// Its offset.
    fn offset(&self) -> i64;
    /// Its key's bytes, if it has a key.
    fn key(&self) -> Option<&[u8]>;
    /// Its value's size in bytes (0 without a value).
    fn payload_len(&self) -> usize;
}

/// The types a driver of the core supplies.
pub trait Shell {
    /// What a run needs of its trigger; handed to each run started.
    type Trigger: Clone + Debug;
    /// One of a trigger's concurrency permits, held by a run until it ends (or gives it back
    /// while it waits to retry).
    type Permit: Debug;
    /// A record.
    type Record: Record;

    /// One of `trigger`'s permits, if one is free.
    fn try_permit(trigger: &Self::Trigger) -> Option<Self::Permit>;
}

/// One assignment of a partition: its slot and the assignment's generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AssignmentId {
    /// The partition's slot.
    pub id: PartitionId,
    /// Which assignment of the slot.
    pub generation: u64,
}

/// What the runs of an assignment are to do from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunSignal {
    /// Stop retrying (revoke, stop): each run ends after the attempt it is in, if any.
    Drain(AssignmentId),
    /// Abandon even attempts in progress (lost assignment, drain deadline, forgotten). The
    /// core is done with the assignment: nothing of it starts or is signalled again.
    Abandon(AssignmentId),
}
