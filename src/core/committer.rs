//! Wanted commits and the broker's answers (pure: no consumer, no clock of its own): rules 2
//! to 4 and 6 of the commit rule, stated once in docs/architecture.md ("The commit rule, in
//! one place"). In short: a commit is wanted when a tracker's commit offset moves; wanted
//! commits go out in one request at a time, at most every `interval`; one stays wanted until
//! the broker confirms that offset and metadata, and a refused one is sent again after a
//! backoff with the latest state; while the broker refuses, or a request has been unanswered
//! for [`UNANSWERED_HOLD`], new runs wait ([`Committer::holding`]) for at most `max_hold`; a
//! revoked partition's commit state is forgotten, so no late answer brings it back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use std::time::Instant;

use crate::core::types::TopicPartition;

/// A wanted commit whose answer never came is sent again after this long.
pub const RESEND_AFTER: Duration = Duration::from_secs(1);

/// A commit request unanswered this long holds new runs like a refusal (the coordinator is
/// gone or the group is between generations).
pub const UNANSWERED_HOLD: Duration = Duration::from_millis(500);

/// First wait before a refused commit is sent again; doubles up to [`RETRY_MAX`].
const RETRY_INITIAL: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
struct Wanted {
    offset: i64,
    metadata: String,
    /// When it was last sent (None: not yet).
    sent_at: Option<Instant>,
    /// Not before this instant (after a refusal).
    not_before: Option<Instant>,
}

/// The broker's answer for one partition's commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitResult {
    /// The partition.
    pub tp: TopicPartition,
    /// The offset committed (or refused).
    pub offset: i64,
    /// Its metadata.
    pub metadata: String,
    /// None when committed; the broker's or librdkafka's reason when refused.
    pub refused: Option<String>,
    /// The refusal concerns this partition alone (its topic is gone, the principal may not
    /// read it, its metadata is over the broker's limit), not the member's standing in the
    /// group: only this partition's runs wait.
    pub partition_only: bool,
}

/// Wanted commits and what the broker said about them.
#[derive(Debug)]
pub struct Committer {
    /// In partition order: a request lists them so, and a seed replays the same requests.
    wanted: BTreeMap<TopicPartition, Wanted>,
    interval: Duration,
    max_hold: Duration,
    last_send: Option<Instant>,
    /// Since when the broker has been refusing commits (no confirmation since).
    refusing_since: Option<Instant>,
    /// Consecutive refusals, for the backoff.
    refusals: u32,
    /// The last refusal's reason, for logs and readiness.
    last_refusal: Option<String>,
    /// Since when the last request is out without an answer (one request at a time).
    in_flight_since: Option<Instant>,
    /// The last offset and metadata confirmed per partition.
    confirmed: BTreeMap<TopicPartition, (i64, String)>,
    /// Partitions whose log is not identified (a topic may have been created again): their
    /// wanted commits wait, and are sent once it is, or forgotten.
    suspended: BTreeSet<TopicPartition>,
    /// Partitions whose commits the broker refuses for reasons of their own, since when and
    /// why: their new runs wait, the others' do not.
    partition_refusals: BTreeMap<TopicPartition, (Instant, String)>,
}

impl Committer {
    /// Sends at most every `interval`; holds new runs for at most `max_hold` while refused.
    pub fn new(interval: Duration, max_hold: Duration) -> Self {
        Self {
            wanted: BTreeMap::new(),
            interval,
            max_hold,
            last_send: None,
            refusing_since: None,
            refusals: 0,
            last_refusal: None,
            in_flight_since: None,
            confirmed: BTreeMap::new(),
            suspended: BTreeSet::new(),
            partition_refusals: BTreeMap::new(),
        }
    }

    /// The tracker of `tp` has a new commit offset.
    pub fn want(&mut self, tp: TopicPartition, offset: i64, metadata: String) {
        let not_before = self.wanted.get(&tp).and_then(|w| w.not_before);
        let _ = self.wanted.insert(
            tp,
            Wanted {
                offset,
                metadata,
                sent_at: None,
                not_before,
            },
        );
    }

    /// `tp` was revoked or lost: its commits are no longer ours to send. With nothing left
    /// to send there is nothing to hold runs for.
    pub fn forget(&mut self, tp: &TopicPartition) {
        let _ = self.wanted.remove(tp);
        let _ = self.confirmed.remove(tp);
        let _ = self.partition_refusals.remove(tp);
        let _ = self.suspended.remove(tp);
        if self.wanted.is_empty() {
            self.refusing_since = None;
            self.refusals = 0;
        }
    }

    /// A rebalance completed (partitions were assigned): the group is stable, commits of
    /// the new generation are accepted. Wanted commits still go out.
    pub fn rebalanced(&mut self) {
        self.refusing_since = None;
        self.refusals = 0;
    }

    /// Whether the commit of `tp` is still wanted (not confirmed).
    pub fn is_wanted(&self, tp: &TopicPartition) -> bool {
        self.wanted.contains_key(tp)
    }

    fn due_at(&self, w: &Wanted, now: Instant) -> Option<Instant> {
        let mut due = match w.sent_at {
            None => self.last_send.map_or(now, |l| l + self.interval),
            Some(sent) => sent + RESEND_AFTER,
        };
        if let Some(l) = self.last_send {
            due = due.max(l + self.interval);
        }
        Some(w.not_before.map_or(due, |nb| nb.max(due)))
    }

    /// When something is next due to be sent, if anything is wanted (and no request is out);
    /// `now` if it is due already.
    pub fn next_due(&self, now: Instant) -> Option<Instant> {
        if self.in_flight_since.is_some() {
            return None;
        }
        self.wanted
            .iter()
            .filter(|(tp, _)| !self.suspended.contains(*tp))
            .filter_map(|(_, w)| self.due_at(w, now))
            .min()
    }

    /// `tp`'s log is not identified (a topic may have been deleted and created again): its
    /// wanted commit is not sent until [`Committer::resume`] (or [`Committer::forget`]).
    pub fn suspend(&mut self, tp: &TopicPartition) {
        let _ = self.suspended.insert(tp.clone());
    }

    /// `tp`'s log is identified as the one it was: its wanted commit may go out.
    pub fn resume(&mut self, tp: &TopicPartition) {
        let _ = self.suspended.remove(tp);
    }

    /// Whether a request may go out now: none is out and the interval since the last passed.
    pub fn can_send(&self, now: Instant) -> bool {
        self.in_flight_since.is_none() && self.last_send.is_none_or(|l| now >= l + self.interval)
    }

    /// `r` was committed: its commit is no longer wanted if it is the latest one, and a
    /// confirmation older than one confirmed before makes that newer one wanted again.
    fn confirm(&mut self, r: &CommitResult) {
        // A partition this member does not hold (never wanted in this assignment, or
        // forgotten on revoke): a late answer, say to the revoke's final commit, must not
        // bring its commit state back, or a later assignment could commit the old offset
        // and metadata again.
        if !self.wanted.contains_key(&r.tp) && !self.confirmed.contains_key(&r.tp) {
            return;
        }
        let confirmed = self
            .wanted
            .get(&r.tp)
            .is_some_and(|w| w.offset == r.offset && w.metadata == r.metadata);
        if confirmed {
            let _ = self.wanted.remove(&r.tp);
        }
        match self.confirmed.get(&r.tp) {
            Some((newer, _)) if *newer > r.offset => self.want_confirmed_again(&r.tp),
            _ => {
                let _ = self
                    .confirmed
                    .insert(r.tp.clone(), (r.offset, r.metadata.clone()));
            }
        }
    }

    /// Whether a request through the consumer is out without an answer. A revoke's final
    /// commit waits for it: a request taken before could otherwise reach the broker after
    /// the final commit and move the offset back.
    pub fn request_out(&self) -> bool {
        self.in_flight_since.is_some()
    }

    /// When the next request may go out (None while one is out: its answer wakes the caller).
    pub fn next_slot(&self, now: Instant) -> Option<Instant> {
        if self.in_flight_since.is_some() {
            return None;
        }
        Some(self.last_send.map_or(now, |l| l + self.interval))
    }

    /// The commits to send now (one request), marked as sent; nothing while a request is out.
    pub fn take_due(&mut self, now: Instant) -> Vec<(TopicPartition, i64, String)> {
        if self.in_flight_since.is_some() || self.last_send.is_some_and(|l| now < l + self.interval)
        {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (tp, w) in &mut self.wanted {
            if self.suspended.contains(tp) {
                continue;
            }
            let due = match w.sent_at {
                None => true,
                Some(sent) => now >= sent + RESEND_AFTER,
            } && w.not_before.is_none_or(|nb| now >= nb);
            if due {
                w.sent_at = Some(now);
                out.push((tp.clone(), w.offset, w.metadata.clone()));
            }
        }
        if !out.is_empty() {
            self.last_send = Some(now);
            self.in_flight_since = Some(now);
        }
        out
    }

    /// The answer to the request [`Committer::take_due`] returned last.
    pub fn on_answer(&mut self, now: Instant, results: &[CommitResult]) {
        self.in_flight_since = None;
        self.on_results(now, results);
    }

    /// Wants the last confirmed commit of `tp` once more, unless a newer one is wanted.
    fn want_confirmed_again(&mut self, tp: &TopicPartition) {
        if self.wanted.contains_key(tp) {
            return;
        }
        if let Some((offset, metadata)) = self.confirmed.get(tp).cloned() {
            let _ = self.wanted.insert(
                tp.clone(),
                Wanted {
                    offset,
                    metadata,
                    sent_at: None,
                    not_before: None,
                },
            );
        }
    }

    /// The broker's answers, per partition. A refusal of the member (a rebalance, an
    /// unknown member, a coordinator move) holds every new run; a partition's own refusal
    /// holds only that partition's.
    fn on_results(&mut self, now: Instant, results: &[CommitResult]) {
        // A refusal for a partition with no commit wanted (forgotten on revoke since the
        // request went out) says nothing of this member's commits now: counting it would hold
        // new runs until `max_hold`, with nothing left to confirm.
        let member_refused = results
            .iter()
            .find(|r| !r.partition_only && self.wanted.contains_key(&r.tp))
            .and_then(|r| r.refused.clone());
        if let Some(reason) = &member_refused {
            self.refusals = self.refusals.saturating_add(1);
            let _ = self.refusing_since.get_or_insert(now);
            self.last_refusal = Some(reason.clone());
        } else if results.iter().any(|r| r.refused.is_none()) {
            self.refusing_since = None;
            self.refusals = 0;
        }
        for r in results {
            match &r.refused {
                None => {
                    let _ = self.partition_refusals.remove(&r.tp);
                    self.confirm(r);
                }
                Some(_) if !self.wanted.contains_key(&r.tp) => {}
                // A partition's own refusal of a commit other than the one wanted now (taken
                // before its log started again, say) says nothing of the one wanted: that
                // one is tried as usual.
                Some(_)
                    if r.partition_only
                        && self
                            .wanted
                            .get(&r.tp)
                            .is_some_and(|w| w.offset != r.offset || w.metadata != r.metadata) => {}
                Some(reason) => {
                    let tries = if r.partition_only {
                        let entry = self
                            .partition_refusals
                            .entry(r.tp.clone())
                            .or_insert_with(|| (now, String::new()));
                        entry.1 = reason.clone();
                        // Backoff from how long the partition has been refused.
                        let refused_for = now.saturating_duration_since(entry.0);
                        1 + (refused_for.as_millis() / RETRY_MAX.as_millis().max(1)) as u32
                    } else {
                        self.refusals
                    };
                    let backoff = RETRY_INITIAL
                        .saturating_mul(1 << tries.clamp(1, 8).saturating_sub(1))
                        .min(RETRY_MAX);
                    let Some(w) = self.wanted.get_mut(&r.tp) else {
                        continue;
                    };
                    // Whatever is wanted now (this commit, or a newer one) waits the backoff
                    // and then goes out with the latest state.
                    w.sent_at = None;
                    w.not_before = Some(now + backoff);
                }
            }
        }
    }

    /// Partitions whose own commits the broker refuses (see [`CommitResult::partition_only`]),
    /// since less than `max_hold`: their new runs wait.
    pub fn refused_partitions(
        &self,
        now: Instant,
    ) -> impl Iterator<Item = (&TopicPartition, &str)> {
        let max_hold = self.max_hold;
        self.partition_refusals
            .iter()
            .filter(move |(_, (since, _))| now.saturating_duration_since(*since) < max_hold)
            .map(|(tp, (_, reason))| (tp, reason.as_str()))
    }

    /// Whether new runs should wait: the broker is refusing commits (or a request has been
    /// unanswered for [`UNANSWERED_HOLD`]), since less than `max_hold`.
    pub fn holding(&self, now: Instant) -> bool {
        let since = match (self.refusing_since, self.in_flight_since) {
            (Some(r), _) => Some(r),
            (None, Some(sent)) if now.saturating_duration_since(sent) >= UNANSWERED_HOLD => {
                Some(sent)
            }
            _ => None,
        };
        since.is_some_and(|since| now.saturating_duration_since(since) < self.max_hold)
    }

    /// Since when commits have been refused, and the last reason.
    pub fn refusing(&self) -> Option<(Instant, &str)> {
        Some((self.refusing_since?, self.last_refusal.as_deref()?))
    }

    /// Partitions with a wanted, unconfirmed commit.
    pub fn wanted_count(&self) -> usize {
        self.wanted.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        TopicPartition {
            topic: "t".into(),
            partition: p,
        }
    }

    fn ok(p: i32, offset: i64) -> CommitResult {
        CommitResult {
            tp: tp(p),
            offset,
            metadata: String::new(),
            refused: None,
            partition_only: false,
        }
    }

    fn refused(p: i32, offset: i64) -> CommitResult {
        CommitResult {
            refused: Some("Broker: Specified group generation id is not valid".into()),
            ..ok(p, offset)
        }
    }

    #[test]
    fn a_partition_refused_on_its_own_holds_only_itself() {
        let mut c = Committer::new(TICK, Duration::from_secs(30));
        let t0 = Instant::now();
        c.want(tp(0), 5, String::new());
        c.want(tp(1), 7, String::new());
        let _ = c.take_due(t0);
        let gone = CommitResult {
            refused: Some("Broker: Unknown topic or partition".into()),
            partition_only: true,
            ..ok(1, 7)
        };
        c.on_answer(t0 + TICK, &[ok(0, 5), gone]);
        assert!(!c.holding(t0 + TICK), "the member is not refused");
        assert!(c.refusing().is_none());
        let held: Vec<i32> = c
            .refused_partitions(t0 + TICK)
            .map(|(tp, _)| tp.partition)
            .collect();
        assert_eq!(held, vec![1]);
        assert!(c.is_wanted(&tp(1)) && !c.is_wanted(&tp(0)));
        // Sent again after its backoff; confirmed, it holds nothing any more.
        let again = c.take_due(t0 + Duration::from_secs(1));
        assert_eq!(again, vec![(tp(1), 7, String::new())]);
        c.on_answer(t0 + Duration::from_secs(1), &[ok(1, 7)]);
        assert_eq!(c.refused_partitions(t0 + Duration::from_secs(1)).count(), 0);
        // The hold of a partition refused for good ends at the limit.
        c.want(tp(2), 1, String::new());
        let t1 = t0 + Duration::from_secs(2);
        let _ = c.take_due(t1);
        let denied = CommitResult {
            refused: Some("Broker: Topic authorization failed".into()),
            partition_only: true,
            ..ok(2, 1)
        };
        c.on_answer(t1, &[denied]);
        assert_eq!(c.refused_partitions(t1).count(), 1);
        assert_eq!(
            c.refused_partitions(t1 + Duration::from_secs(30)).count(),
            0
        );
    }

    #[test]
    fn a_member_refusal_holds_everything_whatever_the_order_of_the_answers() {
        let mut c = Committer::new(TICK, Duration::from_secs(30));
        let t0 = Instant::now();
        c.want(tp(0), 5, String::new());
        c.want(tp(1), 7, String::new());
        let _ = c.take_due(t0);
        c.on_answer(t0 + TICK, &[refused(0, 5), ok(1, 7)]);
        assert!(c.holding(t0 + TICK));
    }

    const TICK: Duration = Duration::from_millis(10);

    #[test]
    fn sends_at_most_every_interval_and_batches_partitions() {
        let mut c = Committer::new(TICK, Duration::from_secs(30));
        let t0 = Instant::now();
        c.want(tp(0), 5, String::new());
        c.want(tp(1), 7, String::new());
        let mut first = c.take_due(t0);
        first.sort_by_key(|x| x.0.partition);
        assert_eq!(
            first,
            vec![(tp(0), 5, String::new()), (tp(1), 7, String::new())]
        );
        c.want(tp(0), 6, String::new());
        assert!(c.take_due(t0 + TICK).is_empty(), "one request at a time");
        assert_eq!(c.next_due(t0), None);
        c.on_answer(t0 + Duration::from_millis(3), &[ok(0, 5), ok(1, 7)]);
        assert!(!c.is_wanted(&tp(1)));
        assert_eq!(c.next_due(t0), Some(t0 + TICK));
        assert!(
            c.take_due(t0 + Duration::from_millis(5)).is_empty(),
            "interval"
        );
        assert_eq!(c.take_due(t0 + TICK), vec![(tp(0), 6, String::new())]);
    }

    #[test]
    fn a_refusal_for_a_revoked_partition_holds_nothing() {
        let mut c = Committer::new(TICK, Duration::from_secs(30));
        let t0 = Instant::now();
        c.want(tp(0), 9, String::new());
        let _ = c.take_due(t0);
        c.forget(&tp(0));
        // The request is refused (the rebalance that revoked it) after the revoke.
        c.on_answer(t0 + TICK, &[refused(0, 9)]);
        assert!(!c.holding(t0 + TICK), "nothing of this member's is refused");
        assert_eq!(c.refusing(), None);
    }

    #[test]
    fn no_commit_state_survives_a_revoke_even_when_an_answer_arrives_after_it() {
        let mut c = Committer::new(TICK, Duration::from_secs(30));
        let t0 = Instant::now();
        c.want(tp(0), 9, "tk1:9:2".into());
        let _ = c.take_due(t0);
        // Revoked: the final commit goes out on its own, the partition is forgotten, and the
        // answer to the last request arrives after that.
        c.forget(&tp(0));
        c.on_answer(t0 + TICK, &[ok(0, 9)]);
        // Assigned again (say the topic was recreated, so the group's commit is now 3): an
        // older answer crossing a newer one must not bring offset 9 back.
        c.want(tp(0), 3, String::new());
        let _ = c.take_due(t0 + TICK * 2);
        c.on_answer(t0 + TICK * 3, &[ok(0, 3)]);
        assert!(!c.is_wanted(&tp(0)));
        assert_eq!(
            c.take_due(t0 + TICK * 4),
            Vec::new(),
            "9 is never committed again"
        );
        assert_eq!(c.next_due(t0), None);
    }

    #[test]
    fn a_confirmed_commit_is_no_longer_wanted_and_an_older_confirmation_changes_nothing() {
        let mut c = Committer::new(TICK, Duration::from_secs(30));
        let t0 = Instant::now();
        c.want(tp(0), 5, String::new());
        let _ = c.take_due(t0);
        c.want(tp(0), 9, String::new());
        c.on_answer(t0, &[ok(0, 5)]);
        assert!(c.is_wanted(&tp(0)), "9 is not confirmed yet");
        let _ = c.take_due(t0 + TICK);
        c.on_answer(t0 + TICK, &[ok(0, 9)]);
        assert!(!c.is_wanted(&tp(0)));
        assert_eq!(c.next_due(t0), None);
    }

    #[test]
    fn a_refused_commit_is_sent_again_with_backoff_until_confirmed_and_holds_new_runs() {
        let mut c = Committer::new(TICK, Duration::from_secs(30));
        let t0 = Instant::now();
        c.want(tp(0), 5, String::new());
        let _ = c.take_due(t0);
        assert!(!c.holding(t0));
        // Refused during a rebalance.
        c.on_answer(t0 + TICK, &[refused(0, 5)]);
        assert!(
            c.holding(t0 + TICK),
            "no new runs while commits are refused"
        );
        assert!(c.take_due(t0 + 2 * TICK).is_empty(), "backoff first");
        let again = t0 + TICK + RETRY_INITIAL;
        assert_eq!(c.take_due(again), vec![(tp(0), 5, String::new())]);
        c.on_answer(again, &[refused(0, 5)]);
        assert!(
            c.take_due(again + RETRY_INITIAL).is_empty(),
            "backoff doubles"
        );
        let third = again + 2 * RETRY_INITIAL;
        // More was accepted meanwhile: the latest state is what goes out.
        c.want(tp(0), 8, "tk1:8:2".into());
        assert_eq!(c.take_due(third), vec![(tp(0), 8, "tk1:8:2".into())]);
        c.on_answer(
            third,
            &[CommitResult {
                metadata: "tk1:8:2".into(),
                ..ok(0, 8)
            }],
        );
        assert!(!c.is_wanted(&tp(0)));
        assert!(!c.holding(third), "the group is stable again");
    }

    #[test]
    fn a_refusal_holds_new_runs_even_when_a_newer_commit_is_wanted_already() {
        let mut c = Committer::new(TICK, Duration::from_secs(30));
        let t0 = Instant::now();
        c.want(tp(0), 4, String::new());
        let _ = c.take_due(t0);
        c.want(tp(0), 5, String::new());
        c.on_answer(t0 + TICK, &[refused(0, 4)]);
        assert!(c.holding(t0 + TICK));
        assert!(
            c.take_due(t0 + 2 * TICK).is_empty(),
            "the newer one waits the backoff"
        );
        assert_eq!(
            c.take_due(t0 + TICK + RETRY_INITIAL),
            vec![(tp(0), 5, String::new())]
        );
    }

    #[test]
    fn an_unanswered_request_holds_new_runs_and_a_hold_ends_after_its_limit() {
        let mut c = Committer::new(TICK, Duration::from_secs(2));
        let t0 = Instant::now();
        c.want(tp(3), 1, String::new());
        assert_eq!(c.take_due(t0).len(), 1);
        assert!(!c.holding(t0 + Duration::from_millis(100)));
        assert!(c.holding(t0 + UNANSWERED_HOLD), "no answer for 500 ms");
        c.on_answer(t0 + RESEND_AFTER, &[refused(3, 1)]);
        assert!(c.holding(t0 + RESEND_AFTER));
        assert!(
            !c.holding(t0 + RESEND_AFTER + Duration::from_secs(2)),
            "the limit"
        );
        c.forget(&tp(3));
        assert_eq!(c.next_due(t0), None);
        assert!(!c.holding(t0 + RESEND_AFTER), "nothing left to commit");
    }
}
