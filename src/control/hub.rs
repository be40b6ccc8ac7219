//! The replica's registry of operator controls: one [`ConnectionControl`] per connection
//! (its triggers' controls, the partitions its shell last reported) and the actions carried
//! out here. The HTTP layer ([`super::api`]) authorises, forwards to peers and answers; this
//! applies.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use super::status::{ConnectionStatus, PartitionStatus, RegionStatus, TriggerStatus};
use super::store::TargetStore;
use super::trigger::{
    now_ms, ActionError, ActionOutcome, Directive, RunState, TargetState, TriggerControl,
};
use crate::admin::health::HealthRegistry;
use crate::config::Config;

/// How long a retry waits for the parked run to take it (it takes it at once while it waits).
const RETRY_ANSWER: Duration = Duration::from_secs(10);
/// How long a skip waits for its dead-letter write (the producer's ack timeout is 30 s by
/// default).
const SKIP_ANSWER: Duration = Duration::from_secs(40);

/// One connection's controls: its triggers' and what its shell reports.
#[derive(Debug)]
pub struct ConnectionControl {
    name: String,
    triggers: Mutex<BTreeMap<String, Arc<TriggerControl>>>,
    /// The partitions its shell owns, as last reported; None while no shell runs it here.
    partitions: Mutex<Option<Vec<PartitionStatus>>>,
    changes: watch::Sender<u64>,
}

impl Default for ConnectionControl {
    fn default() -> Self {
        Self::new("")
    }
}

impl ConnectionControl {
    /// The controls of connection `name`, every trigger running.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            triggers: Mutex::new(BTreeMap::new()),
            partitions: Mutex::new(None),
            changes: watch::channel(0).0,
        }
    }

    /// The controls of its trigger `name` (created running on first use; they outlive a
    /// restart of the connection).
    pub fn trigger(&self, name: &str) -> Arc<TriggerControl> {
        Arc::clone(
            lock(&self.triggers)
                .entry(name.to_owned())
                .or_insert_with(|| Arc::new(TriggerControl::new(&self.name, name))),
        )
    }

    /// Its shell learns of target state changes here.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// A target state changed: the shell applies them again.
    fn notify(&self) {
        self.changes.send_modify(|v| *v += 1);
    }

    /// The shell's report of the partitions it owns (and the triggers' lag for the chart);
    /// None: the shell stopped.
    pub fn publish(&self, partitions: Option<Vec<PartitionStatus>>) {
        if let Some(parts) = &partitions {
            let mut lag: BTreeMap<&str, (i64, f64)> = BTreeMap::new();
            for p in parts {
                let e = lag.entry(p.trigger.as_str()).or_default();
                e.0 += p.lag_records.unwrap_or(0);
                e.1 = e.1.max(p.lag_seconds.unwrap_or(0.0));
            }
            for (trigger, (records, seconds)) in lag {
                self.trigger(trigger).record_lag(records, seconds);
            }
        }
        *lock(&self.partitions) = partitions;
    }

    /// The partitions its shell owns, as last reported; None while no shell runs it here.
    pub fn partitions(&self) -> Option<Vec<PartitionStatus>> {
        lock(&self.partitions).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why an action or a status request was refused; each maps to an HTTP status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// 401: no token, or not a configured one.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403: the token does not grant this.
    #[error("{0}")]
    Forbidden(String),
    /// 404: no such connection, trigger or parked record; or the API is off.
    #[error("{0}")]
    NotFound(String),
    /// 409: the record moved on, or the action could not be carried out as things are.
    #[error("{0}")]
    Conflict(String),
    /// 413: the body is too large.
    #[error("{0}")]
    TooLarge(String),
    /// 503: a store or a peer could not be reached; nothing changed.
    #[error("{0}")]
    Unavailable(String),
    /// 504: the action did not finish in time.
    #[error("{0}")]
    Timeout(String),
}

impl ApiError {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Self::BadRequest(_) => 400,
            Self::Unauthenticated(_) => 401,
            Self::Forbidden(_) => 403,
            Self::NotFound(_) => 404,
            Self::Conflict(_) => 409,
            Self::TooLarge(_) => 413,
            Self::Unavailable(_) => 503,
            Self::Timeout(_) => 504,
        }
    }
}

/// What a status request asks for.
#[derive(Clone, Debug, Default)]
pub struct StatusFilter {
    /// Only this connection.
    pub connection: Option<String>,
    /// Only this trigger.
    pub trigger: Option<String>,
    /// Only triggers with parked keys.
    pub parked_only: bool,
}

/// The replica's controls.
pub struct ControlHub {
    replica_id: String,
    connections: Mutex<BTreeMap<String, Arc<ConnectionControl>>>,
    config: RwLock<Arc<Config>>,
    health: HealthRegistry,
    store: TargetStore,
    /// Set once the stored target states are applied.
    ready: std::sync::atomic::AtomicBool,
    pub(super) peers: super::peers::Peers,
    pub(super) redrives: super::redrive::Redrives,
}

impl std::fmt::Debug for ControlHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlHub")
            .field("replica_id", &self.replica_id)
            .finish_non_exhaustive()
    }
}

impl ControlHub {
    /// The controls of this replica for `config`, reporting `health`, its target states in
    /// `store`.
    pub fn new(config: Arc<Config>, health: HealthRegistry, store: TargetStore) -> Arc<Self> {
        let replica_id = config.region.replica_id();
        let advertise = config
            .region
            .advertise_url(config.api.listen.unwrap_or(config.server.listen).port());
        let peers = super::peers::Peers::new(&config, &replica_id, &advertise, store.directory());
        Arc::new(Self {
            replica_id,
            connections: Mutex::new(BTreeMap::new()),
            config: RwLock::new(config),
            health,
            store,
            ready: std::sync::atomic::AtomicBool::new(false),
            peers,
            redrives: super::redrive::Redrives::default(),
        })
    }

    /// Loads the stored target states and applies them, before any connection starts (a
    /// trigger paused before a restart starts paused): the file and then the peers' newer
    /// states, or the control topic, which it keeps following until `shutdown`. The API
    /// serves the status and actions from then on.
    pub async fn start(
        self: &Arc<Self>,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<()> {
        let weak = Arc::downgrade(self);
        let apply = move |connection: &str, trigger: &str, state: TargetState| {
            if let Some(hub) = weak.upgrade() {
                hub.apply_target(connection, trigger, state);
            }
        };
        self.store
            .start(
                &self.replica_id,
                &self.peers.advertise,
                Box::new(apply),
                shutdown,
            )
            .await?;
        if self.store.is_shared() {
            self.ready.store(true, std::sync::atomic::Ordering::SeqCst);
        } else {
            // Without a shared store, the peers' newer states come first.
            super::api::sync_from_peers(self).await;
            self.ready.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }

    /// Whether the stored target states were read: the status and actions are served from
    /// then on (503 before).
    pub fn ready(&self) -> Result<(), ApiError> {
        if self.ready.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        Err(ApiError::Unavailable(
            "starting: the triggers' target states are being read".to_owned(),
        ))
    }

    /// This replica's id.
    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    /// The running configuration.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.config.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// A reloaded configuration (tokens, peers, connections and triggers that exist).
    pub fn set_config(&self, config: Arc<Config>) {
        self.peers.set_config(&config);
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = config;
    }

    /// The controls of connection `name`.
    pub fn connection(&self, name: &str) -> Arc<ConnectionControl> {
        Arc::clone(
            lock(&self.connections)
                .entry(name.to_owned())
                .or_insert_with(|| Arc::new(ConnectionControl::new(name))),
        )
    }

    /// Applies a target state (stored here, or read from the control topic) to its trigger;
    /// a change reaches the connection's shell at once. An older state than the one applied
    /// is ignored.
    pub fn apply_target(&self, connection: &str, trigger: &str, state: TargetState) {
        let conn = self.connection(connection);
        let control = conn.trigger(trigger);
        if control.target().at_ms > state.at_ms {
            return;
        }
        let paused = state.paused();
        if control.set_target(state.clone()) {
            tracing::info!(
                connection,
                trigger,
                state = if paused { "paused" } else { "running" },
                by = state.by.as_deref().unwrap_or(""),
                reason = state.reason.as_deref().unwrap_or(""),
                "trigger target state applied"
            );
            conn.notify();
        }
    }

    /// Every target state applied here, for a peer that starts.
    pub fn target_states(&self) -> Vec<(String, String, TargetState)> {
        let conns: Vec<Arc<ConnectionControl>> =
            lock(&self.connections).values().cloned().collect();
        let mut out = Vec::new();
        for c in conns {
            for (name, t) in lock(&c.triggers).iter() {
                let target = t.target();
                if target.at_ms > 0 {
                    out.push((c.name.clone(), name.clone(), target));
                }
            }
        }
        out
    }

    /// Whether `connection` has `trigger` in the running configuration.
    pub fn has_trigger(&self, connection: &str, trigger: &str) -> Result<(), ApiError> {
        let config = self.config();
        let Some(c) = config.connections.get(connection) else {
            return Err(ApiError::NotFound(format!("no connection {connection:?}")));
        };
        if !c.triggers.contains_key(trigger) {
            return Err(ApiError::NotFound(format!(
                "connection {connection:?} has no trigger {trigger:?}"
            )));
        }
        Ok(())
    }

    /// Pauses or resumes a trigger here: stored first (nothing changes if it cannot be),
    /// then applied. The same state again changes nothing (`already`).
    pub async fn set_state(
        &self,
        connection: &str,
        trigger: &str,
        state: RunState,
        reason: Option<String>,
        by: &str,
    ) -> Result<ActionOutcome, ApiError> {
        self.has_trigger(connection, trigger)?;
        let outcome = match state {
            RunState::Paused => "paused",
            RunState::Running => "resumed",
        };
        let current = self.connection(connection).trigger(trigger).target();
        if current.state == state {
            return Ok(ActionOutcome {
                already: true,
                ..ActionOutcome::new(outcome)
            });
        }
        let target = TargetState {
            state,
            reason,
            by: Some(by.to_owned()),
            at_ms: now_ms().max(current.at_ms + 1),
        };
        self.store
            .put(connection, trigger, &target)
            .await
            .map_err(|e| {
                ApiError::Unavailable(format!(
                    "cannot store the target state: {e}; nothing changed"
                ))
            })?;
        self.apply_target(connection, trigger, target);
        Ok(ActionOutcome::new(outcome))
    }

    /// Stores a state that came from a peer, without applying it.
    pub async fn store_locally(
        &self,
        connection: &str,
        trigger: &str,
        state: &TargetState,
    ) -> Result<(), String> {
        self.store.put(connection, trigger, state).await
    }

    /// Whether target states reach every replica through the store (the control topic), so
    /// a pause need not be forwarded.
    pub fn store_is_shared(&self) -> bool {
        self.store.is_shared()
    }

    /// Has the run parked at `offset` of `topic`/`partition` of the trigger tried now.
    pub async fn retry(
        &self,
        connection: &str,
        trigger: &str,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<ActionOutcome, ApiError> {
        self.has_trigger(connection, trigger)?;
        let control = self.connection(connection).trigger(trigger);
        let (reply, answer) = oneshot::channel();
        if control
            .direct(topic, partition, offset, Directive::RetryNow { reply })
            .is_err()
        {
            return Err(not_parked(topic, partition, offset));
        }
        await_answer(answer, RETRY_ANSWER).await
    }

    /// Skips the record parked at `offset` of `topic`/`partition` of the trigger: to its
    /// dead-letter topic (or recorded as skipped), then its key goes on. Skipping a record
    /// skipped already answers what the first skip did.
    pub async fn skip(
        &self,
        connection: &str,
        trigger: &str,
        target: (&str, i32, i64),
        reason: &str,
        by: &str,
    ) -> Result<ActionOutcome, ApiError> {
        self.has_trigger(connection, trigger)?;
        let (topic, partition, offset) = target;
        let control = self.connection(connection).trigger(trigger);
        if let Some(done) = control.skipped(topic, partition, offset) {
            return Ok(ActionOutcome {
                already: true,
                ..done
            });
        }
        let (reply, answer) = oneshot::channel();
        let directive = Directive::Skip {
            offset,
            reason: reason.to_owned(),
            by: by.to_owned(),
            reply,
        };
        if control.direct(topic, partition, offset, directive).is_err() {
            return Err(not_parked(topic, partition, offset));
        }
        await_answer(answer, SKIP_ANSWER).await
    }

    /// Whether this replica owns `topic`/`partition` for `connection` now.
    pub fn owns(&self, connection: &str, topic: &str, partition: i32) -> bool {
        self.connection(connection).partitions().is_some_and(|ps| {
            ps.iter()
                .any(|p| p.topic == topic && p.partition == partition)
        })
    }

    /// The status of what this replica runs, as far as `may_see(connection, trigger)`
    /// allows and `filter` asks.
    pub fn local_status(
        &self,
        may_see: impl Fn(&str, &str) -> bool,
        filter: &StatusFilter,
    ) -> RegionStatus {
        let config = self.config();
        let health = self.health.snapshot();
        let mut connections = Vec::new();
        for (cname, cconf) in &config.connections {
            if filter.connection.as_ref().is_some_and(|c| c != cname) {
                continue;
            }
            let control = self.connection(cname);
            let partitions = control.partitions();
            let h = health.get(cname);
            let running = partitions.is_some();
            let mut triggers = Vec::new();
            for (tname, tconf) in &cconf.triggers {
                if !may_see(cname, tname) || filter.trigger.as_ref().is_some_and(|t| t != tname) {
                    continue;
                }
                let tc = control.trigger(tname);
                let target = tc.target();
                let mine: Vec<PartitionStatus> = partitions
                    .iter()
                    .flatten()
                    .filter(|p| &p.trigger == tname)
                    .map(|p| PartitionStatus {
                        owner: self.replica_id.clone(),
                        ..p.clone()
                    })
                    .collect();
                let mut parked = tc.parked();
                for k in &mut parked {
                    k.owner.clone_from(&self.replica_id);
                }
                if filter.parked_only && parked.is_empty() {
                    continue;
                }
                triggers.push(TriggerStatus {
                    name: tname.clone(),
                    workflow: tconf.workflow.clone(),
                    topics: tconf.topics.clone(),
                    state: target.state,
                    target,
                    on_error: serde_json::to_value(tconf.on_error)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    dead_letter_topic: tconf.dead_letter_topic.clone(),
                    stopped: h.and_then(|h| h.stopped_triggers.get(tname).cloned()),
                    runs_in_flight: mine.iter().map(|p| p.in_flight).sum(),
                    waiting: mine.iter().map(|p| p.waiting).sum(),
                    lag_records: mine.iter().filter_map(|p| p.lag_records).sum(),
                    lag_seconds: mine
                        .iter()
                        .filter_map(|p| p.lag_seconds)
                        .fold(0.0, f64::max),
                    last_5m: tc
                        .recent()
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                    lag_history: tc.lag_history(),
                    partitions: mine,
                    parked,
                });
            }
            if triggers.is_empty() {
                continue;
            }
            let last_error = h.and_then(|h| {
                h.start_error
                    .clone()
                    .or_else(|| h.kafka_error.clone())
                    .or_else(|| {
                        (!h.missing_permissions.is_empty()).then(|| {
                            format!("missing {}", h.missing_permissions.join(", missing "))
                        })
                    })
            });
            connections.push(ConnectionStatus {
                name: cname.clone(),
                running_on: if running {
                    vec![self.replica_id.clone()]
                } else {
                    Vec::new()
                },
                brokers_up: h.filter(|_| running).map(|h| h.brokers_up),
                registry_reachable: h.filter(|_| running).map(|h| h.registry_reachable),
                last_error,
                triggers,
            });
        }
        RegionStatus {
            region: config.region.name.clone(),
            replica: self.replica_id.clone(),
            generated_at_ms: now_ms(),
            replicas: vec![super::status::ReplicaStatus {
                id: self.replica_id.clone(),
                url: Some(self.peers.advertise.clone()),
                reachable: true,
                error: None,
            }],
            connections,
        }
    }
}

fn not_parked(topic: &str, partition: i32, offset: i64) -> ApiError {
    ApiError::NotFound(format!(
        "offset {offset} of {topic}[{partition}] is not parked (no run of this trigger waits to try it again)"
    ))
}

async fn await_answer(
    answer: oneshot::Receiver<Result<ActionOutcome, ActionError>>,
    within: Duration,
) -> Result<ActionOutcome, ApiError> {
    match tokio::time::timeout(within, answer).await {
        Ok(Ok(Ok(outcome))) => Ok(outcome),
        Ok(Ok(Err(ActionError::NotFound(m)))) => Err(ApiError::NotFound(m)),
        Ok(Ok(Err(ActionError::Failed(m)))) => Err(ApiError::Unavailable(m)),
        Ok(Ok(Err(ActionError::Gone)) | Err(_)) => Err(ApiError::Conflict(
            "the record moved on before the action reached it (accepted, or its partition was revoked); nothing was done".to_owned(),
        )),
        Err(_) => Err(ApiError::Timeout(format!(
            "the parked run did not answer within {} s",
            within.as_secs()
        ))),
    }
}
