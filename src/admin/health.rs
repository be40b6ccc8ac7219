//! The daemon's health, as the admin server reports it:
//!
//! - liveness (`/livez`): every connection's event loop still turns. Each loop beats a
//!   [`Heartbeat`] once per turn, and turns at least every 10 s even when idle (its health
//!   check: every second while busy, every 10 s when idle), so a loop silent for
//!   [`LIVENESS_BOUND`] is wedged;
//! - per connection detail (`/health`): its assigned partitions, partitions that stalled (a
//!   backlog and no progress for `stall_after_ms`) with the reason, triggers stopped by a
//!   configuration error, broker and registry reachability. Supervisors write it; the admin
//!   server reads it. It is downstream state, not readiness: one tenant's registry or
//!   dispatcher outage must not take the pod out of its Service.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

/// How long a connection's event loop may go without a turn before `/livez` fails. The loop
/// turns at least every 10 s (its health check, every second while busy), and what it awaits within a turn is
/// bounded by a few seconds (a synchronous commit on revoke, its retries), so 30 s means a
/// loop that is stuck, not a busy one.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(30);

/// Panics in a row of one connection's tasks (each followed by a restart, without a run of
/// a minute between them) at which `/livez` fails.
pub const PANICS_FOR_LIVEZ: u32 = 3;

/// Shared health state of the daemon.
#[derive(Clone, Debug)]
pub struct HealthRegistry {
    inner: Arc<Mutex<BTreeMap<String, ConnectionHealth>>>,
    heartbeats: Arc<Mutex<BTreeMap<String, Heartbeat>>>,
    /// Per connection, its restarts in a row after a panic of one of its tasks.
    panics: Arc<Mutex<BTreeMap<String, u32>>>,
    /// With a region cluster: this replica in the region group, and which connections it
    /// runs and why.
    region: Arc<Mutex<Option<serde_json::Value>>>,
    /// What heartbeats count their milliseconds from.
    origin: Instant,
}

impl Default for HealthRegistry {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            heartbeats: Arc::default(),
            panics: Arc::default(),
            region: Arc::default(),
            origin: Instant::now(),
        }
    }
}

/// The last turn of one connection's event loop, as milliseconds since the registry's origin
/// plus one ([`Heartbeat::IDLE`]: no loop running: not started yet, or stopped).
#[derive(Clone, Debug)]
pub struct Heartbeat {
    last: Arc<AtomicU64>,
    origin: Instant,
}

impl Heartbeat {
    /// No loop is running (before the first turn and after the loop ended): nothing to judge.
    const IDLE: u64 = 0;

    /// The loop made a turn now.
    pub fn beat(&self) {
        self.last.store(
            millis_since(self.origin, Instant::now()) + 1,
            Ordering::Relaxed,
        );
    }

    /// Awaits `wait`, beating every second meanwhile: for a loop that waits on something
    /// bounded elsewhere (a synchronous commit that waits for a rebalance), which is not a
    /// wedge.
    pub async fn beating_while<F: std::future::Future>(&self, wait: F) -> F::Output {
        tokio::pin!(wait);
        let mut beat = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                // A beat due when the wait ends is still beaten (a late poll under load).
                biased;
                _ = beat.tick() => self.beat(),
                out = &mut wait => return out,
            }
        }
    }

    /// The loop ended (shutdown): it is no longer expected to turn.
    pub fn retire(&self) {
        self.last.store(Self::IDLE, Ordering::Relaxed);
    }

    /// When the loop last turned; None while no loop runs.
    fn last_turn(&self) -> Option<Instant> {
        match self.last.load(Ordering::Relaxed) {
            Self::IDLE => None,
            ms => Some(self.origin + Duration::from_millis(ms - 1)),
        }
    }
}

fn millis_since(origin: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(origin).as_millis()).unwrap_or(u64::MAX - 1)
}

/// Connections whose event loop last turned more than `bound` before `now`, with how long
/// ago. Loops not running (None) are not judged.
pub fn wedged_loops<'a>(
    last_turns: impl IntoIterator<Item = (&'a str, Option<Instant>)>,
    now: Instant,
    bound: Duration,
) -> BTreeMap<String, Duration> {
    last_turns
        .into_iter()
        .filter_map(|(name, last)| {
            let silent = now.saturating_duration_since(last?);
            (silent > bound).then(|| (name.to_owned(), silent))
        })
        .collect()
}

/// Health of one connection.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ConnectionHealth {
    /// A broker of the cluster is reachable (from librdkafka's statistics; false until the
    /// first report).
    pub brokers_up: bool,
    /// The schema registry answered its last probe (true when none is configured).
    pub registry_reachable: bool,
    /// Partitions assigned to this daemon.
    pub assigned_partitions: usize,
    /// Stalled partitions (`topic[partition]`) and why.
    pub stalled_partitions: BTreeMap<String, String>,
    /// Triggers stopped by a configuration error, and why.
    pub stopped_triggers: BTreeMap<String, String>,
    /// Triggers an operator paused, and the reason given (a chosen state, not a fault).
    pub paused_triggers: BTreeMap<String, String>,
    /// Keys parked on this replica: runs waiting to try their record again
    /// (`GET /api/v1/status` names each).
    pub parked_keys: usize,
    /// Why the brokers cannot be used, when authentication or TLS fails (for example
    /// `authentication failed: …`, `TLS handshake failed: …`).
    pub kafka_error: Option<String>,
    /// Permissions the connection's principal lacks, named as the product page does (`READ
    /// on group tessel-orders`, `READ on topic payments`).
    pub missing_permissions: Vec<String>,
    /// Why the connection could not start or stopped, while it waits to try again (with
    /// backoff; the other connections are not affected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_error: Option<String>,
}

impl ConnectionHealth {
    /// Healthy when the brokers and the registry are reachable and nothing is stalled or
    /// stopped. A connection with no partitions assigned is idle by design (more daemons
    /// than partitions), not unhealthy.
    pub fn is_healthy(&self) -> bool {
        self.brokers_up
            && self.registry_reachable
            && self.stalled_partitions.is_empty()
            && self.stopped_triggers.is_empty()
            && self.kafka_error.is_none()
            && self.missing_permissions.is_empty()
            && self.start_error.is_none()
    }
}

impl HealthRegistry {
    /// Replaces what a connection reports.
    pub fn set(&self, connection: &str, health: ConnectionHealth) {
        let _ = self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(connection.to_owned(), health);
    }

    /// `connection` is started again after `in_a_row` panics of its tasks with no long run
    /// between them (0: it ran long enough, or did not panic).
    pub fn set_panic_restarts(&self, connection: &str, in_a_row: u32) {
        let mut panics = self.panics.lock().unwrap_or_else(|p| p.into_inner());
        if in_a_row == 0 {
            let _ = panics.remove(connection);
        } else {
            let _ = panics.insert(connection.to_owned(), in_a_row);
        }
    }

    /// Connections whose restarts keep failing: at least [`PANICS_FOR_LIVEZ`] panics in a row.
    /// One panic restarts its connection and the pod stays live; a connection that panics
    /// again and again fails `/livez`, so the pod is replaced.
    pub fn failing_restarts(&self) -> BTreeMap<String, u32> {
        self.panics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, n)| **n >= PANICS_FOR_LIVEZ)
            .map(|(c, n)| (c.clone(), *n))
            .collect()
    }

    /// Forgets a connection (removed by a reload).
    pub fn remove(&self, connection: &str) {
        self.set_panic_restarts(connection, 0);
        let _ = self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(connection);
    }

    /// Replaces what the region reports.
    pub fn set_region(&self, region: serde_json::Value) {
        *self.region.lock().unwrap_or_else(|p| p.into_inner()) = Some(region);
    }

    /// What the region reports (None without a region cluster).
    pub fn region(&self) -> Option<serde_json::Value> {
        self.region
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every connection's health.
    pub fn snapshot(&self) -> BTreeMap<String, ConnectionHealth> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The heartbeat of `connection`'s event loop (registered idle: judged from its first
    /// beat on).
    pub fn heartbeat(&self, connection: &str) -> Heartbeat {
        self.heartbeats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(connection.to_owned())
            .or_insert_with(|| Heartbeat {
                last: Arc::new(AtomicU64::new(Heartbeat::IDLE)),
                origin: self.origin,
            })
            .clone()
    }

    /// Connections whose event loop has made no turn for more than `bound` at `now`.
    pub fn wedged(&self, now: Instant, bound: Duration) -> BTreeMap<String, Duration> {
        wedged_loops(
            self.last_turns().iter().map(|(n, t)| (n.as_str(), *t)),
            now,
            bound,
        )
    }

    /// When each connection's event loop last turned (None while no loop runs).
    pub fn last_turns(&self) -> BTreeMap<String, Option<Instant>> {
        let beats = self.heartbeats.lock().unwrap_or_else(|p| p.into_inner());
        beats
            .iter()
            .map(|(n, h)| (n.clone(), h.last_turn()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loop_silent_past_the_bound_is_wedged_and_others_are_not() {
        let t0 = Instant::now();
        let bound = Duration::from_secs(30);
        let at = |s: u64| Some(t0 + Duration::from_secs(s));
        let now = t0 + Duration::from_secs(100);
        let wedged = wedged_loops(
            [
                ("busy", at(99)),
                ("at-the-bound", at(70)),
                ("stuck", at(69)),
                ("not-started", None),
            ],
            now,
            bound,
        );
        assert_eq!(
            wedged,
            BTreeMap::from([("stuck".to_owned(), Duration::from_secs(31))])
        );
    }

    #[test]
    fn heartbeats_are_judged_from_their_first_beat_until_retired() {
        let registry = HealthRegistry::default();
        let bound = Duration::from_secs(30);
        let beat = registry.heartbeat("orders");
        let later = Instant::now() + Duration::from_secs(3600);
        // Registered, never beaten: no loop to judge yet.
        assert!(registry.wedged(later, bound).is_empty());
        beat.beat();
        let beaten_at = beat.last_turn().unwrap();
        assert!(registry.wedged(beaten_at + bound, bound).is_empty());
        let silent = registry.wedged(beaten_at + bound + Duration::from_millis(1), bound);
        assert_eq!(
            silent,
            BTreeMap::from([("orders".to_owned(), bound + Duration::from_millis(1))])
        );
        // The same connection's handle is shared: a beat through a second handle counts.
        registry.heartbeat("orders").beat();
        assert!(registry
            .wedged(beat.last_turn().unwrap() + bound, bound)
            .is_empty());
        beat.retire();
        assert!(registry.wedged(later, bound).is_empty());
    }

    /// A loop waiting on something bounded elsewhere (here a 2.5 s wait standing for a slow
    /// commit) keeps beating during the wait, not only before it.
    #[tokio::test(flavor = "current_thread")]
    async fn a_loop_waiting_beats_while_it_waits() {
        let registry = HealthRegistry::default();
        let beat = registry.heartbeat("orders");
        let started = Instant::now();
        let waited = beat
            .beating_while(async {
                tokio::time::sleep(Duration::from_millis(2_500)).await;
                7
            })
            .await;
        assert_eq!(waited, 7);
        // Beats at 0, 1 and 2 s into the wait, however late the runtime polls them.
        let last = beat.last_turn().expect("beaten");
        assert!(
            last >= started + Duration::from_millis(1_500),
            "last beat {:?} into the wait",
            last.saturating_duration_since(started)
        );
    }
}
