//! Per-partition offset bookkeeping: which offset may be committed, and the map of what is
//! handled above it.
//!
//! Invariant: the commit offset is the lowest offset that is received and not yet handled,
//! or, when nothing is outstanding, the next offset the consumer will read. Everything below
//! it was accepted by the dispatcher (or deliberately skipped), or never returned by the
//! consumer (a transaction marker, an aborted record, an offset removed by compaction).
//!
//! Offsets handled above the commit offset (keys run in parallel, so later offsets can finish
//! first) travel in the commit's metadata ([`offset_codec`], `tk3:<topic id>:<commit
//! offset>:<runs>`, or `tk2:<commit offset>:<runs>` where the cluster has no topic ids).
//! After a restart or a rebalance the next owner reads them back and does not dispatch those
//! messages again. The rule the map is built by extends the commit offset's own: above the
//! commit offset, an offset below the consumer's position counts as handled unless it is
//! outstanding (handled by this owner, named by the previous owner's map, or never returned
//! by the consumer: nothing to run there), and one at or beyond it only if the previous
//! owner's map names it. So a topic with one record per transaction, or a compacted one,
//! costs a map no more than one without gaps.
//!
//! The map must fit the broker's `offset.metadata.max.bytes` (the connection's
//! `commit_metadata_max_bytes`). Rather than commit a map cut short (the next owner would run
//! again what it leaves out), a partition stops starting runs above its gap while the map,
//! with every run in flight finished in any order, might not fit ([`OffsetTracker::gap_hold`]);
//! only the record at the gap starts then, and handling it is what shrinks the map. The same
//! holds at [`MAX_TRACKED_ABOVE`] records handled above a gap. Pure and exhaustively tested.

use std::cell::Cell;
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use crate::core::offset_codec::{self, HandledRanges, MetadataError};

pub use crate::core::offset_codec::MAX_METADATA_OFFSETS;

/// Most records tracked as handled above a gap (one key parked while later keys of its
/// partition run). At this many the partition pauses and starts nothing new until the gap
/// closes, so memory and the cost of a commit stay bounded however long a key is parked.
pub const MAX_TRACKED_ABOVE: usize = 10_000;

/// The default longest commit metadata, in characters: the broker's default
/// `offset.metadata.max.bytes`.
pub const DEFAULT_METADATA_MAX_CHARS: usize = 4096;

/// What bounds a partition's offsets above its gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackerLimits {
    /// Records handled above a gap at which it counts as full ([`MAX_TRACKED_ABOVE`];
    /// smaller in the simulation, so that a schedule reaches it in a few records).
    pub max_above: usize,
    /// The longest commit metadata written, in characters (the broker's
    /// `offset.metadata.max.bytes`; smaller in the simulation).
    pub metadata_max_chars: usize,
}

impl Default for TrackerLimits {
    fn default() -> Self {
        Self {
            max_above: MAX_TRACKED_ABOVE,
            metadata_max_chars: DEFAULT_METADATA_MAX_CHARS,
        }
    }
}

/// Why a partition starts nothing above its gap but the record at the gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapHold {
    /// [`TrackerLimits::max_above`] records are handled above the gap.
    Tracked,
    /// The commit metadata might not fit its budget if one more run started.
    Metadata,
}

/// Tracks outstanding offsets of one partition.
#[derive(Debug)]
pub struct OffsetTracker {
    limits: TrackerLimits,
    /// Received and not yet handled.
    outstanding: BTreeSet<i64>,
    /// Records handled above the first outstanding offset (by this owner, or named by the
    /// previous owner's map and received since), all below `next`.
    handled_above: BTreeSet<i64>,
    /// The previous owner's map, as handled ranges, at and above `next` (below it, what
    /// they named was received since, or never will be).
    prior: VecDeque<(i64, i64)>,
    /// Offsets in `prior`.
    prior_len: u64,
    /// One past the highest offset received, or the consumer's position when further, or
    /// the commit offset when it moved past offsets the previous owner handled.
    next: Option<i64>,
    /// One past the highest offset the consumer returned, or its position when further: a
    /// message below it means the position moved back.
    seen: Option<i64>,
    /// What was last handed to the consumer to commit.
    stored: Option<(i64, String)>,
    /// Changes with every event that can change the map.
    version: u64,
    /// The start gate's last measure of the map (see [`OffsetTracker::map_fits`]).
    gate: Cell<Gate>,
    /// Changes whenever `gate` does.
    gate_epoch: Cell<u64>,
    /// The last answer of [`OffsetTracker::map_fits`] and what it was asked under: the core
    /// asks it several times per partition visit, mostly of an unchanged tracker.
    fits_memo: Cell<Option<(FitsQuestion, bool)>>,
    /// What naming `topic_id` adds to the metadata's length
    /// ([`offset_codec::topic_id_len`]), kept with it.
    id_len: usize,
    /// Maps cut to fit the budget (only a previous owner's map written under a larger one).
    maps_cut: u64,
    /// Why the previous owner's metadata was not read, if it was not.
    refused: Option<MetadataError>,
    /// The topic id the commits name (the partition's, when known).
    topic_id: Option<Arc<str>>,
    /// The topic id the group's commit named when assigned, if its metadata names one.
    committed_topic_id: Option<Arc<str>>,
}

/// The start gate's measure: the map's runs when measured, the records then in flight, and
/// those started since. Each record finishing can add at most two runs, so the map's runs
/// stay below `runs + 2 * (in_flight + started)` until the next measure.
#[derive(Debug, Clone, Copy, Default)]
struct Gate {
    measured: bool,
    runs: usize,
    in_flight: usize,
    started: usize,
    /// A measure that did not fit, at this version and count in flight: not measured again
    /// until either changes.
    failed: Option<(u64, usize)>,
}

/// What a [`OffsetTracker::map_fits`] answer depends on: the tracker's version, the gate's
/// epoch, the records in flight and the records to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FitsQuestion {
    version: u64,
    gate_epoch: u64,
    in_flight: usize,
    k: usize,
}

/// Whether a received message needs dispatching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Dispatch it.
    Dispatch,
    /// The previous owner's commit metadata lists it as handled.
    AlreadyAccepted,
    /// It lies below what this assignment already received: the consumer's position moved
    /// back (an offset reset after an out-of-range fetch, a topic deleted and created again,
    /// a log truncated after an unclean leader election). librdkafka never returns a message
    /// twice otherwise: a pause, a resume or a restarted fetch go on from the position after
    /// the last message returned. Nothing proves that the records from here on were handled:
    /// the log they are read from may not be the one that was handled. Nothing is recorded;
    /// the caller starts the partition's bookkeeping again from this offset.
    MovedBack {
        /// The offset this assignment expected next.
        expected: i64,
    },
}

impl Default for OffsetTracker {
    fn default() -> Self {
        Self::new(TrackerLimits::default())
    }
}

impl OffsetTracker {
    /// An empty tracker.
    pub fn new(limits: TrackerLimits) -> Self {
        Self {
            limits,
            outstanding: BTreeSet::new(),
            handled_above: BTreeSet::new(),
            prior: VecDeque::new(),
            prior_len: 0,
            next: None,
            seen: None,
            stored: None,
            version: 0,
            gate: Cell::new(Gate::default()),
            gate_epoch: Cell::new(0),
            fits_memo: Cell::new(None),
            id_len: 0,
            maps_cut: 0,
            refused: None,
            topic_id: None,
            committed_topic_id: None,
        }
    }

    /// An empty tracker whose gap is full at `max_above` records handled above it.
    pub fn bounded(max_above: usize) -> Self {
        Self::new(TrackerLimits {
            max_above,
            ..TrackerLimits::default()
        })
    }

    /// A tracker for a partition whose group commit is `offset` with `metadata`.
    pub fn from_committed(offset: Option<i64>, metadata: &str) -> Self {
        Self::from_committed_with(offset, metadata, TrackerLimits::default())
    }

    /// [`Self::from_committed`] with `limits`. Metadata that is not a map of this offset
    /// is not read ([`Self::metadata_refused`] says why): the records above the offset run
    /// again, as at-least-once allows.
    pub fn from_committed_with(offset: Option<i64>, metadata: &str, limits: TrackerLimits) -> Self {
        let mut t = Self::new(limits);
        if let Some(offset) = offset.filter(|o| *o >= 0) {
            match offset_codec::decode_committed(offset, metadata) {
                Ok(c) => {
                    t.committed_topic_id = c.topic_id.map(Arc::from);
                    t.prior_len = c.handled.len() as u64;
                    t.prior = c.handled.into_ranges().into();
                }
                Err(e) => t.refused = Some(e),
            }
            t.stored = Some((offset, metadata.to_owned()));
        }
        t
    }

    /// Why the previous owner's commit metadata was not read, if it was not.
    pub fn metadata_refused(&self) -> Option<&MetadataError> {
        self.refused.as_ref()
    }

    /// The offset after the last one received (or passed by a position) in this
    /// assignment: where the log goes on.
    pub fn seen(&self) -> Option<i64> {
        self.seen
    }

    /// The partition's topic id is `topic_id` (None: not known): the commits name it.
    pub fn set_topic_id(&mut self, topic_id: Option<Arc<str>>) {
        if self.topic_id != topic_id {
            self.id_len = offset_codec::topic_id_len(topic_id.as_deref());
            self.topic_id = topic_id;
            self.version += 1;
            // The gate's bound counts the id: measured again.
            self.set_gate(Gate::default());
        }
    }

    /// The topic id the commits name.
    pub fn topic_id(&self) -> Option<&Arc<str>> {
        self.topic_id.as_ref()
    }

    /// The topic id the group's commit named when the partition was assigned, if its
    /// metadata names one (the `tk3` form).
    pub fn committed_topic_id(&self) -> Option<&Arc<str>> {
        self.committed_topic_id.as_ref()
    }

    /// Whether the group's commit was made under another topic of the same name than the one
    /// whose id is `topic_id` (deleted and created again; Kafka keeps a group's offsets by
    /// name): its offset and map say nothing of this log. False when either id is unknown.
    pub fn committed_under_other_topic(&self, topic_id: Option<&str>) -> bool {
        matches!((self.committed_topic_id.as_deref(), topic_id), (Some(c), Some(t)) if c != t)
    }

    /// A message at `offset` was received.
    pub fn received(&mut self, offset: i64) -> Received {
        // Everything below `next` was received (or skipped by the consumer as a transaction
        // marker or aborted record) in this assignment: a message there means the position
        // moved back.
        if let Some(expected) = self.seen.filter(|n| offset < *n) {
            return Received::MovedBack { expected };
        }
        self.seen = Some(offset.saturating_add(1));
        self.version += 1;
        // Below `next` now only when the commit moved past offsets the previous owner's
        // metadata listed as handled.
        let covered = self.next.is_some_and(|n| offset < n);
        let named = covered || self.prior_contains(offset);
        self.advance_next(offset.saturating_add(1));
        if named {
            // Above the gap it stays in the map; below it the commit offset covers it.
            if self.outstanding.first().is_some_and(|f| *f < offset) {
                let _ = self.handled_above.insert(offset);
            }
            return Received::AlreadyAccepted;
        }
        let _ = self.outstanding.insert(offset);
        Received::Dispatch
    }

    /// The message at `offset` was accepted or deliberately skipped.
    pub fn handled(&mut self, offset: i64) {
        let was_first = self.outstanding.first() == Some(&offset);
        if self.outstanding.remove(&offset) {
            self.version += 1;
            let _ = self.handled_above.insert(offset);
            if was_first {
                // The gap moved: what lies below the new first outstanding offset (or the next
                // to read) is covered by the commit offset and need not be kept.
                if let Some(floor) = self.outstanding.first().copied().or(self.next) {
                    self.handled_above = self.handled_above.split_off(&floor);
                }
            }
        }
    }

    /// The consumer's position moved to `position` (the next offset it will return). It can
    /// move past offsets no message was returned for: transaction markers and aborted records.
    /// Only positions reported in order with the messages may be given here.
    pub fn position(&mut self, position: i64) {
        if position < 0 {
            return;
        }
        self.seen = Some(self.seen.map_or(position, |s| s.max(position)));
        if self.next.is_none_or(|n| position > n) {
            self.version += 1;
            self.advance_next(position);
        }
    }

    fn advance_next(&mut self, candidate: i64) {
        let next = self.next.map_or(candidate, |n| n.max(candidate));
        self.next = Some(next);
        // What the previous owner's map names below the position was received since (and
        // is tracked as any handled record), or was never a record.
        while let Some(front) = self.prior.front_mut() {
            if front.1 <= next {
                self.prior_len -= (front.1 - front.0) as u64;
                let _ = self.prior.pop_front();
            } else {
                if front.0 < next {
                    self.prior_len -= (next - front.0) as u64;
                    front.0 = next;
                }
                break;
            }
        }
    }

    fn prior_contains(&self, offset: i64) -> bool {
        let i = self.prior.partition_point(|(_, e)| *e <= offset);
        self.prior.get(i).is_some_and(|(s, _)| *s <= offset)
    }

    /// The offset that may be committed now, if any: the first outstanding offset, else the
    /// next to read, moved past offsets already handled (named in the previous owner's
    /// metadata) so that the commit never names a handled offset as the next to dispatch.
    pub fn commit_offset(&self) -> Option<i64> {
        if let Some(first) = self.outstanding.first() {
            return Some(*first);
        }
        let next = self.next?;
        // The front range starts at `next` at the earliest (see `advance_next`).
        Some(match self.prior.front() {
            Some(&(s, e)) if s <= next => e,
            _ => next,
        })
    }

    /// Whether [`TrackerLimits::max_above`] offsets are handled above the gap (records this
    /// owner handled, and offsets the previous owner's map names ahead of the position): the
    /// partition should pause and start nothing but the record at the gap
    /// ([`Self::gap_head`]) until the gap closes. A new owner can load a full gap.
    pub fn gap_full(&self) -> bool {
        self.handled_above.len() as u64 + self.prior_len >= self.limits.max_above as u64
    }

    /// The gap bound: offsets handled above a gap at which it counts as full (and, so, the
    /// most runs of the partition started and unfinished).
    pub fn max_above(&self) -> usize {
        self.limits.max_above
    }

    /// Whether the partition may start nothing above its gap but the record at the gap, and
    /// why, with `in_flight` of its records in flight: the gap is full, or one more run might
    /// not leave the commit metadata within its budget.
    pub fn gap_hold(&self, in_flight: usize) -> Option<GapHold> {
        if self.gap_full() {
            Some(GapHold::Tracked)
        } else if !self.map_fits(in_flight, 1) {
            Some(GapHold::Metadata)
        } else {
            None
        }
    }

    /// Whether `k` more records may start, with `in_flight` in flight, and every map they and
    /// those in flight can lead to, finishing in any order, still fit the budget.
    ///
    /// A map's text is at most [`offset_codec::max_len`] of its span and runs. The span of
    /// any later map is within the base and the position now (a record starts only once it
    /// was received). Its runs: each record that finishes adds at most two (it splits a run
    /// not handled, or extends the map past runs not handled), arrivals add none (the map
    /// ends with its last handled offset), and the gap moving removes some. So the bit set
    /// bound is O(1), and when it does not fit, the runs measured once (O(map)) plus two per
    /// record in flight or started since bound every later map, until they no longer fit and
    /// the map is measured again.
    pub fn map_fits(&self, in_flight: usize, k: usize) -> bool {
        let question = FitsQuestion {
            version: self.version,
            gate_epoch: self.gate_epoch.get(),
            in_flight,
            k,
        };
        if let Some((asked, answer)) = self.fits_memo.get() {
            if asked == question {
                return answer;
            }
        }
        let answer = self.measure_fits(in_flight, k);
        // Asked again under the same state (a measure changes the gate, so its epoch), the
        // answer is the same.
        let question = FitsQuestion {
            gate_epoch: self.gate_epoch.get(),
            ..question
        };
        self.fits_memo.set(Some((question, answer)));
        answer
    }

    fn set_gate(&self, gate: Gate) {
        self.gate.set(gate);
        self.gate_epoch.set(self.gate_epoch.get().wrapping_add(1));
    }

    fn measure_fits(&self, in_flight: usize, k: usize) -> bool {
        let Some(&base) = self.outstanding.first() else {
            return true;
        };
        let top = self
            .next
            .unwrap_or(base)
            .max(self.prior.back().map_or(base, |r| r.1))
            .max(base.saturating_add(1));
        let span = (top - base) as u64;
        if span > MAX_METADATA_OFFSETS as u64 + 1 {
            return false;
        }
        let budget = self.limits.metadata_max_chars;
        let id_len = self.id_len;
        if offset_codec::max_len(top, id_len, None, span) <= budget {
            return true;
        }
        let fits = |runs: usize| offset_codec::max_len(top, id_len, Some(runs), span) <= budget;
        let g = self.gate.get();
        if g.measured && fits(g.runs + 2 * (g.in_flight + g.started + k)) {
            return true;
        }
        if g.failed == Some((self.version, in_flight)) {
            return false;
        }
        let runs = self.runs(base).len();
        let ok = fits(runs + 2 * (in_flight + k));
        self.set_gate(Gate {
            measured: true,
            runs,
            in_flight,
            started: 0,
            failed: (!ok).then_some((self.version, in_flight)),
        });
        ok
    }

    /// `k` records started above the gap (after [`Self::map_fits`] allowed them).
    pub fn started(&self, k: usize) {
        let mut g = self.gate.get();
        g.started += k;
        self.set_gate(g);
    }

    /// Records handled above the commit offset, tracked now.
    pub fn handled_above(&self) -> usize {
        self.handled_above.len()
    }

    /// The lowest offset received and not handled: the record the commit waits on. It may
    /// always start, even with the gap full, since handling it is what closes the gap (a new
    /// owner can load a full gap from the previous owner's metadata before it has started
    /// anything).
    pub fn gap_head(&self) -> Option<i64> {
        self.outstanding.first().copied()
    }

    /// The commit offset and its metadata, when they changed since the last call; records
    /// them as stored. Never goes back below what was stored.
    pub fn take_new_commit(&mut self) -> Option<(i64, String)> {
        let (offset, metadata) = self.commit()?;
        if let Some((s, m)) = &self.stored {
            if *s > offset || (*s == offset && *m == metadata) {
                return None;
            }
        }
        self.stored = Some((offset, metadata.clone()));
        Some((offset, metadata))
    }

    /// The offset last handed out to be committed (or the group's when assigned).
    pub fn stored_offset(&self) -> Option<i64> {
        self.stored.as_ref().map(|(o, _)| *o)
    }

    /// The commit offset and its metadata now.
    pub fn commit(&mut self) -> Option<(i64, String)> {
        let offset = self.commit_offset()?;
        // Offsets below the commit offset are covered by it; a handled offset the commit
        // moved past will be recognised by `next` when it arrives.
        self.handled_above = self.handled_above.split_off(&offset);
        if self.outstanding.is_empty() {
            self.advance_next(offset);
        }
        let runs = self.runs(offset);
        let (metadata, cut) = offset_codec::encode_with_id(
            self.topic_id.as_deref(),
            offset,
            &runs,
            self.limits.metadata_max_chars,
        );
        if cut {
            self.maps_cut += 1;
        }
        Some((offset, metadata))
    }

    /// Commit maps cut to fit the budget so far: only a previous owner's map, written under
    /// a larger budget, can need it (this owner's runs stop before theirs would not fit).
    pub fn maps_cut(&self) -> u64 {
        self.maps_cut
    }

    /// The runs of the map from `base`: alternately not handled and handled, the first not
    /// handled and the last handled (none when nothing above `base` is handled). Offsets the
    /// consumer never returned (below `next`, neither outstanding nor handled) join the run
    /// before them. O(records handled above the gap + outstanding below the last of them +
    /// the previous owner's ranges).
    fn runs(&self, base: i64) -> Vec<u64> {
        let next = self.next.unwrap_or(base).max(base);
        let last_handled = self
            .handled_above
            .range(base..next)
            .next_back()
            .map(|o| o + 1)
            .max(self.prior.back().map(|r| r.1).filter(|e| *e > next));
        let Some(last_handled) = last_handled else {
            return Vec::new();
        };
        let mut w = RunWriter {
            start: base,
            handled: false,
            runs: Vec::new(),
        };
        // Below `next`: outstanding and handled records, in offset order.
        let mut out = self
            .outstanding
            .range(base..next.min(last_handled))
            .peekable();
        let mut done = self.handled_above.range(base..next).peekable();
        loop {
            match (out.peek().copied(), done.peek().copied()) {
                (Some(&o), Some(&h)) if o < h => {
                    let _ = out.next();
                    w.mark(o, false);
                }
                (_, Some(&h)) => {
                    let _ = done.next();
                    w.mark(h, true);
                }
                (Some(&o), None) => {
                    let _ = out.next();
                    w.mark(o, false);
                }
                (None, None) => break,
            }
        }
        // At and beyond `next`: what the previous owner's map names; nothing else is handled.
        let mut at = next;
        for &(s, e) in &self.prior {
            if e <= at {
                continue;
            }
            let s = s.max(at);
            if s > at {
                w.mark(at, false);
            }
            w.mark(s, true);
            at = e;
        }
        w.finish(last_handled)
    }

    /// Messages received and not handled.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }
}

/// Builds runs from offsets in order, each handled or not; offsets between two given ones
/// join the run of the first.
struct RunWriter {
    start: i64,
    handled: bool,
    runs: Vec<u64>,
}

impl RunWriter {
    fn mark(&mut self, offset: i64, handled: bool) {
        if handled != self.handled {
            self.runs.push((offset - self.start) as u64);
            self.start = offset;
            self.handled = handled;
        }
    }

    /// The runs, the last a handled one ending at `end` (a run not handled at the end is
    /// left out: nothing above the last handled offset needs describing).
    fn finish(mut self, end: i64) -> Vec<u64> {
        if self.handled {
            self.runs.push((end - self.start) as u64);
        }
        self.runs
    }
}

/// The handled offsets `metadata` names above the commit offset `offset` (none when it is
/// not a map of that offset), for tools and tests.
pub fn parse_metadata(offset: i64, metadata: &str) -> HandledRanges {
    offset_codec::decode(offset, metadata).unwrap_or_default()
}

#[cfg(test)]
#[path = "offsets_tests.rs"]
mod tests;
