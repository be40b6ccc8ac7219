//! The consumer core: one connection's decisions as a state machine. Events go in (partitions
//! assigned, revoked or lost, messages and positions, runs finished, commit requests
//! answered, a stop), each through its own small `on_*` method, with the time as an argument;
//! [`Core::poll`] then says what to do, as [`Command`]s: start runs, pause and resume
//! partitions, send a commit request, finish a revoke (its final commit, then the
//! acknowledgement). [`Core::next_wake`] says when to poll again if nothing happens.
//!
//! The core does no I/O, keeps no clock and holds no task, channel, lock or client: the
//! supervisor (the shell) feeds it from the consumer, the runs and the ops task, and
//! carries out its commands. Records, triggers and permits are the shell's types, which the
//! core does not look into ([`Shell`]); what runs already started are to do goes out as a
//! [`RunSignal`]. The simulator
//! (`simulation.rs`) drives the same core against a simulated group coordinator. The parts
//! it joins are pure too: the [partition set](partitions) (what may start, when to
//! pause) and the [`committer`] (the commit rule, docs/architecture.md).

pub mod batch;
pub mod committer;
pub mod offset_codec;
pub mod offsets;
mod partition;
pub mod partitions;
pub mod record_age;
mod scheduler;
pub mod shell;
#[cfg(test)]
pub(crate) mod simulation;
mod starts;
#[cfg(test)]
pub(crate) mod testing;
pub mod types;

use std::time::{Duration, Instant};

use crate::core::committer::{CommitResult, Committer};
use crate::core::partitions::{
    Actions, Arrival, Limits, PartitionId, PartitionSet, PositionMovedBack, Start, TriggerSlot,
};
use crate::core::shell::{RunSignal, Shell};
use crate::core::types::TopicPartition;

/// A newly assigned partition and where the group left it.
#[derive(Debug, Clone)]
pub struct AssignedPartition {
    /// The partition.
    pub tp: TopicPartition,
    /// The committed offset, if any.
    pub committed: Option<i64>,
    /// The commit metadata (see [`offsets`]).
    pub metadata: String,
    /// The topic's id (KIP-516), where the cluster has them.
    pub topic_id: Option<std::sync::Arc<str>>,
}

/// A partition assigned with a group commit made under another topic of the same name
/// (see [`Core::on_assigned`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleCommit {
    /// The partition.
    pub tp: TopicPartition,
    /// The topic id the commit's metadata names.
    pub committed_id: std::sync::Arc<str>,
    /// The topic's id now.
    pub topic_id: std::sync::Arc<str>,
}

/// A commit request: partitions with offsets and metadata.
pub type CommitBatch = Vec<(TopicPartition, i64, String)>;

/// What the shell is to do, in order.
pub enum Command<S: Shell> {
    /// Start this run.
    Start(Start<S>),
    /// Tell the runs of an assignment to stop retrying, or to give up.
    Signal(RunSignal),
    /// Pause fetching these partitions (their buffers are full), or resume them.
    Flow {
        /// Pause (true) or resume (false).
        pause: bool,
        /// The partitions (never empty).
        partitions: Vec<TopicPartition>,
    },
    /// Send this commit request (one at a time: the next comes after its answer, given to
    /// [`Core::on_commit_answer`]).
    Commit(CommitBatch),
    /// A revoke is complete: commit its final state synchronously, then release the
    /// partitions to the group. The core has forgotten them already.
    FinishRevoke(RevokeEnd),
    /// New runs start waiting or start again (rule 4 of the commit rule).
    Hold(HoldChange),
}

/// The end of a revoke.
#[derive(Debug)]
pub struct RevokeEnd {
    /// The partitions revoked.
    pub partitions: Vec<TopicPartition>,
    /// Their final commit (empty for a lost assignment): the latest state of each, after
    /// every earlier request was answered.
    pub commit: CommitBatch,
    /// Runs still in flight when the drain deadline passed (abandoned: offered again to the
    /// next owner).
    pub abandoned: usize,
    /// Partitions whose final commit is withheld: their log was not identified (a topic may
    /// have been deleted and created again), so their offsets may be another topic's. The
    /// next owner runs again what they accepted since their last commit.
    pub withheld: Vec<TopicPartition>,
}

/// A change of the hold on new runs: the broker refuses commits or leaves one unanswered.
#[derive(Debug)]
pub struct HoldChange {
    /// Whether runs wait from now on.
    pub holding: bool,
    /// The broker's last refusal, if it refused.
    pub reason: Option<String>,
    /// The hold ended because it lasted its limit, not because commits got through.
    pub expired: bool,
    /// The one partition whose own commits are refused (None: the whole connection).
    pub partition: Option<TopicPartition>,
}

/// A revoke in progress: its partitions drain until their runs end or the deadline passes.
#[derive(Debug)]
struct Revoke {
    partitions: Vec<TopicPartition>,
    lost: bool,
    deadline: Instant,
}

/// Where a connection's consumer is in its life (as Vector's kafka source has its
/// `ConsumerState`): what may start, and what a revoke or a stop still waits for.
#[derive(Debug, Default)]
enum Lifecycle {
    /// Runs start and commits go out, for whatever is assigned (maybe nothing yet).
    #[default]
    Consuming,
    /// A revoke drains its partitions; the consumer waits in its rebalance callback for
    /// [`Command::FinishRevoke`]. The partitions not revoked go on.
    Revoking(Revoke),
    /// The connection stops: nothing starts but the batches flushed then, retries stop, and
    /// the shell makes the last commit ([`Core::stop_commit`]). A revoke begun before, or by
    /// the consumer's close, may still be draining.
    Stopping(Option<Revoke>),
}

impl Lifecycle {
    fn revoke(&self) -> Option<&Revoke> {
        match self {
            Self::Revoking(r) | Self::Stopping(Some(r)) => Some(r),
            Self::Consuming | Self::Stopping(None) => None,
        }
    }

    fn stopping(&self) -> bool {
        matches!(self, Self::Stopping(_))
    }

    /// A revoke begins (the consumer holds one rebalance callback at a time).
    fn begin_revoke(&mut self, revoke: Revoke) {
        *self = match std::mem::take(self) {
            Self::Consuming | Self::Revoking(_) => Self::Revoking(revoke),
            Self::Stopping(_) => Self::Stopping(Some(revoke)),
        };
    }

    /// The revoke in progress ends.
    fn end_revoke(&mut self) -> Option<Revoke> {
        match std::mem::take(self) {
            Self::Revoking(r) => Some(r),
            Self::Stopping(r) => {
                *self = Self::Stopping(None);
                r
            }
            Self::Consuming => None,
        }
    }

    /// The connection stops, with the revoke in progress if any.
    fn stop(&mut self) {
        *self = match std::mem::take(self) {
            Self::Consuming => Self::Stopping(None),
            Self::Revoking(r) => Self::Stopping(Some(r)),
            Self::Stopping(r) => Self::Stopping(r),
        };
    }
}

/// One connection's consumer state.
pub struct Core<S: Shell> {
    partitions: PartitionSet<S>,
    committer: Committer,
    /// Whether new runs wait for commits to get through (last decided).
    holding: bool,
    /// Partitions whose new runs wait because the broker refuses their own commits (last
    /// decided), with the reason.
    held: std::collections::BTreeMap<TopicPartition, String>,
    lifecycle: Lifecycle,
    /// How long a revoke waits for its runs in flight.
    drain_timeout: Duration,
    /// Commands decided outside [`Core::poll`] (a revoke's flushed batches), handed out by it.
    pending: Vec<Command<S>>,
    /// Reused between polls.
    actions: Actions<S>,
}

impl<S: Shell> Core<S> {
    /// A core with these buffer limits; commits at most every `commit_interval`; new runs
    /// wait at most `hold_limit` for refused commits; a revoke waits at most `drain_timeout`.
    pub fn new(
        limits: Limits,
        commit_interval: Duration,
        hold_limit: Duration,
        drain_timeout: Duration,
    ) -> Self {
        Self {
            partitions: PartitionSet::new(limits),
            committer: Committer::new(commit_interval, hold_limit),
            holding: false,
            held: std::collections::BTreeMap::new(),
            lifecycle: Lifecycle::Consuming,
            drain_timeout,
            pending: Vec::new(),
            actions: Actions::default(),
        }
    }

    /// The partitions, for reports (stalls, lag, health).
    pub fn partitions(&self) -> &PartitionSet<S> {
        &self.partitions
    }

    /// The partitions, for the stall check (it marks progress).
    pub fn partitions_mut(&mut self) -> &mut PartitionSet<S> {
        &mut self.partitions
    }

    /// Whether a revoke is in progress: the shell takes no consumer event meanwhile (the
    /// consumer is inside its rebalance callback, waiting for [`Command::FinishRevoke`]).
    pub fn revoking(&self) -> bool {
        self.lifecycle.revoke().is_some()
    }

    /// Partitions were assigned, each with the trigger that consumes its topic. The shell
    /// resumes them (librdkafka can keep a pause across a revoke and a new assignment).
    ///
    /// Returns the partitions whose group commit was made under another topic of the same
    /// name (its metadata names another topic id: the topic was deleted and created again,
    /// and a commit decided for the old one landed on the new one), with the commit's topic
    /// id and the partition's: each starts as a new log with nothing committed, as a topic
    /// created again while owned does ([`Core::on_topic_id`]), and the shell moves the
    /// consumer to where `auto.offset.reset` says, then calls [`Core::on_sought`].
    pub fn on_assigned(
        &mut self,
        now: Instant,
        assigned: Vec<(AssignedPartition, TriggerSlot<S>)>,
    ) -> Vec<StaleCommit> {
        self.committer.rebalanced();
        let mut stale = Vec::new();
        for (a, trigger) in assigned {
            let tp = a.tp.clone();
            self.partitions.assign(a, trigger, now);
            if let Some((committed_id, topic_id)) = self.partitions.restart_stale_commit(&tp) {
                self.committer.forget(&tp);
                stale.push(StaleCommit {
                    tp,
                    committed_id,
                    topic_id,
                });
            }
        }
        stale
    }

    /// Partitions are being revoked (or were `lost`): their waiting batches go out first
    /// (not when lost), then they drain until their runs end or `drain_timeout` passes.
    pub fn on_revoked(&mut self, now: Instant, partitions: Vec<TopicPartition>, lost: bool) {
        if !lost {
            self.flush_batches(now, Some(&partitions));
        }
        self.partitions.begin_revoke(&partitions, lost);
        self.lifecycle.begin_revoke(Revoke {
            partitions,
            lost,
            deadline: now + self.drain_timeout,
        });
    }

    /// A message arrived. One below what its assignment already received (the consumer's
    /// position moved back) starts the partition's bookkeeping again from it, and its commit
    /// state is forgotten: the commit may now go back to it.
    pub fn on_message(&mut self, msg: S::Record) -> Arrival<S::Record> {
        let arrival = self.partitions.on_message(msg);
        if let Arrival::MovedBack { id, .. } = &arrival {
            if let Some(p) = self.partitions.get(*id) {
                self.committer.forget(&p.tp);
            }
        }
        arrival
    }

    /// The shell read the id of `tp`'s topic (None: the cluster has none, or it could not be
    /// read). When it differs from the partition's, the topic was deleted and created again:
    /// the partition starts again as a new assignment of the new log with nothing committed
    /// (the broker deleted the group's offsets with the topic), its commit state is
    /// forgotten, and true is returned: the shell moves the consumer to where
    /// `auto.offset.reset` says. A partition whose position moved back waits for this before
    /// its records run, and takes the id.
    pub fn on_topic_id(
        &mut self,
        tp: &TopicPartition,
        topic_id: Option<std::sync::Arc<str>>,
    ) -> bool {
        let replaced = self.partitions.verify_topic_id(tp, topic_id);
        if replaced {
            self.committer.forget(tp);
        } else {
            self.committer.resume(tp);
        }
        replaced
    }

    /// The consumer moved `tp` as [`Core::on_topic_id`] asked (it returned true): what
    /// arrives before this was read before the move, and is dropped.
    pub fn on_sought(&mut self, tp: &TopicPartition) {
        self.partitions.on_sought(tp);
    }

    /// The consumer's next-read position of `tp`, after the messages handed over before it.
    /// One behind what the assignment already read (the consumer went back, and read only
    /// markers or aborted records since, or nothing) starts the partition's bookkeeping again
    /// from it, as [`Core::on_message`] does for a message, and is returned.
    pub fn on_position(
        &mut self,
        tp: &TopicPartition,
        position: Option<i64>,
    ) -> Option<PositionMovedBack> {
        let moved = self.partitions.on_position(tp, position)?;
        self.committer.forget(tp);
        Some(moved)
    }

    /// The log of `tp` ends at `end`, below what its assignment `generation` had read when
    /// the end was asked (a paused partition's end, read by the shell's monitor): the log was
    /// cut or replaced while the partition was not fetched, and the consumer's position, past
    /// the end, says nothing until its next fetch. The bookkeeping starts again, as for a
    /// position that moved back, from the end or the commit offset if that is lower
    /// (records of the log's unchanged part handled above it run again), and what arrives
    /// before the consumer was moved there is dropped: the shell moves it to the returned
    /// offset, then calls [`Core::on_sought`].
    pub fn on_log_end(
        &mut self,
        tp: &TopicPartition,
        generation: u64,
        end: i64,
    ) -> Option<PositionMovedBack> {
        let moved = self.partitions.on_log_end(tp, generation, end)?;
        self.committer.forget(tp);
        Some(moved)
    }

    /// A run started by [`Command::Start`] ended: each record's offset and whether it is
    /// handled (accepted, skipped, dead-lettered); `key` is the run's (None for a batch).
    /// Returns false for a run of an earlier assignment (its end changes nothing).
    pub fn on_run_finished(
        &mut self,
        id: PartitionId,
        generation: u64,
        key: &Option<Vec<u8>>,
        records: &[(i64, bool)],
    ) -> bool {
        self.partitions
            .on_run_finished(id, generation, key, records)
            .is_some()
    }

    /// Records of a run come back without an outcome, outside a revoke: they start again,
    /// before the later records of their key (see [`PartitionSet::on_run_returned`]). Call
    /// before [`Core::on_run_finished`] with the run's other records.
    pub fn on_run_returned(
        &mut self,
        id: PartitionId,
        generation: u64,
        key: &Option<Vec<u8>>,
        records: Vec<S::Record>,
    ) -> bool {
        self.partitions
            .on_run_returned(id, generation, key, records)
    }

    /// librdkafka hinted that a topic may have been deleted or created again: nothing runs
    /// or is committed until the topics' ids were read again ([`Core::on_topic_id`]).
    pub fn suspect_topics(&mut self) {
        self.partitions.suspect_topics();
        for p in self.partitions.iter() {
            self.committer.suspend(&p.tp);
        }
    }

    /// A run of the trigger with this index gave its permit back while it waits to retry.
    pub fn on_yielded(&mut self, trigger: usize) {
        self.partitions.wake_starved(trigger);
    }

    /// The answer to the last [`Command::Commit`].
    pub fn on_commit_answer(&mut self, now: Instant, results: &[CommitResult]) {
        self.committer.on_answer(now, results);
    }

    /// The connection stops: batches waiting go out, nothing else starts, retries stop.
    pub fn on_stop(&mut self, now: Instant) {
        self.flush_batches(now, None);
        self.partitions.drain_all();
        self.lifecycle.stop();
    }

    /// The final commit of a stop (after the runs drained and the ops task's last
    /// request was answered), except partitions of a lost assignment in progress.
    pub fn stop_commit(&mut self) -> CommitBatch {
        let lost: Vec<TopicPartition> = match self.lifecycle.revoke() {
            Some(r) if r.lost => r.partitions.clone(),
            _ => Vec::new(),
        };
        let tps: Vec<TopicPartition> = self
            .partitions
            .iter()
            .map(|p| p.tp.clone())
            .filter(|tp| !lost.contains(tp))
            .collect();
        self.final_commits(&tps)
    }

    /// Whether every commit taken so far is confirmed (none is wanted).
    pub fn commits_settled(&self) -> bool {
        self.committer.wanted_count() == 0
    }

    /// Whether a commit request is out without an answer.
    pub fn commit_out(&self) -> bool {
        self.committer.request_out()
    }

    /// Everything that is due at `now`, appended to `out` in order: a revoke's end, a change
    /// of the hold, runs to start, pauses and resumes, and the next commit request.
    pub fn poll(&mut self, now: Instant, out: &mut Vec<Command<S>>) {
        out.append(&mut self.pending);
        self.signal(out);
        self.try_finish_revoke(now, out);
        self.update_hold(now, out);
        // Once stopping, the shell commits for the last time itself (`stop_commit`).
        if !self.lifecycle.stopping() {
            self.process(now, out);
            self.take_commits(now, out);
        }
    }

    /// When [`Core::poll`] next has something to do if no event comes first: a revoke's
    /// deadline, a commit slot or resend, a batch's `max_wait`. Once stopping, only a
    /// revoke's deadline: the stop takes no commit and starts no batch, so a commit slot
    /// already due would stay due, and a shell waiting for it would spin (the shell's
    /// simulation found a stop's drain looping so, seed 3).
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        let revoke = self.lifecycle.revoke().map(|r| r.deadline);
        if self.lifecycle.stopping() {
            return revoke;
        }
        let slot = self
            .partitions
            .commits_pending()
            .then(|| self.committer.next_slot(now))
            .flatten();
        [
            revoke,
            slot,
            self.committer.next_due(now),
            self.partitions.next_batch_due(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The broker's last refusal and since when, while it refuses.
    pub fn refusing(&self) -> Option<(Instant, &str)> {
        self.committer.refusing()
    }

    fn flush_batches(&mut self, now: Instant, tps: Option<&[TopicPartition]>) {
        let mut actions = std::mem::take(&mut self.actions);
        self.partitions.flush_batches(now, tps, &mut actions);
        self.pending
            .extend(actions.starts.drain(..).map(Command::Start));
        self.actions = actions;
    }

    /// Ends the revoke in progress once its runs ended (or its deadline passed) and the
    /// commit request out was answered: a request taken before could otherwise reach the
    /// broker after the final commit and move the offset back.
    fn try_finish_revoke(&mut self, now: Instant, out: &mut Vec<Command<S>>) {
        let Some(r) = self.lifecycle.revoke() else {
            return;
        };
        let in_flight = self.partitions.in_flight_of(&r.partitions);
        let expired = now >= r.deadline;
        if (in_flight > 0 || self.committer.request_out()) && !expired {
            return;
        }
        let Some(r) = self.lifecycle.end_revoke() else {
            return;
        };
        let commit = if r.lost {
            Vec::new()
        } else {
            self.final_commits(&r.partitions)
        };
        let withheld = self.withheld(&r.partitions);
        for tp in &r.partitions {
            let _ = self.partitions.remove(tp);
            self.committer.forget(tp);
        }
        // Runs left at the deadline give up before the final commit goes out.
        self.signal(out);
        out.push(Command::FinishRevoke(RevokeEnd {
            partitions: r.partitions,
            commit,
            abandoned: in_flight,
            withheld,
        }));
    }

    /// Those of `tps` whose log is not identified: no final commit for them.
    pub fn withheld(&self, tps: &[TopicPartition]) -> Vec<TopicPartition> {
        tps.iter()
            .filter(|tp| {
                self.partitions
                    .by_tp(tp)
                    .is_some_and(|p| p.unverified.is_some())
            })
            .cloned()
            .collect()
    }

    fn final_commits(&mut self, tps: &[TopicPartition]) -> CommitBatch {
        tps.iter()
            .filter_map(|tp| {
                let (offset, metadata) = self.partitions.final_commit(tp)?;
                Some((tp.clone(), offset, metadata))
            })
            .collect()
    }

    fn update_hold(&mut self, now: Instant, out: &mut Vec<Command<S>>) {
        self.update_partition_holds(now, out);
        let holding = self.committer.holding(now);
        if holding == self.holding {
            return;
        }
        self.holding = holding;
        self.partitions.set_holding(holding);
        let reason = self.committer.refusing().map(|(_, r)| r.to_owned());
        out.push(Command::Hold(HoldChange {
            holding,
            expired: !holding && reason.is_some(),
            reason,
            partition: None,
        }));
    }

    /// Holds the new runs of each partition whose own commits the broker refuses, and only
    /// those (a deleted topic, a missing permission must not stop the other partitions).
    fn update_partition_holds(&mut self, now: Instant, out: &mut Vec<Command<S>>) {
        let mut refused = self.committer.refused_partitions(now).peekable();
        if refused.peek().is_none() && self.held.is_empty() {
            return;
        }
        let now_held: std::collections::BTreeMap<TopicPartition, String> = refused
            .map(|(tp, reason)| (tp.clone(), reason.to_owned()))
            .collect();
        for (tp, reason) in &now_held {
            if !self.held.contains_key(tp) {
                self.partitions.set_partition_hold(tp, true);
                out.push(Command::Hold(HoldChange {
                    holding: true,
                    reason: Some(reason.clone()),
                    expired: false,
                    partition: Some(tp.clone()),
                }));
            }
        }
        for (tp, reason) in std::mem::take(&mut self.held) {
            if !now_held.contains_key(&tp) {
                self.partitions.set_partition_hold(&tp, false);
                out.push(Command::Hold(HoldChange {
                    holding: false,
                    // Still refused, but held for the limit: runs go on.
                    expired: self.committer.is_wanted(&tp),
                    reason: Some(reason),
                    partition: Some(tp),
                }));
            }
        }
        self.held = now_held;
    }

    fn process(&mut self, now: Instant, out: &mut Vec<Command<S>>) {
        let mut actions = std::mem::take(&mut self.actions);
        self.partitions.process(now, &mut actions);
        out.extend(actions.starts.drain(..).map(Command::Start));
        for (pause, list) in [(true, &mut actions.pause), (false, &mut actions.resume)] {
            if !list.is_empty() {
                let partitions = std::mem::take(list);
                out.push(Command::Flow { pause, partitions });
            }
        }
        self.actions = actions;
    }

    /// The run signals decided since the last poll, as commands.
    fn signal(&mut self, out: &mut Vec<Command<S>>) {
        self.partitions
            .take_signals(|s| out.push(Command::Signal(s)));
    }

    /// Moved commit offsets are taken (their metadata encoded) only when a request may go
    /// out; then whatever is due goes in one request.
    fn take_commits(&mut self, now: Instant, out: &mut Vec<Command<S>>) {
        if self.partitions.commits_pending() && self.committer.can_send(now) {
            let committer = &mut self.committer;
            self.partitions.take_commits(now, |tp, offset, metadata| {
                committer.want(tp.clone(), offset, metadata);
            });
        }
        let due = self.committer.take_due(now);
        if !due.is_empty() {
            out.push(Command::Commit(due));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::shell::Record as _;
    use crate::core::testing::{record, TestRecord, TestShell, TestTrigger};
    use crate::core::types::Ordering;

    const TICK: Duration = Duration::from_millis(10);

    fn tp(p: i32) -> TopicPartition {
        TopicPartition {
            topic: "t".into(),
            partition: p,
        }
    }

    fn msg(p: i32, offset: i64, key: &str) -> TestRecord {
        record(p, offset, key.as_bytes(), 0)
    }

    fn core() -> Core<TestShell> {
        let limits = Limits {
            per_partition: 100,
            max_bytes: 1 << 20,
            max_tracked_above: 100,
            metadata_max_chars: 4096,
        };
        Core::new(
            limits,
            TICK,
            Duration::from_secs(30),
            Duration::from_secs(5),
        )
    }

    /// The slot of a trigger that keeps key order.
    fn key_slot(trigger: &TestTrigger) -> TriggerSlot<TestShell> {
        TriggerSlot {
            index: 0,
            ordering: Ordering::Key,
            runtime: trigger.clone(),
            batch: None,
        }
    }

    /// `core` with partitions 0 and 1 assigned (nothing committed yet).
    fn assigned(now: Instant) -> Core<TestShell> {
        let mut c = core();
        let trigger = TestTrigger::new(8);
        let slots = (0..2)
            .map(|p| {
                let a = AssignedPartition {
                    tp: tp(p),
                    committed: None,
                    metadata: String::new(),
                    topic_id: None,
                };
                (a, key_slot(&trigger))
            })
            .collect();
        c.on_assigned(now, slots);
        c
    }

    #[test]
    fn an_assignment_names_the_partitions_whose_commit_is_an_older_topics() {
        let now = Instant::now();
        let mut c = core();
        let trigger = TestTrigger::new(8);
        let slots = [("tk3:old:7:", 0), ("tk3:new:7:", 1), ("tk2:7:bAQ", 2)]
            .into_iter()
            .map(|(metadata, p)| {
                let a = AssignedPartition {
                    tp: tp(p),
                    committed: Some(7),
                    metadata: metadata.to_owned(),
                    topic_id: Some("new".into()),
                };
                (a, key_slot(&trigger))
            })
            .collect();
        let stale = c.on_assigned(now, slots);
        assert_eq!(
            stale,
            vec![StaleCommit {
                tp: tp(0),
                committed_id: "old".into(),
                topic_id: "new".into(),
            }]
        );
        let stored = |c: &Core<TestShell>, p| {
            c.partitions()
                .by_tp(&tp(p))
                .unwrap()
                .tracker
                .stored_offset()
        };
        assert_eq!(
            (stored(&c, 0), stored(&c, 1), stored(&c, 2)),
            (None, Some(7), Some(7))
        );
        // What arrives before the shell moved the consumer is dropped.
        assert!(matches!(
            c.on_message(msg(0, 7, "a")),
            Arrival::BeforeSeek(_)
        ));
        c.on_sought(&tp(0));
        assert!(matches!(c.on_message(msg(0, 0, "a")), Arrival::Queued(_)));
    }

    fn poll(c: &mut Core<TestShell>, now: Instant) -> Vec<Command<TestShell>> {
        let mut out = Vec::new();
        c.poll(now, &mut out);
        out
    }

    fn starts(out: &mut Vec<Command<TestShell>>) -> Vec<Start<TestShell>> {
        let mut starts = Vec::new();
        out.retain_mut(|c| match c {
            Command::Start(_) => {
                let Command::Start(s) = std::mem::replace(
                    c,
                    Command::Flow {
                        pause: false,
                        partitions: Vec::new(),
                    },
                ) else {
                    unreachable!()
                };
                starts.push(s);
                false
            }
            _ => true,
        });
        starts
    }

    fn commits(out: &[Command<TestShell>]) -> Vec<CommitBatch> {
        out.iter()
            .filter_map(|c| match c {
                Command::Commit(b) => Some(b.clone()),
                _ => None,
            })
            .collect()
    }

    fn finish(c: &mut Core<TestShell>, s: &Start<TestShell>, handled: bool) {
        let records = [(s.msg.offset(), handled)];
        assert!(c.on_run_finished(s.id, s.generation, &s.key, &records));
    }

    fn ok(batch: &CommitBatch) -> Vec<CommitResult> {
        batch
            .iter()
            .map(|(tp, offset, metadata)| CommitResult {
                tp: tp.clone(),
                offset: *offset,
                metadata: metadata.clone(),
                refused: None,
                partition_only: false,
            })
            .collect()
    }

    #[test]
    fn an_accepted_run_is_committed_in_one_request_at_a_time() {
        let t0 = Instant::now();
        let mut c = assigned(t0);
        let _ = c.on_message(msg(0, 0, "a"));
        let _ = c.on_message(msg(0, 1, "b"));
        let mut out = poll(&mut c, t0);
        let runs = starts(&mut out);
        assert_eq!(runs.len(), 2, "different keys run side by side");
        finish(&mut c, &runs[0], true);
        let out = poll(&mut c, t0 + TICK);
        let sent = commits(&out);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0][0].1, 1, "offset 0 accepted: commit 1");
        // The second run ends while the request is out: nothing more goes out until it is
        // answered.
        finish(&mut c, &runs[1], true);
        assert!(commits(&poll(&mut c, t0 + TICK * 3)).is_empty());
        assert!(c.commit_out());
        c.on_commit_answer(t0 + TICK * 3, &ok(&sent[0]));
        let next = commits(&poll(&mut c, t0 + TICK * 4));
        assert_eq!(next[0][0].1, 2);
    }

    #[test]
    fn a_revoke_commits_last_after_its_runs_and_the_request_out() {
        let t0 = Instant::now();
        let mut c = assigned(t0);
        let _ = c.on_message(msg(0, 0, "a"));
        let _ = c.on_message(msg(0, 1, "b"));
        let mut out = poll(&mut c, t0);
        let mut runs = starts(&mut out);
        let second = runs.remove(1);
        finish(&mut c, &runs[0], true);
        let sent = commits(&poll(&mut c, t0 + TICK));
        assert_eq!(sent.len(), 1);
        // Revoked while offset 1 runs and the request for offset 1 is out.
        c.on_revoked(t0 + TICK, vec![tp(0)], false);
        assert!(c.revoking());
        let out = poll(&mut c, t0 + TICK * 2);
        assert!(
            matches!(&out[..], [Command::Signal(RunSignal::Drain(a))] if *a == second.assignment()),
            "the drain stops its retries, and its run is in flight"
        );
        finish(&mut c, &second, true);
        let out = poll(&mut c, t0 + TICK * 3);
        assert!(
            !out.iter().any(|c| matches!(c, Command::FinishRevoke(_))),
            "the request out is answered first"
        );
        c.on_commit_answer(t0 + TICK * 3, &ok(&sent[0]));
        let out = poll(&mut c, t0 + TICK * 4);
        let end = out
            .into_iter()
            .find_map(|c| match c {
                Command::FinishRevoke(end) => Some(end),
                _ => None,
            })
            .expect("the revoke ends");
        assert_eq!(end.partitions, vec![tp(0)]);
        assert_eq!(end.commit, vec![(tp(0), 2, String::new())]);
        assert_eq!(end.abandoned, 0);
        assert!(!c.revoking());
        assert!(c.partitions().by_tp(&tp(0)).is_none(), "forgotten");
        // A late answer for the forgotten partition brings no commit state back.
        c.on_commit_answer(t0 + TICK * 5, &ok(&end.commit));
        assert!(commits(&poll(&mut c, t0 + TICK * 6)).is_empty());
    }

    #[test]
    fn a_lost_assignment_commits_nothing_and_a_revoke_gives_up_on_runs_at_its_deadline() {
        let t0 = Instant::now();
        let mut c = assigned(t0);
        let _ = c.on_message(msg(1, 0, "a"));
        let mut out = poll(&mut c, t0);
        let run = starts(&mut out).remove(0);
        c.on_revoked(t0, vec![tp(1)], true);
        let a = run.assignment();
        let out = poll(&mut c, t0 + Duration::from_secs(1));
        assert!(
            matches!(&out[..], [Command::Signal(RunSignal::Drain(d)), Command::Signal(RunSignal::Abandon(x))] if *d == a && *x == a),
            "a lost partition's attempts are abandoned at once"
        );
        assert_eq!(c.next_wake(t0), Some(t0 + Duration::from_secs(5)));
        let out = poll(&mut c, t0 + Duration::from_secs(5));
        let Some(end) = out.into_iter().find_map(|c| match c {
            Command::FinishRevoke(end) => Some(end),
            _ => None,
        }) else {
            panic!("the deadline ends the revoke");
        };
        assert!(end.commit.is_empty());
        assert_eq!(end.abandoned, 1);
        // The run's end after the revoke changes nothing.
        let records = [(run.msg.offset(), true)];
        assert!(!c.on_run_finished(run.id, run.generation, &run.key, &records));
    }

    /// A core whose first commit (of partition 0's record at 0, run and accepted at `t0`)
    /// the broker refused at `t0 + 2 ticks`.
    fn with_a_refused_commit(t0: Instant) -> Core<TestShell> {
        let mut c = assigned(t0);
        let _ = c.on_message(msg(0, 0, "a"));
        let mut out = poll(&mut c, t0);
        finish(&mut c, &starts(&mut out)[0], true);
        let sent = commits(&poll(&mut c, t0 + TICK)).remove(0);
        let mut refused = ok(&sent);
        refused[0].refused = Some("REBALANCE_IN_PROGRESS".into());
        c.on_commit_answer(t0 + TICK * 2, &refused);
        c
    }

    #[test]
    fn refused_commits_hold_new_runs_until_one_is_confirmed() {
        let t0 = Instant::now();
        let mut c = with_a_refused_commit(t0);
        let _ = c.on_message(msg(0, 1, "b"));
        let mut out = poll(&mut c, t0 + TICK * 2);
        assert!(starts(&mut out).is_empty(), "new runs wait");
        assert!(matches!(&out[..], [Command::Hold(h)] if h.holding && h.reason.is_some()));
        // The refused commit goes again after its backoff and is confirmed.
        let again = commits(&poll(&mut c, t0 + Duration::from_secs(1))).remove(0);
        c.on_commit_answer(t0 + Duration::from_secs(1), &ok(&again));
        let mut out = poll(&mut c, t0 + Duration::from_secs(1));
        assert_eq!(starts(&mut out).len(), 1, "runs start again");
        assert!(out
            .iter()
            .any(|c| matches!(c, Command::Hold(h) if !h.holding && !h.expired)));
    }

    #[test]
    fn a_stop_starts_nothing_new_and_commits_the_latest_state() {
        let t0 = Instant::now();
        let mut c = assigned(t0);
        let _ = c.on_message(msg(0, 0, "a"));
        let mut out = poll(&mut c, t0);
        let run = starts(&mut out).remove(0);
        let _ = c.on_message(msg(0, 1, "b"));
        c.on_stop(t0);
        finish(&mut c, &run, true);
        let out = poll(&mut c, t0 + TICK);
        assert!(
            out.iter()
                .all(|c| matches!(c, Command::Signal(RunSignal::Drain(_)))),
            "retries stop; nothing starts and nothing commits but the last commit"
        );
        assert_eq!(c.stop_commit(), vec![(tp(0), 1, String::new())]);
    }

    #[test]
    fn a_stopping_core_wakes_only_for_a_revokes_deadline() {
        let t0 = Instant::now();
        // A commit refused: it is due again after its backoff.
        let mut c = with_a_refused_commit(t0);
        let resend = c
            .next_wake(t0 + TICK * 2)
            .expect("the refused commit's resend");
        c.on_stop(t0 + TICK * 2);
        // The stop takes no commit: past the resend, a wake for it would be due at once,
        // every time.
        let later = resend + TICK;
        assert_eq!(c.next_wake(later), None);
        let _ = poll(&mut c, later);
        assert_eq!(c.next_wake(later), None);
        // A revoke during the stop still ends at its deadline.
        c.on_revoked(later, vec![tp(1)], false);
        let deadline = c.next_wake(later).expect("the revoke's deadline");
        assert!(deadline > later);
    }
}
