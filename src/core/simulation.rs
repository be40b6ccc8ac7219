//! Deterministic simulation of the consumer core: several members' [`Core`]s driven, from
//! one seed, against a simulated group coordinator (`simulation/group.rs`) under one of the
//! group protocols ([`Protocol`]: classic with dynamic members, classic with static members
//! (a killed member keeps its partitions until its session expires, a restart within it takes
//! them back in the same generation and fences the old incarnation), or KIP-848's per-member
//! epochs, checked strictly or per partition as KIP-1251 relaxes it), with commits answered
//! late, each member's in the order it sent them and different members' in any order, applied
//! or refused as that protocol's broker does
//! (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID,
//! STALE_MEMBER_EPOCH); partition logs with aborted records; and a dispatcher with latency,
//! 5xx and 429 with Retry-After (the run tries again), keys it answers 5xx while faults last
//! (their runs end only by a drain) and keys it refuses (4xx, or the run panics: dead-lettered
//! under `on_error = "dead_letter"`, held under "block"), so that a batch fails in part; with
//! handovers (a revoke that drains, waits for the commit request out and commits last),
//! orderly stops, kills and restarts at any step. One schedule in three runs a batch trigger.
//! The simulator plays the shell: it hands each core its events and carries out its commands,
//! through the plain [`TestShell`]. At the core's level an answer reduces to a record handled
//! or not, and when; which answer means which is `run::decide` and the error policy,
//! unit-tested there.
//! Invariants are checked after every step:
//!
//! - **no loss**: a committed offset never passes a data record that was not handled (accepted
//!   by the dispatcher, or dead-lettered; "accepted" below means either);
//! - **no move back**: a commit applied for the partition's current owner never lowers the
//!   group's committed offset;
//! - **key order**: the first run of a record starts only after the first runs of every
//!   earlier record of its key in the partition;
//! - **repeats**: runs of records the dispatcher had accepted already are at most, summed over
//!   the kills, the runs in flight at each kill plus the runs the killed member accepted since
//!   its last confirmed commit (an orderly handover or stop repeats nothing);
//! - **bounded**: records waiting per partition and offsets tracked above a gap stay within
//!   their bounds;
//! - **liveness**: once faults stop (no kill or handover, no failing answer), every data record is
//!   accepted and committed within a bounded number of steps. This is what catches a wedge.
//!
//! A failing seed is shrunk (fewer records, fewer steps before the faults stop) and printed;
//! seeds that once failed are kept in [`REGRESSION_SEEDS`]. `scripts/sim N` runs N schedules
//! in a release build (`TESSEL_SIM_SCHEDULES`, `TESSEL_SIM_FIRST_SEED`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::config::Ordering;
use crate::core::partitions::{Limits, Start};
use crate::core::shell::{AssignmentId, Record as _, RunSignal};
use crate::core::testing::{record, TestRecord, TestShell, TestTrigger};
use crate::core::CommitBatch;
use crate::core::{Command, Core};
use crate::dispatch::event::TopicPartition;

/// Seeds that failed once (each fixed since), run first on every `cargo test`.
const REGRESSION_SEEDS: &[u64] = &[
    // A new owner loaded a full gap from the commit metadata and paused before the record at
    // the gap arrived, so it never did (the partition pauses for a full gap only once that
    // record is received).
    18, 24, 34,
    // A refusal for a partition revoked since its request went out held every new run for
    // the hold limit, with nothing left to confirm (such a refusal is ignored).
    626, 811,
    // More runs in flight than the gap bound: the offsets they handled above a full gap
    // overflowed what the next owner keeps of the commit metadata, and an orderly handover
    // repeated them (a trigger's concurrency is now at most the gap bound).
    102702, 104127, 105509, 106706, 107882, 110777,
    // A revoke that gave up on a run at its drain deadline (the run finished and was
    // accepted later, and the next owner ran it again) was not counted in the repeat bound:
    // a gap of the simulator, not of the core.
    1129485, 5727163, 8923594, 9672049,
    // A batch that failed in part left more records handled above the failed one than the
    // commit metadata keeps, and an orderly handover repeated them (a batch's records are now
    // at most the gap bound, as a trigger's runs in flight are).
    20778250, 20806293,
];

const TOPIC: &str = "sim";

/// How long a revoke waits for its runs (simulated milliseconds, one per step).
const DRAIN_TIMEOUT: Duration = Duration::from_millis(300);

mod group;
mod schedule;
use schedule::{LogRecord, Params, Protocol, Rng};

/// A commit request on its way to the coordinator.
struct Request {
    member: usize,
    /// The incarnation of the member that sent it (a restart is a new one).
    incarnation: u64,
    /// The member's generation (under KIP-848, its epoch) when it sent the request.
    generation: u64,
    due: u64,
    /// The member's accepted runs when the request was taken: a confirmation covers them.
    accepted_at_take: u64,
    commits: Vec<(TopicPartition, i64, String)>,
}

/// A run in flight at the dispatcher: one record, or a batch trigger's batch.
struct Run {
    start: Start<TestShell>,
    /// Each record's offset and key, in offset order.
    records: Vec<(i64, u64)>,
    done_at: u64,
}

struct Member {
    alive: bool,
    /// Restarts of this member so far: the coordinator tells incarnations apart (a new
    /// member id; a static member's instance id moves to the new one).
    incarnation: u64,
    /// A dead static member's session: the step it expires at, until which the group keeps
    /// its partitions and applies its commits still on the way.
    expires: Option<u64>,
    /// The group's generation as this member knows it (under KIP-848, the member's epoch).
    generation: u64,
    /// Per owned partition, the generation (epoch) it was assigned at.
    assigned_at: BTreeMap<i32, u64>,
    core: Core<TestShell>,
    /// A handover in progress: the partition revoked and the member it goes to.
    handover: Option<(i32, usize)>,
    trigger: TestTrigger,
    /// Assignments the core told to stop retrying (or abandoned).
    drained: HashSet<AssignmentId>,
    /// Per owned partition: the next offset the consumer fetches, and whether it is paused.
    fetch: BTreeMap<i32, (i64, bool)>,
    runs: Vec<Run>,
    /// Runs this member saw accepted, and how many of them a confirmed commit covers.
    accepted: u64,
    covered: u64,
}

/// What broke an invariant, with the step it broke at.
#[derive(Debug)]
struct Violation(String);

struct Sim {
    p: Params,
    rng: Rng,
    step: u64,
    base: Instant,
    logs: Vec<Vec<LogRecord>>,
    /// The group: generation, each partition's committed offset and metadata and owner.
    generation: u64,
    committed: Vec<(i64, String)>,
    owner: Vec<Option<usize>>,
    requests: VecDeque<Request>,
    members: Vec<Member>,
    /// Dispatcher: handled (partition, offset), accepted or dead-lettered, and runs per
    /// offset.
    accepted: HashSet<(i32, i64)>,
    runs_of: HashMap<(i32, i64), u32>,
    /// Data records in the logs.
    data: usize,
    /// Per partition, the lowest data offset not accepted (the no-loss bound).
    first_unaccepted: Vec<i64>,
    /// Per partition and key, the data offsets whose first run has not started, in order.
    not_started: HashMap<(i32, u64), BTreeSet<i64>>,
    /// Keys the dispatcher answers 5xx while faults last: retried for ever (unlimited
    /// retries), so a run holding one ends only by a drain.
    parked: HashSet<u64>,
    /// Keys the dispatcher refuses (4xx), or whose run panics, while faults last: a failure,
    /// so `on_error` applies (see [`Params::dead_letter`]).
    rejected: HashSet<u64>,
    /// The dispatcher's answers, drawn from their own stream (adding them changed no other
    /// draw of a seed).
    answers: Rng,
    /// Which of several members' due requests the coordinator applies first, likewise.
    coordinator: Rng,
    faults: bool,
    /// Runs started for records the dispatcher had accepted already, and what the kills so
    /// far allow of them.
    repeats: u64,
    repeat_bound: u64,
    /// How often each refusal, membership event and dispatcher answer happened.
    seen: BTreeMap<&'static str, u64>,
}

impl Sim {
    fn new(p: Params) -> Self {
        let mut rng = Rng(p.seed);
        let logs = (0..p.partitions)
            .map(|_| {
                (0..p.records)
                    .map(|_| LogRecord {
                        key: rng.below(p.keys),
                        data: !rng.chance(8),
                    })
                    .collect()
            })
            .collect();
        let parked = (0..p.keys).filter(|_| rng.chance(20)).collect();
        let mut answers = Rng(p.seed ^ 0x0D15);
        let rejected = (0..p.keys).filter(|_| answers.chance(15)).collect();

        let members = (0..p.members).map(|_| Self::member(&p, 0)).collect();
        let mut sim = Self {
            p,
            rng,
            step: 0,
            base: Instant::now(),
            logs,
            generation: 0,
            committed: vec![(-1, String::new()); p.partitions as usize],
            owner: vec![None; p.partitions as usize],
            requests: VecDeque::new(),
            members,
            accepted: HashSet::new(),
            runs_of: HashMap::new(),
            data: 0,
            first_unaccepted: vec![0; p.partitions as usize],
            not_started: HashMap::new(),
            parked,
            rejected,
            answers,
            coordinator: Rng(p.seed ^ 0xC00D),
            faults: true,
            repeats: 0,
            repeat_bound: 0,
            seen: BTreeMap::new(),
        };
        sim.index_logs();
        for part in 0..p.partitions {
            let m = part as usize % p.members;
            sim.assign(part, m);
        }
        sim
    }

    /// What the invariants need of the logs: the data records per key, and their count.
    fn index_logs(&mut self) {
        self.not_started.clear();
        for (part, log) in self.logs.iter().enumerate() {
            for (o, r) in log.iter().enumerate().filter(|(_, r)| r.data) {
                let _ = self
                    .not_started
                    .entry((part as i32, r.key))
                    .or_default()
                    .insert(o as i64);
            }
        }
        self.data = self.logs.iter().flatten().filter(|r| r.data).count();
        self.first_unaccepted = vec![0; self.logs.len()];
        for part in 0..self.logs.len() {
            self.advance_first_unaccepted(part as i32);
        }
    }

    fn member(p: &Params, generation: u64) -> Member {
        Member {
            alive: true,
            incarnation: 0,
            expires: None,
            generation,
            assigned_at: BTreeMap::new(),
            core: Core::new(
                Limits {
                    per_partition: p.per_partition,
                    max_bytes: usize::MAX / 2,
                    max_tracked_above: p.max_tracked_above,
                },
                Duration::from_millis(10),
                Duration::from_secs(30),
                DRAIN_TIMEOUT,
            ),
            handover: None,
            trigger: TestTrigger::new(p.concurrency),
            drained: HashSet::new(),
            fetch: BTreeMap::new(),
            runs: Vec::new(),
            accepted: 0,
            covered: 0,
        }
    }

    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.step)
    }

    fn tp(part: i32) -> TopicPartition {
        TopicPartition {
            topic: TOPIC.to_owned(),
            partition: part,
        }
    }

    /// Runs the schedule to its end; returns the repeats and their bound.
    fn run(mut self) -> Result<(u64, u64), Violation> {
        let fault_steps = self.p.fault_steps as u64;
        // Enough for every record to be fetched, run and committed after the faults.
        let limit = fault_steps + 400 + 40 * self.p.records as u64 * self.p.partitions as u64;
        while self.step < limit {
            self.step += 1;
            if self.faults && self.step > fault_steps {
                self.stop_faults();
            }
            self.expire_sessions();
            self.one_step()?;
            self.check()?;
            if !self.faults && self.all_done() {
                return Ok((self.repeats, self.repeat_bound));
            }
        }
        Err(Violation(format!(
            "liveness: not every record accepted and committed {} steps after the faults stopped (committed {:?}, accepted {} of {}){}",
            limit - fault_steps,
            self.committed.iter().map(|c| c.0).collect::<Vec<_>>(),
            self.accepted.len(),
            self.data,
            self.dump(),
        )))
    }

    /// The members' state, for a violation's report.
    fn dump(&self) -> String {
        let mut out = String::new();
        for (i, m) in self.members.iter().enumerate() {
            out.push_str(&format!(
                "\n  member {i}: alive {} generation {} (group {}) runs {:?} commit out {} refused {}",
                m.alive,
                m.generation,
                self.generation,
                m.runs
                    .iter()
                    .map(|r| (r.start.msg.partition(), r.records[0].0, r.records.len()))
                    .collect::<Vec<_>>(),
                m.core.commit_out(),
                m.core.refusing().is_some(),
            ));
            for p in m.core.partitions().iter() {
                out.push_str(&format!(
                    "\n    partition {}: waiting {} in flight {} paused {} commit offset {:?} fetch {:?} above {}",
                    p.tp.partition,
                    p.queue.waiting(),
                    p.queue.in_flight(),
                    p.paused,
                    p.tracker.commit_offset(),
                    m.fetch.get(&p.tp.partition),
                    p.tracker.handled_above(),
                ));
            }
        }
        out.push_str(&format!("\n  owners {:?}", self.owner));
        out
    }

    fn one_step(&mut self) -> Result<(), Violation> {
        let m = self.rng.below(self.members.len() as u64) as usize;
        match self.rng.below(100) {
            0..=29 => self.fetch(m),
            30..=59 => self.complete(m),
            60..=69 => self.commit_flow(m),
            70..=79 => self.deliver_request(),
            80..=83 if self.faults => self.handover(),
            84..=85 if self.faults => self.kill(m),
            86..=87 if self.faults => self.restart(m),
            88 if self.faults => self.stop(m),
            _ => {}
        }
        self.process(m)?;
        Ok(())
    }

    /// The consumer of member `m` returns a few records of an owned, unpaused partition.
    fn fetch(&mut self, m: usize) {
        // The shell takes no consumer event while a revoke drains.
        if !self.members[m].alive || self.members[m].core.revoking() {
            return;
        }
        let owned: Vec<i32> = self.members[m]
            .fetch
            .iter()
            .filter(|(_, (_, paused))| !paused)
            .map(|(p, _)| *p)
            .collect();
        if owned.is_empty() {
            return;
        }
        let part = owned[self.rng.below(owned.len() as u64) as usize];
        let n = 1 + self.rng.below(4);
        let (mut next, _) = self.members[m].fetch[&part];
        for _ in 0..n {
            let Some(r) = self.logs[part as usize].get(next as usize).copied() else {
                break;
            };
            if r.data {
                let msg = TestRecord {
                    topic: TOPIC.to_owned(),
                    ..record(part, next, &r.key.to_be_bytes(), 8)
                };
                let _ = self.members[m].core.on_message(msg);
            }
            next += 1;
            // Positions come in order with the messages (aborted records are skipped).
            self.members[m]
                .core
                .on_position(&Self::tp(part), Some(next));
        }
        if let Some(f) = self.members[m].fetch.get_mut(&part) {
            f.0 = next;
        }
    }

    /// Polls member `m`'s core and carries out its commands: runs start, pauses and resumes
    /// apply to its fetches, commit requests go to the coordinator, a finished revoke
    /// commits last and hands its partition over.
    fn process(&mut self, m: usize) -> Result<(), Violation> {
        if !self.members[m].alive {
            return Ok(());
        }
        let now = self.now();
        let mut commands = Vec::new();
        self.members[m].core.poll(now, &mut commands);
        for command in commands {
            match command {
                Command::Start(start) => self.start(m, start)?,
                Command::Commit(commits) => {
                    let due = self.step + 1 + self.rng.below(30);
                    self.requests.push_back(Request {
                        member: m,
                        incarnation: self.members[m].incarnation,
                        generation: self.members[m].generation,
                        due,
                        accepted_at_take: self.members[m].accepted,
                        commits,
                    });
                }
                Command::FinishRevoke(end) => {
                    // Runs still in flight when the drain deadline passed are abandoned: the
                    // next owner dispatches them again, and one the dispatcher accepts late
                    // is then a repeat, as a kill's runs in flight are.
                    self.repeat_bound += end.abandoned as u64;
                    self.finish_revoke(m, &end.partitions, end.commit);
                }
                Command::Signal(RunSignal::Drain(a) | RunSignal::Abandon(a)) => {
                    let _ = self.members[m].drained.insert(a);
                }
                Command::Flow { .. } | Command::Hold(_) => {}
            }
        }
        self.apply_flow(m);
        Ok(())
    }

    /// Pauses and resumes follow the core's partitions' flags (librdkafka applies them).
    fn apply_flow(&mut self, m: usize) {
        let member = &mut self.members[m];
        for p in member.core.partitions().iter() {
            if let Some(f) = member.fetch.get_mut(&p.tp.partition) {
                f.1 = p.paused;
            }
        }
    }

    /// A run starts: the key-order invariant is checked on the first run of each record.
    fn start(&mut self, m: usize, start: Start<TestShell>) -> Result<(), Violation> {
        let part = start.msg.partition();
        let mut records = Vec::with_capacity(1 + start.batch.len());
        for r in std::iter::once(&start.msg).chain(&start.batch) {
            let offset = r.offset();
            let key =
                u64::from_be_bytes(r.key().and_then(|k| k.try_into().ok()).unwrap_or_default());
            // First run of this record: every earlier record of its key ran first (under
            // `key` and `partition` ordering; a batch trigger's are in partition order).
            let unstarted = self.not_started.get_mut(&(part, key));
            if let Some(set) = unstarted.filter(|set| set.contains(&offset)) {
                let first = set.first().copied();
                let _ = set.remove(&offset);
                let ordered = self.p.ordering != Ordering::Unordered || self.p.batch.is_some();
                if ordered && first != Some(offset) {
                    return Err(Violation(format!(
                        "key order: the first run of {part}@{offset} (key {key}) started before {part}@{first:?}'s"
                    )));
                }
            }
            if self.accepted.contains(&(part, offset)) {
                self.repeats += 1;
            }
            records.push((offset, key));
        }
        let latency = 1 + self.rng.below(20);
        self.members[m].runs.push(Run {
            start,
            records,
            done_at: self.step + latency,
        });
        Ok(())
    }

    /// Member `m`'s revoke is complete: its final commit lands (the member's generation is
    /// still the group's: the rebalance waits for it), and the partitions go to the member
    /// the handover chose (or any live one).
    fn finish_revoke(&mut self, m: usize, partitions: &[TopicPartition], commit: CommitBatch) {
        for (tp, offset, metadata) in commit {
            if self.final_commit_applies(m) {
                self.apply_commit(m, &tp, offset, &metadata);
            }
        }
        self.released(m, partitions);
        let target = self.members[m].handover.take();
        for tp in partitions {
            let _ = self.members[m].fetch.remove(&tp.partition);
            let to = match target {
                Some((part, to)) if part == tp.partition && self.members[to].alive => to,
                _ => self.live_member(),
            };
            self.assign(tp.partition, to);
        }
    }

    /// Whether the dispatcher's answer for `key` holds its run until a drain: 5xx retried
    /// for ever, or a refusal (4xx, a panic) under `on_error = "block"`.
    fn held(&self, key: u64) -> bool {
        self.parked.contains(&key) || (!self.p.dead_letter && self.rejected.contains(&key))
    }

    /// The dispatcher answers one of member `m`'s runs that is due. While faults last, an
    /// answer may be a 5xx or a 429 with Retry-After: the run retries later. Each record is
    /// accepted (202, or 409 for one accepted before: the repeats), unless its key is held
    /// (the run retries it, and only a drain ends it; the batch's other records are handled,
    /// a partial failure). A refused record is dead-lettered under `on_error =
    /// "dead_letter"`: handled, as `run::decide` and the error policy decide, unit-tested
    /// there.
    fn complete(&mut self, m: usize) {
        if !self.members[m].alive || self.members[m].runs.is_empty() {
            return;
        }
        let i = self.rng.below(self.members[m].runs.len() as u64) as usize;
        let run = &self.members[m].runs[i];
        if run.done_at > self.step {
            return;
        }
        let held = run.records.iter().any(|(_, k)| self.held(*k));
        let drained = self.members[m].drained.contains(&run.start.assignment());
        if held && !drained {
            return;
        }
        if self.faults && self.answers.chance(10) {
            // 503, or 429 with Retry-After: this attempt failed, the run tries again.
            let retry_after = 1 + self.answers.below(40);
            self.members[m].runs[i].done_at = self.step + retry_after;
            self.saw("dispatcher: retry after a 5xx or a 429");
            return;
        }
        self.finish_run(m, i);
    }

    /// Member `m`'s run `i` ends: each record accepted by the dispatcher or dead-lettered
    /// (handled), or abandoned (its key held and its partition drained).
    fn finish_run(&mut self, m: usize, i: usize) {
        let run = self.members[m].runs.swap_remove(i);
        let part = run.start.msg.partition();
        let mut outcomes = Vec::with_capacity(run.records.len());
        for &(offset, key) in &run.records {
            let handled = !self.held(key);
            if handled && self.rejected.contains(&key) {
                self.saw("dispatcher: refused, dead-lettered");
            }
            if handled {
                self.accept(part, offset);
                self.members[m].accepted += 1;
            }
            outcomes.push((offset, handled));
        }
        let Start {
            id,
            generation,
            key,
            permit,
            ..
        } = run.start;
        drop(permit);
        let _ = self.members[m]
            .core
            .on_run_finished(id, generation, &key, &outcomes);
    }

    /// Member `m`'s core is polled (its commit requests go out when due).
    fn commit_flow(&mut self, m: usize) {
        let _ = self.process(m);
    }

    /// An orderly handover of one partition: its owner's core revokes it (the runs drain,
    /// the commit request out is answered, the final commit goes out); then another member
    /// takes it.
    fn handover(&mut self) {
        let part = self.rng.below(self.p.partitions as u64) as i32;
        let to = self.rng.below(self.members.len() as u64) as usize;
        self.handover_to(part, to);
    }

    /// [`Sim::handover`] of `part` to member `to`: begins the revoke.
    fn handover_to(&mut self, part: i32, to: usize) {
        let Some(from) = self.owner[part as usize] else {
            return;
        };
        let now = self.now();
        let member = &mut self.members[from];
        if !member.alive || member.core.revoking() {
            return;
        }
        member.handover = Some((part, to));
        member.core.on_revoked(now, vec![Self::tp(part)], false);
    }

    /// Member `m` stops in order (SIGTERM): its ops task's request is answered, its
    /// runs end (a parked key's run is abandoned by the drain), it commits for the last time
    /// and leaves the group, whose partitions go to the others.
    fn stop(&mut self, m: usize) {
        if !self.members[m].alive || self.members[m].core.revoking() {
            return;
        }
        self.deliver_all_of(m);
        let now = self.now();
        self.members[m].core.on_stop(now);
        let mut commands = Vec::new();
        self.members[m].core.poll(now, &mut commands);
        while !self.members[m].runs.is_empty() {
            self.step += 1;
            self.finish_run(m, 0);
        }
        let commits = self.members[m].core.stop_commit();
        for (tp, offset, metadata) in commits {
            if self.final_commit_applies(m) {
                self.apply_commit(m, &tp, offset, &metadata);
            }
        }
        self.kill(m);
    }

    /// The dispatcher accepted the record at `offset` of `part`.
    fn accept(&mut self, part: i32, offset: i64) {
        let _ = self.accepted.insert((part, offset));
        *self.runs_of.entry((part, offset)).or_default() += 1;
        self.advance_first_unaccepted(part);
    }

    fn advance_first_unaccepted(&mut self, part: i32) {
        let log = &self.logs[part as usize];
        let first = &mut self.first_unaccepted[part as usize];
        while (*first as usize) < log.len()
            && (!log[*first as usize].data || self.accepted.contains(&(part, *first)))
        {
            *first += 1;
        }
    }

    fn check(&self) -> Result<(), Violation> {
        if self.repeats > self.repeat_bound {
            return Err(Violation(format!(
                "repeats: {} runs of accepted records, more than the {} in flight or accepted and not yet committed at the kills",
                self.repeats, self.repeat_bound
            )));
        }
        for (part, (offset, note)) in self.committed.iter().enumerate() {
            if *offset == i64::MIN {
                return Err(Violation(format!(
                    "move back: partition {part}'s commit {note} by its owner"
                )));
            }
            let first = self.first_unaccepted[part];
            if *offset > first {
                return Err(Violation(format!(
                    "loss: partition {part} committed at {offset} past {first}, never accepted"
                )));
            }
        }
        for m in self.members.iter().filter(|m| m.alive) {
            for p in m.core.partitions().iter() {
                let waiting = p.queue.waiting();
                // A fetch returns at most 4 records after the pause decision.
                if waiting > self.p.per_partition + 4 {
                    return Err(Violation(format!(
                        "bound: {waiting} records wait in partition {}",
                        p.tp.partition
                    )));
                }
                let tracked = p.tracker.handled_above();
                if tracked > 2 * self.p.max_tracked_above + self.p.concurrency {
                    return Err(Violation(format!(
                        "bound: {tracked} offsets tracked above a gap in partition {}",
                        p.tp.partition
                    )));
                }
            }
        }
        Ok(())
    }

    fn all_done(&self) -> bool {
        self.accepted.len() == self.data
            && self
                .committed
                .iter()
                .all(|(o, _)| *o == self.p.records as i64)
    }
}

#[path = "simulation_tests.rs"]
mod tests;
