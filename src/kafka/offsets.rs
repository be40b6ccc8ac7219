//! Per-partition offset bookkeeping: which offset may be committed.
//!
//! Invariant: the commit offset is the lowest offset that is received and not yet handled,
//! or, when nothing is outstanding, the next offset the consumer will read. Everything below
//! it was accepted by the dispatcher (or deliberately skipped). Pure and exhaustively tested.

use std::collections::BTreeSet;

/// Tracks outstanding offsets of one partition.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    /// Received and not yet handled.
    outstanding: BTreeSet<i64>,
    /// One past the highest offset received, or the consumer's position when further.
    next: Option<i64>,
    /// What was last handed to the consumer to commit.
    stored: Option<i64>,
}

impl OffsetTracker {
    /// A message at `offset` was received.
    pub fn received(&mut self, offset: i64) {
        let _ = self.outstanding.insert(offset);
        self.advance_next(offset + 1);
    }

    /// The message at `offset` was accepted or deliberately skipped.
    pub fn handled(&mut self, offset: i64) {
        let _ = self.outstanding.remove(&offset);
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

    /// The offset that may be committed now, if any.
    pub fn commit_offset(&self) -> Option<i64> {
        self.outstanding.first().copied().or(self.next)
    }

    /// The commit offset when it moved since the last call; records it as stored.
    pub fn take_new_commit_offset(&mut self) -> Option<i64> {
        let offset = self.commit_offset()?;
        if self.stored.is_some_and(|s| s >= offset) {
            return None;
        }
        self.stored = Some(offset);
        Some(offset)
    }

    /// Messages received and not handled.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_offset_stops_at_the_first_gap() {
        let mut t = OffsetTracker::default();
        assert_eq!(t.commit_offset(), None);
        for o in 10..15 {
            t.received(o);
        }
        assert_eq!(t.commit_offset(), Some(10));
        t.handled(11);
        t.handled(12);
        assert_eq!(t.take_new_commit_offset(), Some(10));
        assert_eq!(t.take_new_commit_offset(), None);
        t.handled(10);
        assert_eq!(t.take_new_commit_offset(), Some(13));
        t.handled(14);
        assert_eq!(t.commit_offset(), Some(13));
        t.handled(13);
        assert_eq!(t.take_new_commit_offset(), Some(15));
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn position_moves_past_control_records_only_when_nothing_is_outstanding() {
        let mut t = OffsetTracker::default();
        t.received(0);
        t.received(1);
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
            offsets.iter().for_each(|o| t.received(*o));
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
