//! How a partition's waiting messages become runs: single records as ordering and the
//! trigger's permits allow ([`start_ready`]), or a batch trigger's next batch when it is due
//! ([`start_batch`]); and what a waiting message counts against the byte budget.

use std::time::Instant;

use super::partitions::{Actions, Partition, PartitionId, Start};
use super::shell::{Record, Shell};

/// Starts the messages of `p` that ordering and the trigger's permits allow. Returns true
/// when a message could have started but no permit was free.
pub(super) fn start_ready<S: Shell>(
    p: &mut Partition<S>,
    id: PartitionId,
    now: Instant,
    pressed: bool,
    buffered_bytes: &mut usize,
    batch_timers: &mut Vec<(Instant, PartitionId, u64)>,
    out: &mut Actions<S>,
) -> bool {
    if p.trigger.batch.is_some() {
        return start_batch(p, id, now, pressed, buffered_bytes, batch_timers, out);
    }
    loop {
        if p.queue.waiting() == 0 {
            return false;
        }
        // With the gap full, or the commit map at its budget, only the record at the gap may
        // start: it is what closes the gap.
        let gap_head = if p.tracker.gap_hold(p.queue.in_flight()).is_some() {
            match p.tracker.gap_head() {
                Some(head) => Some(head),
                None => return false,
            }
        } else {
            None
        };
        // Runs waiting to retry give their permits back, so a partition can have more runs
        // started and unfinished than its trigger's concurrency. They all finish above the
        // gap, and what the next owner keeps of the commit metadata holds the gap bound
        // plus at most as many again: so many, and no new one starts but the gap's.
        if gap_head.is_none() && p.queue.in_flight() >= p.tracker.max_above() {
            return false;
        }
        let Some(permit) = S::try_permit(&p.trigger.runtime) else {
            return true;
        };
        let popped = match gap_head {
            None => p.queue.pop_startable(),
            Some(head) => p.queue.pop_startable_if(|m| m.offset() == head),
        };
        let Some((key, msg)) = popped else {
            return false;
        };
        if gap_head.is_none() {
            p.tracker.started(1);
        }
        let bytes = msg_bytes(&msg);
        p.buffered_bytes -= bytes;
        *buffered_bytes -= bytes;
        out.starts.push(Start {
            id,
            generation: p.generation,
            topic_id: p.topic_id.clone(),
            key,
            msg,
            batch: Vec::new(),
            permit,
            trigger: p.trigger.runtime.clone(),
            trigger_index: p.trigger.index,
        });
    }
}

/// A batch trigger's partition: starts its next batch when none is in flight and one is due
/// (see [`BatchLimits::due`](super::batch::BatchLimits::due); `now_due`: whatever its bounds say), or registers a wake-up for
/// `max_wait`. Returns true when a batch was due but no permit was free.
pub(super) fn start_batch<S: Shell>(
    p: &mut Partition<S>,
    id: PartitionId,
    now: Instant,
    now_due: bool,
    buffered_bytes: &mut usize,
    batch_timers: &mut Vec<(Instant, PartitionId, u64)>,
    out: &mut Actions<S>,
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
    let Some(permit) = S::try_permit(&p.trigger.runtime) else {
        return true;
    };
    let mut n = limits.take(p.queue.iter_fifo().map(raw_bytes));
    // The first record is the one at the gap; the others finish above it in any order (a
    // batch can fail in part). When the commit map might not hold them, one record goes.
    if n > 1 {
        if p.tracker.map_fits(0, n - 1) {
            p.tracker.started(n - 1);
        } else {
            n = 1;
        }
    }
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
        topic_id: p.topic_id.clone(),
        key: None,
        msg,
        batch: records.collect(),
        permit,
        trigger: p.trigger.runtime.clone(),
        trigger_index: p.trigger.index,
    });
    false
}

/// A record's key and value bytes (what `batch.max_bytes` bounds).
pub fn raw_bytes(m: &impl Record) -> usize {
    m.payload_len() + m.key().map_or(0, <[u8]>::len)
}

/// What a waiting message costs in memory besides its key and payload: the owned copy, its
/// topic name, the queue entry and the allocator's share. Measured (session 6): with 64
/// partitions paused by the byte budget, RSS grew by about 500 bytes per buffered message of
/// 100 bytes; 64 made the 64 MiB budget let RSS reach 255 MiB.
pub(super) const MESSAGE_OVERHEAD: usize = 384;

/// What a waiting message counts against the byte budget.
pub fn msg_bytes(m: &impl Record) -> usize {
    raw_bytes(m) + MESSAGE_OVERHEAD
}
