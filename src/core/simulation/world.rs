//! The world outside the group protocol (issue 34): what Kafka and librdkafka do that the
//! coordinator does not, each a fault a schedule may draw (from a stream of its own):
//!
//! - a topic deleted and created again under the same name: a new topic id, a new log of
//!   another length, the group's offsets of it deleted; requests on the way for it refused
//!   (`UNKNOWN_TOPIC_OR_PARTITION`); the consumer goes on at its position in the new log, or,
//!   past the new log's end, resets to its beginning; librdkafka's hint (it fetches by topic
//!   id from Kafka 3.1, so it reads the new id before any record of the new log arrives);
//! - a position that moves back within one log (a reset after an out-of-range fetch, a
//!   truncation), with or without librdkafka's hint;
//! - a partition's own commit refused inside a request that stores the others;
//! - a finite byte budget shared by the partitions;
//! - pauses and resumes applied late: records fetched before a pause still arrive;
//! - runs that end without an outcome outside a revoke (a panic outside an attempt);
//! - the shell's reads of topic ids (every so often, soon after a hint or a move back), and
//!   a dispatcher that remembers idempotency keys: a record run under another topic's key
//!   is answered 409 and never runs.
//!
//! A run that waits to retry gives its permit back ([`crate::core::Core::on_yielded`]), as the
//! daemon's runs do.

use std::collections::HashSet;
use std::sync::Arc;

use super::schedule::Rng;
use super::{Sim, Violation};
use crate::core::partitions::PauseReason;
use crate::core::shell::Shell as _;
use crate::core::testing::{TestShell, TestTrigger};

/// Which of the world's faults a schedule draws.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct World {
    /// Topics are deleted and created again.
    pub(super) recreate: bool,
    /// Positions move back.
    pub(super) resets: bool,
    /// The broker refuses one partition's commit in a request.
    pub(super) partition_refusals: bool,
    /// The connection's byte budget, in records (None: unbounded).
    pub(super) budget: Option<usize>,
    /// Pauses and resumes are applied late.
    pub(super) late_flow: bool,
    /// Runs end without an outcome outside a revoke.
    pub(super) returns: bool,
}

impl World {
    /// Drawn from its own stream: adding it changed no other parameter of a seed.
    pub(super) fn from_seed(seed: u64) -> Self {
        let mut r = Rng(seed ^ 0x3071D);
        Self {
            recreate: r.chance(25),
            resets: r.chance(25),
            partition_refusals: r.chance(30),
            budget: r.chance(40).then(|| 2 + r.below(30) as usize),
            late_flow: r.chance(40),
            returns: r.chance(25),
        }
    }
}

/// The world's state in a schedule.
pub(super) struct WorldState {
    pub(super) rng: Rng,
    /// Per partition, the topic's incarnation: a new one each time it is created again.
    pub(super) incarnation: Vec<u64>,
    /// What the dispatcher remembers: (partition, topic id as the key names it, offset).
    pub(super) keys: HashSet<(i32, Option<Arc<str>>, i64)>,
    /// Per partition: its position moved back in this schedule, so its commits may go lower
    /// (no loss is still checked).
    pub(super) lower_commit_ok: Vec<bool>,
    /// Per partition: steps it has been paused with no held key among its records and
    /// nothing of its own handled.
    pub(super) stuck: Vec<u64>,
    /// Per partition: its owner's commit offset and records handled above it at the last
    /// check (a change is progress).
    pub(super) handled: Vec<(Option<i64>, usize)>,
}

/// Steps a partition may stay paused with no held key among its records, while faults last.
const STUCK_BOUND: u64 = 150;

impl WorldState {
    pub(super) fn new(seed: u64, partitions: usize) -> Self {
        Self {
            rng: Rng(seed ^ 0x0BAD_F00D),
            incarnation: vec![0; partitions],
            keys: HashSet::new(),
            lower_commit_ok: vec![false; partitions],
            stuck: vec![0; partitions],
            handled: vec![(None, 0); partitions],
        }
    }
}

/// The topic id of incarnation `n`.
pub(super) fn topic_id(n: u64) -> Arc<str> {
    Arc::from(format!("id-{n}"))
}

impl Sim {
    /// The world's faults of one step, while faults last, and the shell's reads of topic ids.
    pub(super) fn world_step(&mut self) {
        let w = self.p.world;
        let m = self.world.rng.below(self.members.len() as u64) as usize;
        if self.faults {
            match self.world.rng.below(400) {
                0 if w.recreate => {
                    let part = self.world.rng.below(self.p.partitions as u64) as i32;
                    self.recreate(part);
                }
                1..=2 if w.resets => {
                    let part = self.world.rng.below(self.p.partitions as u64) as i32;
                    self.move_back(part);
                }
                _ => {}
            }
        }
        // The shell reads the topics' ids every so often, and soon while a partition waits
        // for its log to be identified.
        let waiting = self.members[m].alive
            && self.members[m]
                .core
                .partitions()
                .unverified()
                .next()
                .is_some();
        if (waiting && self.world.rng.chance(30)) || self.world.rng.chance(2) {
            self.check_identity(m);
        }
    }

    /// `part`'s topic is deleted and created again: a new log, the group's offsets of it
    /// deleted, requests on the way for it refused; its owner's consumer gets librdkafka's
    /// hint and goes on at its position in the new log, or resets to its beginning past the
    /// new log's end.
    fn recreate(&mut self, part: i32) {
        let i = part as usize;
        self.world.incarnation[i] += 1;
        let len = 1 + self.world.rng.below(2 * self.p.records as u64) as usize;
        let log = (0..len)
            .map(|_| super::LogRecord {
                key: self.world.rng.below(self.p.keys),
                data: !self.world.rng.chance(8),
            })
            .collect();
        self.logs[i] = log;
        self.committed[i] = (-1, String::new());
        self.world.lower_commit_ok[i] = false;
        self.accepted.retain(|(p, _)| *p != part);
        self.runs_of.retain(|(p, _), _| *p != part);
        self.index_partition(part);
        self.saw("world: a topic deleted and created again");
        if let Some(owner) = self.owner[i] {
            let member = &mut self.members[owner];
            if member.alive {
                member.core.suspect_topics();
                if let Some(f) = member.fetch.get_mut(&part) {
                    if f.0 > len as i64 {
                        f.0 = 0;
                    }
                }
            }
        }
    }

    /// `part`'s owner's position moves back to the log's beginning (a reset after an
    /// out-of-range fetch, a truncation), with librdkafka's hint half the time. Its records
    /// from there run again: the accepted ones among them may repeat.
    fn move_back(&mut self, part: i32) {
        let i = part as usize;
        let Some(owner) = self.owner[i] else {
            return;
        };
        if !self.members[owner].alive || self.members[owner].core.revoking() {
            return;
        }
        let Some(pos) = self.members[owner].fetch.get(&part).map(|f| f.0) else {
            return;
        };
        if pos == 0 {
            return;
        }
        // Every record below the old position may run again: the accepted ones, those in
        // flight (abandoned, accepted later) and those waiting (they run before the consumer
        // hands over the moved position's records).
        // And so may those handled above the gap past it (the previous owner's map): the
        // partition's bookkeeping starts again from the moved position, without the map.
        let again = self.logs[i]
            .iter()
            .take(pos as usize)
            .filter(|r| r.data)
            .count();
        let above = self
            .accepted
            .iter()
            .filter(|(p, o)| *p == part && *o >= pos)
            .count();
        self.repeat_bound += (again + above) as u64;
        self.world.lower_commit_ok[i] = true;
        if self.world.rng.chance(50) {
            self.members[owner].core.suspect_topics();
        }
        if let Some(f) = self.members[owner].fetch.get_mut(&part) {
            f.0 = 0;
        }
        self.saw("world: a position moved back");
    }

    /// Member `m`'s final commit of `tps` is withheld (their log not identified): what it
    /// handled of them since the group's commit may run again.
    pub(super) fn withheld(&mut self, m: usize, tps: &[crate::core::types::TopicPartition]) {
        for tp in tps {
            let part = tp.partition;
            let from = self.committed[part as usize].0.max(0);
            let to = self.members[m].fetch.get(&part).map_or(0, |f| f.0);
            let again = (from..to)
                .filter(|o| {
                    self.logs[part as usize]
                        .get(*o as usize)
                        .is_some_and(|r| r.data)
                })
                .count();
            self.repeat_bound += again as u64;
            self.saw("world: a final commit withheld");
        }
    }

    /// The shell reads the topics' ids for member `m`: a partition whose topic was created
    /// again starts afresh, and its consumer moves to the beginning (`auto.offset.reset`).
    pub(super) fn check_identity(&mut self, m: usize) {
        if !self.members[m].alive {
            return;
        }
        let parts: Vec<i32> = self.members[m].fetch.keys().copied().collect();
        for part in parts {
            let id = topic_id(self.world.incarnation[part as usize]);
            if self.members[m].core.on_topic_id(&Self::tp(part), Some(id)) {
                self.saw("world: a new topic id found");
                if let Some(f) = self.members[m].fetch.get_mut(&part) {
                    f.0 = 0;
                }
                // The poll task says it moved the partition, then reads the none librdkafka's
                // seek leaves (a seek is like an assignment), before its next poll. (What it
                // read before the move and still hands over is the shell's simulation's:
                // src/consumer/simulation.rs.)
                self.members[m].core.on_sought(&Self::tp(part));
                self.members[m].core.on_position(&Self::tp(part), None);
            }
        }
    }

    /// Whether the broker refuses `part`'s own commit in a request taken at `incarnation`:
    /// its topic was created again since (a commit of the old topic), or now and then while
    /// faults last.
    pub(super) fn partition_refusal(&mut self, part: i32, incarnation: u64) -> bool {
        if self.world.incarnation[part as usize] != incarnation {
            return true;
        }
        self.faults && self.p.world.partition_refusals && self.world.rng.chance(5)
    }

    /// The dispatcher answers a record of `part` at `offset` (of the topic's `incarnation`),
    /// run under the key naming `label`: a key it remembers is answered 409 (handled, but
    /// the record itself never ran). Returns whether the record now counts as accepted.
    pub(super) fn dispatch(
        &mut self,
        part: i32,
        label: Option<Arc<str>>,
        offset: i64,
        incarnation: u64,
    ) {
        let fresh = self.world.keys.insert((part, label.clone(), offset));
        if fresh && incarnation == self.world.incarnation[part as usize] {
            self.accept(part, offset);
        }
    }

    /// Whether a run that ends now ends without an outcome (its task panicked outside an
    /// attempt): its records come back to the core.
    pub(super) fn run_returns(&mut self) -> bool {
        self.faults && self.p.world.returns && self.world.rng.chance(5)
    }

    /// A run of member `m` that waits to retry gives its permit back (once).
    pub(super) fn yield_permit(&mut self, m: usize, i: usize) {
        let run = &mut self.members[m].runs[i];
        if run.yielded {
            return;
        }
        run.yielded = true;
        let stand_in = TestShell::try_permit(&TestTrigger::new(1)).expect("a permit");
        drop(std::mem::replace(&mut run.start.permit, stand_in));
        let trigger = run.start.trigger_index;
        self.members[m].core.on_yielded(trigger);
    }

    /// A pause the core decided is applied late: one more fetch of the partition may still
    /// deliver records.
    pub(super) fn late(&mut self) -> bool {
        self.p.world.late_flow && self.world.rng.chance(50)
    }

    /// The invariant the world adds: a partition with no held key among its records keeps
    /// making progress while other keys are parked. Checked while faults last: a partition
    /// paused that long with nothing of its own held stopped because of another's.
    pub(super) fn check_world(&mut self) -> Result<(), Violation> {
        if !self.faults {
            return Ok(());
        }
        for part in 0..self.p.partitions {
            let i = part as usize;
            let stuck = self.owner[i].and_then(|m| {
                let member = &self.members[m];
                if !member.alive || member.core.revoking() || member.core.refusing().is_some() {
                    return None;
                }
                let p = member.core.partitions().by_tp(&Self::tp(part))?;
                let pos = member.fetch.get(&part)?.0;
                let held = (self.first_unaccepted[i]..pos).any(|o| {
                    self.logs[i]
                        .get(o as usize)
                        .is_some_and(|r| r.data && self.held(r.key))
                });
                // A run of its own retrying after a 5xx or a 429 holds its key (and the
                // records behind it) for a while: the partition waits for itself.
                // So does a run of its own whose key is held: after its position moved back,
                // the records it holds lie above the position.
                let own_hold = member.runs.iter().any(|r| {
                    r.start.msg.partition == part
                        && (r.retried || r.records.iter().any(|(_, k)| self.held(*k)))
                });
                // Paused by the budget: its own buffer is not full, the connection's is.
                let budget = p.paused == Some(PauseReason::Budget);
                let handled = (p.tracker.commit_offset(), p.tracker.handled_above());
                Some((
                    budget && !held && !own_hold && p.unverified.is_none(),
                    handled,
                ))
            });
            // A partition paused while its own records still run and are handled drains
            // towards its resume (one at a time under partition order): that is progress.
            let progressed = stuck.is_some_and(|(_, h)| h != self.world.handled[i]);
            if let Some((_, h)) = stuck {
                self.world.handled[i] = h;
            }
            if stuck.is_some_and(|(s, _)| s) && !progressed {
                if self.world.stuck[i] == 0 {
                    self.saw(
                        "world: a partition paused by the byte budget with no key of its own held",
                    );
                }
                self.world.stuck[i] += 1;
            } else {
                self.world.stuck[i] = 0;
            }
            if self.world.stuck[i] > STUCK_BOUND {
                return Err(Violation(format!(
                    "progress: partition {part} paused for {STUCK_BOUND} steps with no held key of its own{}",
                    self.dump()
                )));
            }
        }
        Ok(())
    }
}
