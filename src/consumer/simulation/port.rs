//! A simulated librdkafka behind the [port](crate::consumer::port): one member's consumer
//! over simulated logs, driven by the simulation (its fetcher, its rebalances) and by the
//! shell's calls, on the shell's own thread.
//!
//! What it reproduces of librdkafka 2.12 (`../shared/notes/offsets-and-shell-simulation.md`
//! §2): a position that is none after an assignment and after a seek, and moves to a
//! message's offset + 1 as the message is polled; transaction markers that are never
//! returned but move the position as they are polled; a pause that drops what was fetched
//! beyond the position (a version barrier) and fetches from the position on resume;
//! prefetched messages already in the queue when a pause is decided; a revoke that holds
//! the poll until the application acknowledges it, with pauses and seeks decided meanwhile
//! applied after; commits answered per partition, over-long metadata refused for its
//! partition alone (`OFFSET_METADATA_TOO_LARGE`, the request carrying the last failing
//! partition's error); the queue's eventfd written when an element lands on an empty
//! queue.
//!
//! Unsafe: the eventfd write, through libc.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{OwnedHeaders, OwnedMessage, Timestamp};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::Offset;
use tokio::sync::mpsc;

use crate::consumer::port::{CommitVerdict, KafkaPort, Positions};
use crate::consumer::{AssignedPartition, ConsumerEvent};
use crate::core::simulation::schedule::Rng;
use crate::core::CommitBatch;
use crate::dispatch::event::TopicPartition;

/// The broker's `offset.metadata.max.bytes` (its default).
pub(crate) const METADATA_MAX: usize = 4096;

/// One entry of a simulated log.
#[derive(Clone, Debug)]
pub(crate) enum Entry {
    /// A record, with its key.
    Record(String),
    /// A transaction's commit marker: it takes an offset, and is never returned.
    Marker,
}

/// The cluster's side, shared by the members of a group: the logs and the group's
/// committed offsets.
#[derive(Default)]
pub(crate) struct Cluster {
    /// The topic's name and id.
    pub(crate) topic: String,
    pub(crate) topic_id: String,
    /// Each partition's log.
    pub(crate) logs: Vec<Vec<Entry>>,
    /// The group's committed offset and metadata, per partition.
    pub(crate) committed: BTreeMap<i32, (i64, String)>,
    /// Percent of a commit request's partitions the broker refuses on their own
    /// (`UNKNOWN_TOPIC_OR_PARTITION`, as for a topic being deleted), the others stored.
    pub(crate) refusals: u64,
    /// Draws the refusals.
    pub(crate) rng: Option<Rng>,
    /// Partitions whose topic was created again and whose consumer has not both moved to
    /// the new log's start and committed since: a commit the shell decided for the old log
    /// may land on the new one (Kafka stores offsets by topic name) until then.
    pub(crate) unsettled: std::collections::BTreeSet<i32>,
    /// Of those, the partitions the consumer moved.
    pub(crate) sought: std::collections::BTreeSet<i32>,
    /// Keys whose records carry this many more bytes of value (a large record, for the
    /// connection's byte budget).
    pub(crate) pads: HashMap<String, usize>,
    /// Bumped whenever a log is replaced or cut (the checks read the logs again).
    pub(crate) generation: u64,
    /// The cluster no longer refuses seeks: the faults that last have ended, so that the
    /// schedule's end checks that what waited on them drains (their draws go on, so a
    /// schedule's other draws stay as they were).
    pub(crate) healed: bool,
}

impl Cluster {
    /// The topic is deleted and created again under its name with `logs`: a new id, and
    /// the group's committed offsets of it deleted with it.
    pub(crate) fn recreate(&mut self, id: String, logs: Vec<Vec<Entry>>) {
        self.topic_id = id;
        self.generation += 1;
        self.unsettled = (0..logs.len() as i32).collect();
        self.sought.clear();
        self.logs = logs;
        self.committed.clear();
    }
}

impl Cluster {
    /// Partition `p`'s log is cut to its first `keep` entries (an unclean leader election:
    /// the new leader's log is shorter).
    pub(crate) fn truncate(&mut self, p: usize, keep: usize) {
        self.generation += 1;
        self.logs[p].truncate(keep);
    }
}

/// A partition assigned to the member.
#[derive(Debug)]
struct Part {
    /// The application's position (None: none yet).
    position: Option<i64>,
    /// Where the fetcher reads next.
    fetch_next: i64,
    /// Paused by the application.
    paused: bool,
    /// Bumped by a pause and a seek: queued elements of an older version are stale.
    version: u64,
}

/// An element of the consumer queue: what was fetched, as it was then (a topic deleted
/// since still delivers what was queued of it).
#[derive(Debug)]
struct Elem {
    partition: i32,
    offset: i64,
    version: u64,
    entry: Entry,
}

/// A pause, resume or seek decided while a revoke waits for its acknowledgement.
enum Deferred {
    Flow(bool, Vec<TopicPartition>),
    Seek(TopicPartition, Offset),
}

/// A rebalance for the member to serve at its next poll.
#[derive(Debug, Clone)]
pub(crate) enum Rebalance {
    Assign(Vec<i32>),
    Revoke(Vec<i32>),
}

struct State {
    rng: Rng,
    parts: BTreeMap<i32, Part>,
    queue: VecDeque<Elem>,
    rebalances_due: VecDeque<Rebalance>,
    /// A revoke served, until the application acknowledges it.
    awaiting_ack: Option<(Vec<i32>, std_mpsc::Receiver<()>)>,
    /// The application released that revoke (acknowledged it, or dropped its
    /// acknowledgement), seen by [`SimPort::revoke_held`] before the poll that ends it.
    released: bool,
    deferred: Vec<Deferred>,
    rebalances: u64,
    wake_fd: Option<RawFd>,
    closing: bool,
    /// Most elements the fetcher keeps queued per partition.
    prefetch: usize,
    /// The last version given out (versions are never reused).
    versions: u64,
    /// librdkafka said something that may mean a topic changed identity (its
    /// `take_identity_check`).
    identity_hint: bool,
    /// The next poll panics (as rust-rdkafka does reading commit metadata that is not
    /// UTF-8 in a rebalance callback, or any panic in a callback or a poll round).
    panic_next: bool,
    /// A broken librdkafka, for the checks' non-vacuity test: a revoke leaves what was
    /// queued for its partitions, and an assignment reuses their versions.
    stale_after_revoke: bool,
    /// A broken librdkafka, for the liveness check's non-vacuity test: a resume is ignored.
    never_resumes: bool,
    /// Percent of seeks that fail unapplied (librdkafka's seek timed out waiting for the
    /// partition's fetcher, or the partition was not in a state to move).
    seek_refusals: u64,
    /// The topic was deleted and librdkafka has not noticed yet: its fetches fail (it
    /// fetches by topic id), nothing new is queued, and it has not hinted yet.
    deleted: bool,
}

/// One member's simulated consumer (a handle: its clones are the same consumer).
#[derive(Clone)]
pub(crate) struct SimPort {
    cluster: Arc<Mutex<Cluster>>,
    state: Arc<Mutex<State>>,
    events: mpsc::Sender<ConsumerEvent>,
    /// What the consumer did, in order: polls, pauses, resumes, seeks, commits, rebalances.
    trace: Arc<Mutex<Vec<String>>>,
}

impl SimPort {
    /// A member's consumer of `cluster`, drawing its choices from `seed`; rebalance
    /// callbacks go to `events`, as the connector context's do.
    pub(crate) fn new(
        cluster: Arc<Mutex<Cluster>>,
        seed: u64,
        events: mpsc::Sender<ConsumerEvent>,
    ) -> Self {
        let mut rng = Rng(seed);
        let prefetch = 1 + rng.below(40) as usize;
        Self {
            cluster,
            state: Arc::new(Mutex::new(State {
                rng,
                parts: BTreeMap::new(),
                queue: VecDeque::new(),
                rebalances_due: VecDeque::new(),
                awaiting_ack: None,
                released: false,
                deferred: Vec::new(),
                rebalances: 0,
                wake_fd: None,
                closing: false,
                prefetch,
                versions: 0,
                identity_hint: false,
                panic_next: false,
                stale_after_revoke: false,
                never_resumes: false,
                seek_refusals: 0,
                deleted: false,
            })),
            events,
            trace: Arc::default(),
        }
    }

    /// What the consumer did so far, a line per call that changed something.
    pub(crate) fn trace(&self) -> Vec<String> {
        self.trace
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Notes `line` in the trace; printed too when `TESSEL_SHELL_SIM_TRACE` is set (to follow
    /// one seed).
    fn note(&self, line: std::fmt::Arguments<'_>) {
        static PRINT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *PRINT.get_or_init(|| std::env::var_os("TESSEL_SHELL_SIM_TRACE").is_some()) {
            eprintln!("{line}");
        }
        self.trace
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(line.to_string());
    }

    /// This consumer, broken: it delivers records queued before a revoke after the next
    /// assignment (see `the_checks_catch_a_consumer_that_skips_records`).
    pub(crate) fn with_stale_queue_after_revoke(self) -> Self {
        self.state().stale_after_revoke = true;
        self
    }

    /// This consumer, broken: it ignores resumes (see
    /// `the_liveness_check_catches_a_consumer_that_never_resumes`).
    pub(crate) fn with_resumes_ignored(self) -> Self {
        self.state().never_resumes = true;
        self
    }

    /// This consumer's seeks fail unapplied `percent` of the time.
    pub(crate) fn with_seek_refusals(self, percent: u64) -> Self {
        self.state().seek_refusals = percent;
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cluster(&self) -> std::sync::MutexGuard<'_, Cluster> {
        self.cluster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Has the member serve `rebalance` at a later poll (the coordinator's decision).
    pub(crate) fn rebalance(&self, rebalance: Rebalance) {
        let mut s = self.state();
        s.rebalances_due.push_back(rebalance);
        wake_if_empty(&s, true);
    }

    /// The cluster deleted the topic and created it again: a fetch position past the new
    /// log's end is out of range and goes back to its beginning (`auto.offset.reset` is
    /// `earliest`), one within it reads on in the new log; what was queued before is still
    /// delivered. librdkafka hints at it before it returns any record of the new log: it
    /// fetches by topic id (Kafka 3.1 on), so its next fetch is refused and its metadata
    /// refresh reads the new id.
    pub(crate) fn topic_recreated(&self) {
        let ends: Vec<i64> = self.cluster().logs.iter().map(|l| l.len() as i64).collect();
        let mut s = self.state();
        s.identity_hint = true;
        s.deleted = false;
        for (p, part) in &mut s.parts {
            if part.fetch_next > ends[*p as usize] {
                part.fetch_next = 0;
            }
        }
        self.note(format_args!("topic recreated"));
    }

    /// The next poll panics, inside the consumer (a callback or the poll round).
    pub(crate) fn panic_at_next_poll(&self) {
        self.state().panic_next = true;
    }

    /// A log was cut ([`Cluster::truncate`]): a fetch position past its new end is out of
    /// range and goes back to its beginning (`auto.offset.reset` is `earliest`); what was
    /// queued before is still delivered. librdkafka logs the reset in its `topic` debug
    /// context, which the connector reads as a hint.
    pub(crate) fn log_truncated(&self) {
        let ends: Vec<i64> = self.cluster().logs.iter().map(|l| l.len() as i64).collect();
        let mut s = self.state();
        let mut reset = false;
        for (p, part) in &mut s.parts {
            if part.fetch_next > ends[*p as usize] {
                part.fetch_next = 0;
                reset = true;
            }
        }
        s.identity_hint |= reset;
        self.note(format_args!("log truncated"));
    }

    /// The cluster deleted the topic (and created it again) before librdkafka noticed: until
    /// [`Self::topic_recreated`] (its next fetch, within `fetch.wait.max.ms`) no fetch
    /// succeeds and no hint is given, while what was queued is still delivered and the
    /// shell's commits of the old log's progress land on the new topic (Kafka keeps a
    /// group's offsets by topic name). An assignment meanwhile starts at the group's commit.
    pub(crate) fn topic_deleted(&self) {
        self.state().deleted = true;
        self.note(format_args!("topic deleted, not noticed yet"));
    }

    /// The partitions assigned now.
    pub(crate) fn assigned(&self) -> Vec<i32> {
        self.state().parts.keys().copied().collect()
    }

    /// The partitions assigned once the member served every rebalance given to it: an
    /// assignment queued and not served yet is the member's too (librdkafka hands it to the
    /// application before any later revoke).
    pub(crate) fn assigned_when_served(&self) -> Vec<i32> {
        let s = self.state();
        let mut parts: std::collections::BTreeSet<i32> = s.parts.keys().copied().collect();
        for r in &s.rebalances_due {
            match r {
                Rebalance::Assign(ps) => parts.extend(ps),
                Rebalance::Revoke(ps) => ps.iter().for_each(|p| {
                    parts.remove(p);
                }),
            }
        }
        parts.into_iter().collect()
    }

    /// Whether a revoke waits for the application.
    pub(crate) fn revoking(&self) -> bool {
        self.state().awaiting_ack.is_some()
    }

    /// The partitions of the revoke the application has not released yet (its rebalance
    /// callback still waits), if one waits; the simulation asks every step. Once released,
    /// the revoke ends at the next poll, which this wakes: librdkafka's poll, blocked in the
    /// callback, goes on at once (a quiet poll task would otherwise poll again only after
    /// seconds, and the group's rebalance would wait for it meanwhile).
    pub(crate) fn revoke_held(&self) -> Option<Vec<i32>> {
        let mut s = self.state();
        let s = &mut *s;
        let (ps, done) = s.awaiting_ack.as_ref()?;
        if !s.released {
            s.released = !matches!(done.try_recv(), Err(std_mpsc::TryRecvError::Empty));
            if s.released {
                wake_if_empty(s, true);
            }
        }
        (!s.released).then(|| ps.clone())
    }

    /// Which consumer this is (its clones are the same one).
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.state) as usize
    }

    /// Whether every rebalance given to the member was served and acknowledged.
    pub(crate) fn rebalanced(&self) -> bool {
        let s = self.state();
        s.awaiting_ack.is_none() && (s.rebalances_due.is_empty() || s.closing)
    }

    /// Whether the application closed the consumer (it left the group).
    pub(crate) fn closed(&self) -> bool {
        self.state().closing
    }

    /// One turn of the fetcher: some unpaused partitions get some of their next entries.
    pub(crate) fn fetch(&self) {
        let cluster = self.cluster();
        let mut s = self.state();
        if s.awaiting_ack.is_some() || s.deleted {
            return;
        }
        let was_empty = s.queue.is_empty();
        // A fetch past the log's end (cut while the partition was paused, or after the
        // position went back to it on a pause) is out of range: librdkafka resets the
        // position to the beginning (`auto.offset.reset` is `earliest`) and says so.
        let mut reset = false;
        for (p, part) in &mut s.parts {
            if !part.paused && part.fetch_next > cluster.logs[*p as usize].len() as i64 {
                part.fetch_next = 0;
                reset = true;
            }
        }
        if reset {
            s.identity_hint = true;
            self.note(format_args!("fetch out of range: reset to the beginning"));
        }
        let candidates: Vec<i32> = s
            .parts
            .iter()
            .filter(|(p, part)| {
                !part.paused && (part.fetch_next as usize) < cluster.logs[**p as usize].len()
            })
            .map(|(p, _)| *p)
            .collect();
        if candidates.is_empty() {
            return;
        }
        let p = candidates[s.rng.below(candidates.len() as u64) as usize];
        let queued = s.queue.iter().filter(|e| e.partition == p).count();
        let room = s.prefetch.saturating_sub(queued);
        let n = 1 + s.rng.below(room.max(1) as u64) as usize;
        let end = cluster.logs[p as usize].len() as i64;
        let part = s.parts.get_mut(&p).expect("a candidate is assigned");
        let (from, version) = (part.fetch_next, part.version);
        let to = (from + n as i64).min(end);
        part.fetch_next = to;
        for offset in from..to {
            s.queue.push_back(Elem {
                partition: p,
                offset,
                version,
                entry: cluster.logs[p as usize][offset as usize].clone(),
            });
        }
        wake_if_empty(&s, was_empty);
    }

    /// Serves the next rebalance if the application can take its event now.
    fn serve_rebalance(&self, s: &mut State) -> bool {
        let Some(rebalance) = s.rebalances_due.front().cloned() else {
            return false;
        };
        if s.closing {
            s.rebalances_due.clear();
            return false;
        }
        let tps = |ps: &[i32], topic: &str| -> Vec<TopicPartition> {
            ps.iter()
                .map(|p| TopicPartition {
                    topic: topic.to_owned(),
                    partition: *p,
                })
                .collect()
        };
        match rebalance.clone() {
            Rebalance::Assign(ps) => {
                let cluster = self.cluster();
                let assigned: Vec<AssignedPartition> = tps(&ps, &cluster.topic)
                    .into_iter()
                    .map(|tp| {
                        let c = cluster.committed.get(&tp.partition);
                        AssignedPartition {
                            committed: c.map(|(o, _)| *o),
                            metadata: c.map(|(_, m)| m.clone()).unwrap_or_default(),
                            topic_id: Some(Arc::from(cluster.topic_id.as_str())),
                            tp,
                        }
                    })
                    .collect();
                if self
                    .events
                    .try_send(ConsumerEvent::Assigned(assigned))
                    .is_err()
                {
                    return false;
                }
                for p in &ps {
                    let end = cluster.logs[*p as usize].len() as i64;
                    // A committed offset past the log's end (cut since) is out of range.
                    let start = cluster.committed.get(p).map_or(0, |(o, _)| *o);
                    let start = if (0..=end).contains(&start) { start } else { 0 };
                    if !s.stale_after_revoke {
                        s.versions += 1;
                    }
                    let version = s.versions;
                    s.parts.insert(
                        *p,
                        Part {
                            position: None,
                            fetch_next: start,
                            paused: false,
                            version,
                        },
                    );
                }
            }
            Rebalance::Revoke(ps) => {
                let ps: Vec<i32> = ps.into_iter().filter(|p| s.parts.contains_key(p)).collect();
                if !ps.is_empty() {
                    let (ack, done) = std_mpsc::sync_channel(1);
                    let topic = self.cluster().topic.clone();
                    let event = ConsumerEvent::Revoked {
                        partitions: tps(&ps, &topic),
                        lost: false,
                        ack,
                    };
                    if self.events.try_send(event).is_err() {
                        return false;
                    }
                    s.awaiting_ack = Some((ps, done));
                }
            }
        }
        self.note(format_args!("rebalance served: {rebalance:?}"));
        s.rebalances_due.pop_front();
        s.rebalances += 1;
        true
    }

    /// Ends a revoke once the application acknowledged it: the partitions go, and what was
    /// decided meanwhile applies. False while it still waits.
    fn revoke_done(&self, s: &mut State) -> bool {
        let Some((ps, done)) = &s.awaiting_ack else {
            return true;
        };
        if !s.released && matches!(done.try_recv(), Err(std_mpsc::TryRecvError::Empty)) {
            return false;
        }
        // The fetchers stop behind a version barrier: what was queued for these partitions
        // is dropped.
        for p in ps.clone() {
            s.parts.remove(&p);
        }
        let revoked = ps.clone();
        if !s.stale_after_revoke {
            s.queue.retain(|e| !revoked.contains(&e.partition));
        }
        s.awaiting_ack = None;
        s.released = false;
        for d in std::mem::take(&mut s.deferred) {
            match d {
                Deferred::Flow(pause, tps) => flow(s, pause, &tps),
                Deferred::Seek(tp, to) => {
                    let end = self.cluster().logs[tp.partition as usize].len() as i64;
                    seek(s, &tp, to, end);
                }
            }
        }
        true
    }
}

/// Writes the eventfd if the queue was empty (librdkafka writes once per empty-to-ready).
fn wake_if_empty(s: &State, was_empty: bool) {
    if let (true, Some(fd)) = (was_empty, s.wake_fd) {
        let one = 1u64;
        // SAFETY: an 8-byte write to an eventfd the poll task keeps open while it is set.
        let _ = unsafe { libc::write(fd, std::ptr::from_ref(&one).cast(), 8) };
    }
}

fn flow(s: &mut State, pause: bool, tps: &[TopicPartition]) {
    for tp in tps {
        let version = s.versions + 1;
        if let Some(part) = s.parts.get_mut(&tp.partition) {
            if pause && !part.paused {
                // The version barrier: what was fetched beyond the position is dropped and
                // fetched again from the position on resume.
                s.versions = version;
                part.version = version;
                if let Some(position) = part.position {
                    part.fetch_next = position;
                } else {
                    part.fetch_next = part
                        .fetch_next
                        .min(first_queued(&s.queue, tp.partition).unwrap_or(part.fetch_next));
                }
            }
            part.paused = pause;
        }
    }
}

fn first_queued(queue: &VecDeque<Elem>, partition: i32) -> Option<i64> {
    queue
        .iter()
        .filter(|e| e.partition == partition)
        .map(|e| e.offset)
        .min()
}

fn seek(s: &mut State, tp: &TopicPartition, to: Offset, end: i64) {
    let version = s.versions + 1;
    if let Some(part) = s.parts.get_mut(&tp.partition) {
        s.versions = version;
        part.version = version;
        part.position = None;
        part.fetch_next = match to {
            Offset::Beginning => 0,
            Offset::End => end,
            Offset::Offset(o) => o.clamp(0, end),
            _ => part.fetch_next,
        };
    }
}

impl KafkaPort for SimPort {
    const BLOCKS: bool = false;

    fn subscribe(&self, _topics: &[&str]) -> Result<(), KafkaError> {
        Ok(())
    }

    fn poll(&self) -> Option<Result<OwnedMessage, KafkaError>> {
        let mut s = self.state();
        if std::mem::take(&mut s.panic_next) {
            drop(s);
            self.note(format_args!("poll panics"));
            panic!("simulated: a panic in a rebalance callback");
        }
        if !self.revoke_done(&mut s) {
            return None;
        }
        if self.serve_rebalance(&mut s) {
            return None;
        }
        let cluster = self.cluster();
        while let Some(e) = s.queue.pop_front() {
            let Some(part) = s.parts.get_mut(&e.partition) else {
                continue;
            };
            if part.version != e.version {
                continue;
            }
            part.position = Some(e.offset + 1);
            self.note(format_args!("poll {} {}", e.partition, e.offset));
            match &e.entry {
                Entry::Marker => continue,
                Entry::Record(key) => {
                    let pad = "p".repeat(cluster.pads.get(key).copied().unwrap_or(0));
                    let value = format!("{{\"offset\":{},\"pad\":\"{pad}\"}}", e.offset);
                    return Some(Ok(OwnedMessage::new(
                        Some(value.into_bytes()),
                        Some(key.clone().into_bytes()),
                        cluster.topic.clone(),
                        Timestamp::CreateTime(1_700_000_000_000 + e.offset),
                        e.partition,
                        e.offset,
                        Some(OwnedHeaders::new()),
                    )));
                }
            }
        }
        None
    }

    fn queued(&self) -> usize {
        let s = self.state();
        if s.awaiting_ack.is_some() {
            // The poll waits in the revoke callback: nothing more is served.
            return 0;
        }
        s.queue.len() + usize::from(!s.rebalances_due.is_empty() && !s.closing)
    }

    fn wake_on(&self, fd: Option<RawFd>) {
        let mut s = self.state();
        s.wake_fd = fd;
        let ready = !s.queue.is_empty();
        wake_if_empty(&s, ready);
    }

    fn rebalances(&self) -> u64 {
        self.state().rebalances
    }

    fn positions(&self) -> Option<Positions> {
        let s = self.state();
        if s.awaiting_ack.is_some() {
            return None;
        }
        let topic = self.cluster().topic.clone();
        Some(
            s.parts
                .iter()
                .map(|(p, part)| {
                    let tp = TopicPartition {
                        topic: topic.clone(),
                        partition: *p,
                    };
                    (tp, part.position)
                })
                .collect(),
        )
    }

    fn flow(&self, pause: bool, partitions: &[TopicPartition]) -> Result<(), KafkaError> {
        let mut s = self.state();
        self.note(format_args!(
            "{} {partitions:?}{}",
            if pause { "pause" } else { "resume" },
            if s.awaiting_ack.is_some() {
                " (after the revoke)"
            } else {
                ""
            }
        ));
        if !pause && s.never_resumes {
            return Ok(());
        }
        if s.awaiting_ack.is_some() {
            s.deferred.push(Deferred::Flow(pause, partitions.to_vec()));
        } else {
            flow(&mut s, pause, partitions);
        }
        Ok(())
    }

    fn seek(&self, tp: &TopicPartition, to: Offset, _timeout: Duration) -> Result<(), KafkaError> {
        let mut s = self.state();
        let percent = s.seek_refusals;
        if percent > 0 && s.rng.chance(percent) && !self.cluster().healed {
            self.note(format_args!("seek {} {to:?} fails", tp.partition));
            return Err(KafkaError::Seek("Local: Timed out".to_owned()));
        }
        self.note(format_args!("seek {} {to:?}", tp.partition));
        {
            let mut cluster = self.cluster();
            if cluster.unsettled.contains(&tp.partition) {
                cluster.sought.insert(tp.partition);
            }
        }
        if s.awaiting_ack.is_some() {
            s.deferred.push(Deferred::Seek(tp.clone(), to));
        } else {
            let end = self.cluster().logs[tp.partition as usize].len() as i64;
            seek(&mut s, tp, to, end);
        }
        Ok(())
    }

    fn commit(&self, batch: &CommitBatch) -> CommitVerdict {
        let mut cluster = self.cluster();
        let mut request = None;
        let partitions = batch
            .iter()
            .map(|(tp, offset, metadata)| {
                self.note(format_args!(
                    "commit {} {offset} {metadata:?}",
                    tp.partition
                ));
                let refused = match (cluster.refusals, cluster.rng.as_mut()) {
                    (percent @ 1.., Some(rng)) => rng.chance(percent),
                    _ => false,
                };
                let code = if metadata.chars().count() > METADATA_MAX {
                    Some(RDKafkaErrorCode::OffsetMetadataTooLarge)
                } else if refused || tp.partition as usize >= cluster.logs.len() {
                    Some(RDKafkaErrorCode::UnknownTopicOrPartition)
                } else {
                    cluster
                        .committed
                        .insert(tp.partition, (*offset, metadata.clone()));
                    if cluster.sought.contains(&tp.partition) {
                        cluster.unsettled.remove(&tp.partition);
                    }
                    None
                };
                request = code.or(request);
                (tp.clone(), code)
            })
            .collect();
        (request, partitions)
    }

    fn commit_sync(&self, batch: &CommitBatch) -> Result<(), KafkaError> {
        match self.commit(batch).0 {
            Some(code) => Err(KafkaError::ConsumerCommit(code)),
            None => Ok(()),
        }
    }

    fn high_watermark(&self, tp: &TopicPartition, _timeout: Duration) -> Result<i64, KafkaError> {
        Ok(self.cluster().logs[tp.partition as usize].len() as i64)
    }

    fn topic_ids(
        &self,
        topics: &[String],
        _timeout: Duration,
    ) -> Result<BTreeMap<String, Option<String>>, KafkaError> {
        let cluster = self.cluster();
        Ok(topics
            .iter()
            .filter(|t| **t == cluster.topic)
            .map(|t| (t.clone(), Some(cluster.topic_id.clone())))
            .collect())
    }

    fn take_identity_check(&self) -> bool {
        std::mem::take(&mut self.state().identity_hint)
    }

    fn note_error(&self, _error: &KafkaError) {}

    fn take_authorization_refused(&self) -> bool {
        false
    }

    fn brokers_up(&self) -> Option<bool> {
        Some(true)
    }

    fn connect_failure(&self) -> Option<String> {
        None
    }

    fn set_paused_ends(&self, _ends: HashMap<(String, i32), i64>) {}

    fn set_closing(&self) {
        self.state().closing = true;
    }
}
