//! Per-partition offset bookkeeping: which offset may be committed.
//!
//! Invariant: the commit offset is the lowest offset that is received and not yet handled,
//! or, when nothing is outstanding, the next offset the consumer will read. Everything below
//! it was accepted by the dispatcher (or deliberately skipped).
//!
//! Offsets handled above the commit offset (keys run in parallel, so later offsets can finish
//! first) travel in the commit's metadata, `tk1:<commit offset>:<deltas>`. After a restart or
//! a rebalance the next owner reads them back and does not dispatch those messages again. The
//! metadata is bounded ([`MAX_METADATA_BYTES`]); offsets that do not fit are left out and are
//! offered to the dispatcher again, which recognises them by their idempotency key.
//! Pure and exhaustively tested.

use std::collections::BTreeSet;
use std::fmt::Write as _;

/// Longest commit metadata written (brokers accept 4096 bytes by default).
pub const MAX_METADATA_BYTES: usize = 2048;

/// Most offsets tracked as handled above a gap (one key parked while later keys of its
/// partition run). At this many the partition pauses and starts nothing new until the gap
/// closes, so memory and the cost of a commit stay bounded however long a key is parked.
pub const MAX_TRACKED_ABOVE: usize = 10_000;

const METADATA_PREFIX: &str = "tk1:";

/// Tracks outstanding offsets of one partition.
#[derive(Debug)]
pub struct OffsetTracker {
    /// Offsets handled above a gap at which the gap counts as full ([`MAX_TRACKED_ABOVE`];
    /// smaller in the simulation, so that a schedule reaches it in a few records).
    max_above: usize,
    /// Received and not yet handled.
    outstanding: BTreeSet<i64>,
    /// Handled offsets above the commit offset.
    handled_above: BTreeSet<i64>,
    /// One past the highest offset received, or the consumer's position when further.
    next: Option<i64>,
    /// What was last handed to the consumer to commit.
    stored: Option<(i64, String)>,
}

/// Whether a received message needs dispatching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Dispatch it.
    Dispatch,
    /// The previous owner's commit metadata, or this owner, handled it already (librdkafka
    /// can return a message again, for example after a fetch is restarted).
    AlreadyAccepted,
    /// It was received before and is still waiting or in flight: not a second dispatch.
    AlreadyReceived,
}

impl Default for OffsetTracker {
    fn default() -> Self {
        Self::bounded(MAX_TRACKED_ABOVE)
    }
}

impl OffsetTracker {
    /// An empty tracker whose gap is full at `max_above` offsets handled above it.
    pub fn bounded(max_above: usize) -> Self {
        Self {
            max_above,
            outstanding: BTreeSet::new(),
            handled_above: BTreeSet::new(),
            next: None,
            stored: None,
        }
    }

    /// A tracker for a partition whose group commit is `offset` with `metadata`.
    pub fn from_committed(offset: Option<i64>, metadata: &str) -> Self {
        Self::from_committed_bounded(offset, metadata, MAX_TRACKED_ABOVE)
    }

    /// [`Self::from_committed`] with the gap bound `max_above` (of the metadata, at most
    /// twice that many offsets are kept: see [`MAX_METADATA_OFFSETS`]).
    pub fn from_committed_bounded(offset: Option<i64>, metadata: &str, max_above: usize) -> Self {
        let mut t = Self::bounded(max_above);
        if let Some(offset) = offset.filter(|o| *o >= 0) {
            t.handled_above = parse_metadata_bounded(offset, metadata, 2 * max_above);
            t.stored = Some((offset, metadata.to_owned()));
        }
        t
    }

    /// A message at `offset` was received.
    pub fn received(&mut self, offset: i64) -> Received {
        // Everything below `next` was received (or skipped by the consumer as a transaction
        // marker or aborted record) in this assignment: a message there is a repeat delivery.
        if self.next.is_some_and(|n| offset < n) {
            return if self.outstanding.contains(&offset) {
                Received::AlreadyReceived
            } else {
                Received::AlreadyAccepted
            };
        }
        self.advance_next(offset.saturating_add(1));
        if self.handled_above.contains(&offset) {
            return Received::AlreadyAccepted;
        }
        let _ = self.outstanding.insert(offset);
        Received::Dispatch
    }

    /// The message at `offset` was accepted or deliberately skipped.
    pub fn handled(&mut self, offset: i64) {
        let was_first = self.outstanding.first() == Some(&offset);
        if self.outstanding.remove(&offset) {
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
        if position >= 0 {
            self.advance_next(position);
        }
    }

    fn advance_next(&mut self, candidate: i64) {
        self.next = Some(self.next.map_or(candidate, |n| n.max(candidate)));
    }

    /// The offset that may be committed now, if any: the first outstanding offset, else the
    /// next to read, moved past offsets already handled (listed in the previous owner's
    /// metadata) so that the commit never names a handled offset as the next to dispatch.
    pub fn commit_offset(&self) -> Option<i64> {
        let mut offset = self.outstanding.first().copied().or(self.next)?;
        for o in self.handled_above.range(offset..) {
            if *o != offset {
                break;
            }
            offset += 1;
        }
        Some(offset)
    }

    /// Whether the offsets handled above a gap reached [`MAX_TRACKED_ABOVE`]: the partition
    /// should pause and start nothing but the record at the gap ([`Self::gap_head`]) until
    /// the gap closes.
    pub fn gap_full(&self) -> bool {
        self.handled_above.len() >= self.max_above
    }

    /// Offsets handled above the commit offset, tracked now.
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
        Some((offset, encode_metadata(offset, &self.handled_above)))
    }

    /// Messages received and not handled.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }
}

/// `tk1:<offset>:<d>[-<d>],…` with deltas from `offset`; bounded by [`MAX_METADATA_BYTES`].
fn encode_metadata(offset: i64, above: &BTreeSet<i64>) -> String {
    if above.is_empty() {
        return String::new();
    }
    let mut out = format!("{METADATA_PREFIX}{offset}:");
    let mut iter = above.iter().map(|o| o - offset).peekable();
    let mut first = true;
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            let _ = iter.next();
        }
        let mut item = String::new();
        if !first {
            item.push(',');
        }
        if start == end {
            let _ = write!(item, "{start}");
        } else {
            let _ = write!(item, "{start}-{end}");
        }
        if out.len() + item.len() > MAX_METADATA_BYTES {
            break;
        }
        out.push_str(&item);
        first = false;
    }
    out
}

/// The most offsets kept from one commit's metadata: [`MAX_TRACKED_ABOVE`], plus as many
/// again for the runs that were in flight when a tracker reached it (they still finish and
/// are recorded), so that an owner's own metadata is read back whole for any concurrency up
/// to 10,000. A hostile text naming a million offsets now costs about 0.4 MB, not 20.
pub const MAX_METADATA_OFFSETS: usize = 2 * MAX_TRACKED_ABOVE;

// A full gap stops new runs; those in flight still finish above it. What the next owner keeps
// of the metadata holds them for every concurrency the configuration allows, so an orderly
// handover repeats nothing.
const _: () = assert!(MAX_TRACKED_ABOVE + crate::config::MAX_CONCURRENCY <= MAX_METADATA_OFFSETS);
const _: () = assert!(MAX_TRACKED_ABOVE + crate::config::MAX_BATCH_RECORDS <= MAX_METADATA_OFFSETS);

/// The handled offsets recorded in `metadata`, if it was written for `offset`.
///
/// Metadata is a hint from whoever last committed to the group, so it is validated and
/// bounded: text that is not well formed is ignored whole, and of the offsets it names only
/// the lowest [`MAX_METADATA_OFFSETS`] are kept. Either way at-least-once holds: an offset left
/// out is offered to the dispatcher again, under the same idempotency key.
pub fn parse_metadata(offset: i64, metadata: &str) -> BTreeSet<i64> {
    parse_metadata_bounded(offset, metadata, MAX_METADATA_OFFSETS)
}

/// [`parse_metadata`], keeping at most `limit` offsets.
fn parse_metadata_bounded(offset: i64, metadata: &str, limit: usize) -> BTreeSet<i64> {
    let mut set = BTreeSet::new();
    let Some(rest) = metadata.strip_prefix(METADATA_PREFIX) else {
        return set;
    };
    let Some((base, list)) = rest.split_once(':') else {
        return set;
    };
    if base.parse::<i64>().ok() != Some(offset) {
        return set;
    }
    // Metadata is untrusted text: ranges must ascend and not overlap, and no arithmetic on
    // it can overflow.
    let mut last: i64 = 0;
    for item in list.split(',').filter(|i| !i.is_empty()) {
        let (a, b) = item.split_once('-').unwrap_or((item, item));
        let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>()) else {
            return BTreeSet::new();
        };
        if a <= last || b < a || offset.checked_add(b).is_none() {
            return BTreeSet::new();
        }
        last = b;
        let room = limit - set.len();
        if room > 0 {
            // `b - a` is at most i64::MAX - 1 here (1 <= a <= b), so the count fits in u64.
            let n = usize::try_from(b - a).map_or(room, |d| d.saturating_add(1).min(room));
            set.extend((a..).take(n).map(|d| offset + d));
        }
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_offsets_above_a_gap_survive_a_restart() {
        let mut t = OffsetTracker::default();
        for o in 10..20 {
            assert_eq!(t.received(o), Received::Dispatch);
        }
        for o in [11, 12, 13, 15, 19] {
            t.handled(o);
        }
        let (offset, metadata) = t.take_new_commit().unwrap();
        assert_eq!(offset, 10);
        assert_eq!(metadata, "tk1:10:1-3,5,9");
        // The next owner reads the commit back.
        let mut next = OffsetTracker::from_committed(Some(offset), &metadata);
        assert_eq!(next.take_new_commit(), None);
        let got: Vec<Received> = (10..20).map(|o| next.received(o)).collect();
        assert_eq!(
            got.iter()
                .filter(|r| **r == Received::AlreadyAccepted)
                .count(),
            5
        );
        assert_eq!(next.commit_offset(), Some(10));
        next.handled(10);
        assert_eq!(next.take_new_commit(), Some((14, "tk1:14:1,5".to_owned())));
        for o in [14, 16, 17, 18] {
            next.handled(o);
        }
        assert_eq!(next.take_new_commit(), Some((20, String::new())));
    }

    #[test]
    fn a_handled_offset_equal_to_the_commit_offset_is_not_dispatched_again() {
        // The previous owner handled 101-103 above a gap at 100.
        let mut t = OffsetTracker::from_committed(Some(100), "tk1:100:1-3");
        assert_eq!(t.received(100), Received::Dispatch);
        t.handled(100);
        assert_eq!(t.take_new_commit(), Some((104, String::new())));
        for o in 101..=103 {
            assert_eq!(t.received(o), Received::AlreadyAccepted, "offset {o}");
        }
        assert_eq!(t.received(104), Received::Dispatch);
    }

    #[test]
    fn a_message_delivered_twice_is_dispatched_once() {
        let mut t = OffsetTracker::default();
        for o in 0..5 {
            assert_eq!(t.received(o), Received::Dispatch);
        }
        t.handled(0);
        t.handled(1);
        let _ = t.take_new_commit();
        // librdkafka returns 0..5 again (a fetch restarted from an older position).
        assert_eq!(t.received(0), Received::AlreadyAccepted);
        assert_eq!(t.received(1), Received::AlreadyAccepted);
        assert_eq!(t.received(2), Received::AlreadyReceived);
        t.handled(3);
        assert_eq!(t.received(3), Received::AlreadyAccepted);
        assert_eq!(t.received(5), Received::Dispatch);
        assert_eq!(t.outstanding(), 3, "2, 4 and 5");
    }

    #[test]
    fn offsets_tracked_above_a_gap_are_bounded() {
        let mut t = OffsetTracker::default();
        let _ = t.received(0); // parked
        let mut o = 1;
        while !t.gap_full() {
            let _ = t.received(o);
            t.handled(o);
            o += 1;
        }
        assert_eq!(o as usize, MAX_TRACKED_ABOVE + 1);
        let (offset, metadata) = t.take_new_commit().unwrap();
        assert_eq!(offset, 0);
        // Consecutive offsets encode as one range: the metadata describes all of them.
        assert_eq!(metadata, format!("tk1:0:1-{MAX_TRACKED_ABOVE}"));
        assert_eq!(
            parse_metadata(0, &metadata).len(),
            MAX_TRACKED_ABOVE,
            "never dropped whole"
        );
        t.handled(0);
        assert!(!t.gap_full());
        assert_eq!(t.take_new_commit(), Some((o, String::new())));
    }

    #[test]
    fn metadata_for_another_offset_or_garbage_is_ignored() {
        assert!(parse_metadata(5, "tk1:4:1").is_empty());
        assert!(parse_metadata(5, "something else").is_empty());
        assert!(parse_metadata(5, "tk1:5:x").is_empty());
        assert!(parse_metadata(5, "tk1:5:0").is_empty());
        assert_eq!(
            parse_metadata(5, "tk1:5:2-4")
                .into_iter()
                .collect::<Vec<_>>(),
            vec![7, 8, 9]
        );
    }

    #[test]
    fn hostile_metadata_is_cut_to_the_tracking_bound_or_ignored() {
        // Fifteen bytes naming a million offsets: only the lowest MAX_METADATA_OFFSETS kept.
        let kept = parse_metadata(1, "tk1:1:1-999999");
        assert_eq!(kept.len(), MAX_METADATA_OFFSETS);
        assert_eq!(kept.first(), Some(&2));
        assert_eq!(kept.last(), Some(&(1 + MAX_METADATA_OFFSETS as i64)));
        // Many ranges: still the bound, and the lowest ones.
        let many: Vec<String> = (0..30_000).map(|i| format!("{}", 2 * i + 1)).collect();
        let kept = parse_metadata(0, &format!("tk1:0:{}", many.join(",")));
        assert_eq!(kept.len(), MAX_METADATA_OFFSETS);
        assert_eq!(kept.last(), Some(&(2 * MAX_METADATA_OFFSETS as i64 - 1)));
        // Ranges out of order, overlapping, or past i64: ignored whole.
        assert!(parse_metadata(0, "tk1:0:5,3").is_empty());
        assert!(parse_metadata(0, "tk1:0:1-5,5-9").is_empty());
        assert!(parse_metadata(10, &format!("tk1:10:1-{}", i64::MAX)).is_empty());
        assert_eq!(
            parse_metadata(0, &format!("tk1:0:1-{}", i64::MAX)).len(),
            MAX_METADATA_OFFSETS
        );
        // An owner's own metadata at the bound, with the runs in flight then, is read whole.
        let own = format!("tk1:0:1-{}", MAX_TRACKED_ABOVE + 64);
        assert_eq!(parse_metadata(0, &own).len(), MAX_TRACKED_ABOVE + 64);
    }

    #[test]
    fn a_tracker_loaded_with_a_full_gap_names_the_record_at_the_gap() {
        let mut t = OffsetTracker::from_committed(Some(0), &format!("tk1:0:1-{MAX_TRACKED_ABOVE}"));
        assert!(t.gap_full());
        assert_eq!(t.gap_head(), None, "nothing received yet");
        assert_eq!(t.received(0), Received::Dispatch);
        assert_eq!(t.received(1), Received::AlreadyAccepted);
        assert_eq!(t.gap_head(), Some(0));
        t.handled(0);
        assert!(!t.gap_full(), "handling the record at the gap closes it");
        assert_eq!(t.commit_offset(), Some(MAX_TRACKED_ABOVE as i64 + 1));
    }

    #[test]
    fn metadata_is_bounded() {
        let above: BTreeSet<i64> = (0..5000).map(|i| 100 + 2 * i + 1).collect();
        let m = encode_metadata(100, &above);
        assert!(m.len() <= MAX_METADATA_BYTES);
        let back = parse_metadata(100, &m);
        assert!(!back.is_empty() && back.iter().all(|o| above.contains(o)));
    }

    #[test]
    fn commit_offset_stops_at_the_first_gap() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.commit_offset(), None);
        for o in 10..15 {
            let _ = t.received(o);
        }
        assert_eq!(t.commit_offset(), Some(10));
        t.handled(11);
        t.handled(12);
        assert_eq!(t.take_new_commit(), Some((10, "tk1:10:1-2".to_owned())));
        assert_eq!(t.take_new_commit(), None);
        t.handled(10);
        assert_eq!(t.take_new_commit(), Some((13, String::new())));
        t.handled(14);
        assert_eq!(t.commit_offset(), Some(13));
        t.handled(13);
        assert_eq!(t.take_new_commit(), Some((15, String::new())));
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn position_moves_past_control_records_only_when_nothing_is_outstanding() {
        let mut t = OffsetTracker::default();
        let _ = t.received(0);
        let _ = t.received(1);
        t.position(3); // commit marker at 2
        assert_eq!(t.commit_offset(), Some(0));
        t.handled(0);
        t.handled(1);
        assert_eq!(t.commit_offset(), Some(3));
        t.position(-1001); // invalid positions are ignored
        t.position(2); // never goes back
        assert_eq!(t.commit_offset(), Some(3));
    }

    #[test]
    fn never_commits_past_an_outstanding_offset_in_any_order() {
        // Every order of handling 5 messages: the commit offset never passes an outstanding one.
        let offsets = [0i64, 1, 2, 3, 4];
        let mut perms: Vec<Vec<i64>> = vec![vec![]];
        for _ in 0..offsets.len() {
            let mut next = Vec::new();
            for p in &perms {
                for o in offsets.iter().filter(|o| !p.contains(o)) {
                    let mut q = p.clone();
                    q.push(*o);
                    next.push(q);
                }
            }
            perms = next;
        }
        assert_eq!(perms.len(), 120);
        for order in perms {
            let mut t = OffsetTracker::default();
            offsets.iter().for_each(|o| {
                let _ = t.received(*o);
            });
            let mut done = BTreeSet::new();
            for o in order {
                t.handled(o);
                let _ = done.insert(o);
                let c = t.commit_offset().unwrap();
                assert!((0..c).all(|x| done.contains(&x)));
            }
            assert_eq!(t.commit_offset(), Some(5));
        }
    }
}
