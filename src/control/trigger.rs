//! What operators see of and do to one trigger, shared by its runs, its connection's shell
//! and the API: its target state (running or paused), its parked keys, and its outcomes of
//! the last five minutes.
//!
//! A key is *parked* while a run waits to try its record again after a failed attempt: the
//! run registers itself here ([`TriggerControl::park`]) with what the status shows (key,
//! offset, attempts, since when, the next attempt, the dispatcher's last answer) and keeps a
//! receiver for the operator's [`Directive`]s (retry now, skip); it leaves when its record
//! moves on. The registry is small (one entry per parked run) and its lock is taken only
//! when a run parks, updates, leaves, or the status is read: never per record.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::recent::{LagHistory, LagPoint, RecentOutcomes};

pub use crate::clock::now_ms;

/// Whether a trigger starts runs, as an operator set it.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Runs start (the default).
    #[default]
    Running,
    /// No new run starts; its partitions stay assigned and are not fetched.
    Paused,
}

/// A trigger's target state, as stored and shown: what an operator asked for, who, why and
/// when.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct TargetState {
    /// Running or paused.
    pub state: RunState,
    /// The operator's reason, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The name of the token that set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// When it was set, in milliseconds since the epoch (the later of two wins).
    #[serde(default)]
    pub at_ms: i64,
}

impl TargetState {
    /// Whether the trigger is paused.
    pub fn paused(&self) -> bool {
        self.state == RunState::Paused
    }
}

/// What an operator asks of a parked run.
#[derive(Debug)]
pub enum Directive {
    /// Try the record now rather than at the next backoff.
    RetryNow {
        /// The answer: the run goes on at once.
        reply: oneshot::Sender<Result<ActionOutcome, ActionError>>,
    },
    /// Hand the record at `offset` to the dead-letter topic (or, without one, record it as
    /// skipped) and let its key go on.
    Skip {
        /// The record's offset.
        offset: i64,
        /// Why, as the operator said it (goes into the dead letter and the log).
        reason: String,
        /// The name of the operator's token.
        by: String,
        /// The answer, once the record is handled (or the write failed).
        reply: oneshot::Sender<Result<ActionOutcome, ActionError>>,
    },
}

/// What an action did.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ActionOutcome {
    /// `retrying`, `skipped` (recorded as skipped: the trigger has no dead-letter topic),
    /// `dead_lettered`, `paused`, `resumed`.
    pub outcome: String,
    /// For a dead-lettered record: where the copy was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetterPosition>,
    /// The action had been carried out already (the same skip, the same pause): nothing
    /// changed.
    #[serde(default)]
    pub already: bool,
}

impl ActionOutcome {
    /// An outcome without a dead letter.
    pub fn new(outcome: &str) -> Self {
        Self {
            outcome: outcome.to_owned(),
            dead_letter: None,
            already: false,
        }
    }
}

/// Where a dead letter was written.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DeadLetterPosition {
    /// The dead-letter topic.
    pub topic: String,
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
}

/// Why an action did not take effect.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// Nothing to act on (the record is not parked here).
    #[error("{0}")]
    NotFound(String),
    /// The record is parked but the action could not be carried out (a dead-letter write
    /// that failed); nothing changed.
    #[error("{0}")]
    Failed(String),
    /// The run moved on before it took the directive.
    #[error("the record moved on before the action reached it")]
    Gone,
}

/// A parked run, as the status shows it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ParkedKey {
    /// The partition's topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The record the key is parked at (a batch's first record not handled).
    pub offset: i64,
    /// Every record of the run not handled yet (a batch's; one for a single trigger).
    pub offsets: Vec<i64>,
    /// The key as text (UTF-8), when it is; `key_base64` otherwise; neither for no key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The key, base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_base64: Option<String>,
    /// Attempts made (the one that failed last included).
    pub attempts: u32,
    /// Since when it is parked, in milliseconds since the epoch.
    pub since_ms: i64,
    /// When it is tried again, in milliseconds since the epoch.
    pub next_attempt_ms: i64,
    /// The dispatcher's last HTTP status, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    /// A short, redacted excerpt of the last answer or error (at most 200 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_answer: Option<String>,
    /// What happens next per the trigger's `retry` and `on_error`.
    pub next: String,
    /// The replica it is parked on (set by the status).
    #[serde(default)]
    pub owner: String,
}

/// The key as the status shows it: text, or base64 when not UTF-8.
pub fn shown_key(key: Option<&[u8]>) -> (Option<String>, Option<String>) {
    use base64::Engine as _;
    match key {
        None => (None, None),
        Some(k) => match std::str::from_utf8(k) {
            Ok(s) => (Some(s.to_owned()), None),
            Err(_) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(k)),
            ),
        },
    }
}

/// A parked run's entry.
#[derive(Debug)]
struct Entry {
    key: ParkedKey,
    directives: mpsc::UnboundedSender<Directive>,
}

/// A record: topic, partition, offset.
type RecordId = (String, i32, i64);

/// Operators' skips remembered for idempotent answers: the same skip again answers with what
/// the first did.
const REMEMBERED_SKIPS: usize = 256;

/// One trigger's controls.
#[derive(Debug)]
pub struct TriggerControl {
    connection: String,
    trigger: String,
    paused: AtomicBool,
    target: Mutex<TargetState>,
    parked: Mutex<BTreeMap<u64, Entry>>,
    next_id: AtomicU64,
    recent: Mutex<RecentOutcomes>,
    lag: Mutex<LagHistory>,
    /// Skips carried out: which record and what each did.
    skipped: Mutex<VecDeque<(RecordId, ActionOutcome)>>,
}

impl TriggerControl {
    /// The controls of `trigger` of `connection`, running, nothing parked.
    pub fn new(connection: &str, trigger: &str) -> Self {
        Self {
            connection: connection.to_owned(),
            trigger: trigger.to_owned(),
            paused: AtomicBool::new(false),
            target: Mutex::new(TargetState::default()),
            parked: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            recent: Mutex::new(RecentOutcomes::default()),
            lag: Mutex::new(LagHistory::default()),
            skipped: Mutex::new(VecDeque::new()),
        }
    }

    /// The trigger's name.
    pub fn name(&self) -> &str {
        &self.trigger
    }

    /// Whether an operator paused the trigger: no new run starts.
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// The target state and who set it.
    pub fn target(&self) -> TargetState {
        lock(&self.target).clone()
    }

    /// Applies a target state; returns whether the trigger's state changed (paused or
    /// running).
    pub fn set_target(&self, state: TargetState) -> bool {
        let paused = state.paused();
        *lock(&self.target) = state;
        self.paused.swap(paused, Ordering::SeqCst) != paused
    }

    /// A run parks: its record waits to be tried again. Logged once here, and once when the
    /// run leaves ([`ParkedRun::finish`]).
    pub fn park(self: &std::sync::Arc<Self>, key: ParkedKey) -> ParkedRun {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        tracing::warn!(
            connection = %self.connection, trigger = %self.trigger, topic = %key.topic,
            partition = key.partition, offset = key.offset, key = ?key.key.as_deref().or(key.key_base64.as_deref()),
            attempts = key.attempts, last_status = ?key.last_status,
            last_answer = key.last_answer.as_deref().unwrap_or(""), next = %key.next,
            "key parked: its record waits to be tried again; its later records wait behind it (GET /api/v1/status)"
        );
        let n = {
            let mut parked = lock(&self.parked);
            let _ = parked.insert(
                id,
                Entry {
                    key,
                    directives: tx,
                },
            );
            parked.len()
        };
        crate::telemetry::metrics::parked_keys(&self.connection, &self.trigger, n);
        ParkedRun {
            control: std::sync::Arc::clone(self),
            id,
            directives: rx,
            since: std::time::Instant::now(),
            finished: false,
        }
    }

    /// The parked keys, oldest first.
    pub fn parked(&self) -> Vec<ParkedKey> {
        let mut keys: Vec<ParkedKey> = lock(&self.parked).values().map(|e| e.key.clone()).collect();
        keys.sort_by_key(|k| (k.since_ms, k.topic.clone(), k.partition, k.offset));
        keys
    }

    /// How many keys are parked.
    pub fn parked_count(&self) -> usize {
        lock(&self.parked).len()
    }

    /// Hands `directive` to the run parked at `offset` of `topic`/`partition`; gives it back
    /// when no run of this trigger is parked there.
    pub fn direct(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        directive: Directive,
    ) -> Result<(), Directive> {
        let parked = lock(&self.parked);
        let entry = parked.values().find(|e| {
            e.key.topic == topic && e.key.partition == partition && e.key.offsets.contains(&offset)
        });
        match entry {
            Some(e) => e.directives.send(directive).map_err(|e| e.0),
            None => Err(directive),
        }
    }

    /// What an earlier skip of this record did, if an operator skipped it.
    pub fn skipped(&self, topic: &str, partition: i32, offset: i64) -> Option<ActionOutcome> {
        lock(&self.skipped)
            .iter()
            .find(|((t, p, o), _)| t == topic && *p == partition && *o == offset)
            .map(|(_, outcome)| outcome.clone())
    }

    /// Remembers what a skip did.
    pub fn remember_skip(&self, topic: &str, partition: i32, offset: i64, outcome: &ActionOutcome) {
        let mut skipped = lock(&self.skipped);
        skipped.push_back(((topic.to_owned(), partition, offset), outcome.clone()));
        while skipped.len() > REMEMBERED_SKIPS {
            let _ = skipped.pop_front();
        }
    }

    /// `n` records of the trigger ended with `outcome` (a label of
    /// [`crate::run::WorkOutcome`]).
    pub fn count(&self, outcome: &str, n: u64) {
        lock(&self.recent).count(outcome, n, now_ms());
    }

    /// Records per outcome in the last five minutes.
    pub fn recent(&self) -> BTreeMap<&'static str, u64> {
        lock(&self.recent).totals(now_ms())
    }

    /// The trigger's lag on this replica now (its partitions' records summed, its oldest
    /// record's age).
    pub fn record_lag(&self, records: i64, seconds: f64) {
        lock(&self.lag).record(now_ms(), records, seconds);
    }

    /// The lag over the last ten minutes.
    pub fn lag_history(&self) -> Vec<LagPoint> {
        lock(&self.lag).points()
    }

    fn update(&self, id: u64, change: impl FnOnce(&mut ParkedKey)) {
        if let Some(e) = lock(&self.parked).get_mut(&id) {
            change(&mut e.key);
        }
    }

    fn leave(&self, id: u64, outcome: &str, parked_for: Duration) {
        let (entry, n) = {
            let mut parked = lock(&self.parked);
            let entry = parked.remove(&id);
            (entry, parked.len())
        };
        crate::telemetry::metrics::parked_keys(&self.connection, &self.trigger, n);
        if let Some(e) = entry {
            let k = &e.key;
            tracing::info!(
                connection = %self.connection, trigger = %self.trigger, topic = %k.topic,
                partition = k.partition, offset = k.offset, key = ?k.key.as_deref().or(k.key_base64.as_deref()),
                attempts = k.attempts, outcome, parked_ms = parked_for.as_millis() as u64,
                "parked key moved on"
            );
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A run's place in its trigger's parked keys, while it waits; it leaves when dropped.
#[derive(Debug)]
pub struct ParkedRun {
    control: std::sync::Arc<TriggerControl>,
    id: u64,
    directives: mpsc::UnboundedReceiver<Directive>,
    since: std::time::Instant,
    finished: bool,
}

impl ParkedRun {
    /// Updates what the status shows of the run.
    pub fn update(&self, change: impl FnOnce(&mut ParkedKey)) {
        self.control.update(self.id, change);
    }

    /// The next operator directive (pending for ever when none comes).
    pub async fn directive(&mut self) -> Directive {
        match self.directives.recv().await {
            Some(d) => d,
            None => std::future::pending().await,
        }
    }

    /// The run moved on with `outcome` (a label of [`crate::run::WorkOutcome`]).
    pub fn finish(mut self, outcome: &str) {
        self.finished = true;
        self.control.leave(self.id, outcome, self.since.elapsed());
    }
}

impl Drop for ParkedRun {
    fn drop(&mut self) {
        if !self.finished {
            self.control
                .leave(self.id, "abandoned", self.since.elapsed());
        }
        // Directives that arrived too late are answered: the record moved on.
        self.directives.close();
        while let Ok(d) = self.directives.try_recv() {
            let reply = match d {
                Directive::RetryNow { reply } | Directive::Skip { reply, .. } => reply,
            };
            let _ = reply.send(Err(ActionError::Gone));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn key(offset: i64) -> ParkedKey {
        ParkedKey {
            topic: "t".into(),
            partition: 0,
            offset,
            offsets: vec![offset],
            key: Some("k".into()),
            key_base64: None,
            attempts: 1,
            since_ms: 1,
            next_attempt_ms: 2,
            last_status: Some(500),
            last_answer: Some("HTTP 500".into()),
            next: "retried".into(),
            owner: String::new(),
        }
    }

    #[tokio::test]
    async fn a_parked_run_takes_directives_and_leaves_when_it_moves_on() {
        let c = Arc::new(TriggerControl::new("c", "t"));
        let mut run = c.park(key(7));
        assert_eq!(c.parked_count(), 1);
        run.update(|k| k.attempts = 3);
        assert_eq!(c.parked()[0].attempts, 3);
        let (tx, _rx) = oneshot::channel();
        assert!(
            c.direct("t", 0, 8, Directive::RetryNow { reply: tx })
                .is_err(),
            "not parked at 8"
        );
        let (tx, mut rx8) = oneshot::channel();
        c.direct("t", 0, 7, Directive::RetryNow { reply: tx })
            .unwrap();
        match run.directive().await {
            Directive::RetryNow { reply } => {
                reply.send(Ok(ActionOutcome::new("retrying"))).unwrap()
            }
            Directive::Skip { .. } => panic!("a retry was sent"),
        }
        assert_eq!(rx8.try_recv().unwrap().unwrap().outcome, "retrying");
        // A directive that arrives as the run leaves is answered, not lost.
        let (tx, late) = oneshot::channel();
        c.direct("t", 0, 7, Directive::RetryNow { reply: tx })
            .unwrap();
        run.finish("accepted");
        assert_eq!(c.parked_count(), 0);
        assert_eq!(late.await.unwrap(), Err(ActionError::Gone));
    }

    #[test]
    fn target_states_and_skips_are_remembered() {
        let c = TriggerControl::new("c", "t");
        assert!(!c.paused());
        let paused = TargetState {
            state: RunState::Paused,
            reason: Some("fixing the workflow".into()),
            by: Some("oncall".into()),
            at_ms: 5,
        };
        assert!(c.set_target(paused.clone()));
        assert!(
            !c.set_target(paused.clone()),
            "the same state again changes nothing"
        );
        assert!(c.paused());
        assert_eq!(c.target(), paused);
        assert!(c.set_target(TargetState::default()));
        assert!(!c.paused());
        let outcome = ActionOutcome::new("skipped");
        c.remember_skip("t", 1, 9, &outcome);
        assert_eq!(c.skipped("t", 1, 9), Some(outcome));
        assert_eq!(c.skipped("t", 1, 10), None);
        assert_eq!(shown_key(Some(b"ab")), (Some("ab".into()), None));
        assert_eq!(shown_key(Some(&[0xff])), (None, Some("/w==".into())));
    }
}
