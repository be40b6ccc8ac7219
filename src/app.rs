//! The daemon: every configured connection running under one shutdown token, each on its own
//! (a connection that cannot start or stops with an error is reported and started again with
//! backoff while the others run), and configuration reloads that restart only what changed.
//!
//! The daemon itself stops with an error only for its own faults: the admin port taken (or the
//! configuration unreadable or invalid at start, before this runs).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admin::health::{ConnectionHealth, HealthRegistry};
use crate::config::{Config, ConnectionConfig};
use crate::consumer::supervisor::{ConnectionSupervisor, SharedClients, SupervisorError};
use crate::control::ControlHub;
use crate::dispatch::DispatchPools;
use crate::produce::api::ProduceApi;
use crate::produce::produce_only::ProduceOnly;
use crate::produce::Publisher;
use crate::region::{Handover, PartitionCounts, Placement, Region};
use crate::telemetry::metrics;

/// First wait before a failed connection is started again; doubles up to [`RESTART_MAX`].
pub const RESTART_INITIAL: Duration = Duration::from_secs(1);
/// Longest wait between two starts of a failing connection.
pub const RESTART_MAX: Duration = Duration::from_secs(300);
/// A connection that ran this long before it failed starts again after [`RESTART_INITIAL`].
const RAN_LONG_ENOUGH: Duration = Duration::from_secs(60);

/// The running daemon.
pub struct App {
    config: Config,
    /// The file the configuration came from: reloads read it again (None: no reloads).
    source: Option<PathBuf>,
    health: HealthRegistry,
    produce: Arc<ProduceApi>,
    /// Operators' controls: status, target states, actions (the API and console).
    control: Arc<ControlHub>,
}

impl App {
    /// The daemon for `config`. Opens no connection and creates no client: each connection's
    /// clients are created when it starts, so one that cannot be built stops only itself.
    pub fn build(config: Config) -> Result<Self, SupervisorError> {
        let health = HealthRegistry::default();
        // With a region cluster only the connections placed here run (and report).
        let placed_here = !config.region.has_cluster();
        for name in config.connections.keys().filter(|_| placed_here) {
            // Every configured connection is in /health from the start, not healthy until it
            // reports: "ready" must never mean "no connection has said anything yet".
            health.set(name, ConnectionHealth::default());
        }
        let produce = Arc::new(ProduceApi::new(HashMap::new(), config.produce.clone()));
        // Known before the server answers: a request for a connection still starting is
        // answered 503 (try again), not 404.
        produce.set_running(
            config
                .connections
                .keys()
                .filter(|name| config.produce.grants_connection(name))
                .cloned(),
        );
        let store = crate::control::store::TargetStore::for_config(&config);
        let control = ControlHub::new(Arc::new(config.clone()), health.clone(), store);
        Ok(Self {
            config,
            source: None,
            health,
            produce,
            control,
        })
    }

    /// Reloads read `path` again (on SIGHUP, a change in its directory, and `POST /-/reload`
    /// when `server.reload_endpoint` is on).
    pub fn reloading_from(mut self, path: &Path) -> Self {
        self.source = Some(path.to_owned());
        self
    }

    /// Runs until `shutdown` fires and every connection has drained and committed.
    /// `serve_admin` starts the metrics and health server.
    pub async fn run(self, shutdown: CancellationToken, serve_admin: bool) -> anyhow::Result<()> {
        crate::limits::log_at_start();
        let (reload_tx, mut reload_rx) = mpsc::channel::<&'static str>(1);
        let mut admin = None;
        if serve_admin {
            // Bound before anything starts: a port taken is an error the process exits with.
            let listener = crate::admin::bind(self.config.server.listen).await?;
            let recorder = metrics::install();
            metrics::config_loaded();
            if let Some(handle) = recorder.clone() {
                drop(tokio::spawn(metrics::run_upkeep(handle, shutdown.clone())));
            }
            let mut extra = Arc::clone(&self.produce).router();
            if self.config.server.reload_endpoint {
                extra = extra.merge(reload_route(reload_tx.clone()));
            }
            let hub = Arc::clone(&self.control);
            match self.config.api.listen {
                // The API and console on a listener of their own; the admin one keeps
                // /metrics, the probes and the produce API.
                Some(addr) => {
                    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                        anyhow::anyhow!(
                            "cannot listen on {addr} (api.listen) for the operator API: {e}"
                        )
                    })?;
                    tracing::info!(%addr, "operator API and console listening");
                    let api = crate::control::api::standalone(hub);
                    let token = shutdown.clone();
                    drop(tokio::spawn(async move {
                        let served = axum::serve(listener, api)
                            .with_graceful_shutdown(async move { token.cancelled().await })
                            .await;
                        if let Err(e) = served {
                            tracing::error!(%addr, error = %e, "operator API server failed");
                        }
                    }));
                }
                None => extra = extra.merge(crate::control::api::router(hub)),
            }
            let (health, addr, token) = (
                self.health.clone(),
                self.config.server.listen,
                shutdown.clone(),
            );
            admin = Some(tokio::spawn(async move {
                if let Err(e) = crate::admin::serve(listener, recorder, health, extra, token).await
                {
                    tracing::error!(%addr, error = %e, "admin server failed");
                }
            }));
        }
        // Kept for as long as reloads may come; watches the config file and the secret files
        // it reads, and follows a reload that reads other ones.
        let mut watched = self.config.secret_files().clone();
        let mut watch = match &self.source {
            Some(path) => {
                crate::shutdown::spawn_reload_signal(reload_tx.clone());
                watch_config(path, &watched, reload_tx.clone())
            }
            None => None,
        };
        let restart_only = restart_only_fingerprint(&self.config);
        // Target states are known before any connection starts: a trigger paused before a
        // restart starts paused.
        self.control.start(&shutdown).await?;
        // With a region cluster, this replica runs what the region group places here.
        let mut region = if self.config.region.has_cluster() {
            let link = RegionLink::start(&self.config)?;
            self.health
                .set_region(region_health(&self.config, &link.last, &BTreeSet::new()));
            Some(link)
        } else {
            None
        };
        metrics::region_generation(0);
        let mut fleet = Fleet {
            running: BTreeMap::new(),
            stopping: Vec::new(),
            placed: region.as_ref().map(|_| BTreeSet::new()),
            health: self.health.clone(),
            produce: Arc::clone(&self.produce),
            control: Arc::clone(&self.control),
            dispatch: Arc::new(DispatchPools::new(self.config.dispatch.clone())),
            shutdown: shutdown.clone(),
        };
        let mut current = self.config.clone();
        fleet.apply(&current);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(event) = next_region_event(&mut region) => {
                    if let Some(link) = region.as_mut() {
                        link.handle(event, &current, &mut fleet, &self.health).await;
                    }
                }
                Some(why) = reload_rx.recv() => {
                    let Some(path) = &self.source else { continue };
                    let Some(new) = reload(path, why, &self.produce, &mut fleet).await else {
                        continue;
                    };
                    if restart_only_fingerprint(&new) != restart_only {
                        tracing::warn!(trigger = why, "[server], [log], [otlp], [dispatch] or [region] changed: they take effect at the next restart (region.placement.spread at once)");
                    }
                    if new.secret_files() != &watched {
                        watched = new.secret_files().clone();
                        drop(watch.take());
                        watch = watch_config(path, &watched, reload_tx.clone());
                    }
                    if let Some(link) = &region {
                        link.region.set_demand(link.counts.demand(&new));
                    }
                    current = new;
                }
            }
        }
        drop((watch, reload_tx));
        // The region group is left while the connections drain: their next replicas start
        // them meanwhile (the tenant groups' own rebalances order the handover).
        let leaving = region.map(|link| tokio::spawn(link.leave()));
        fleet.stop_all().await;
        if let Some(leaving) = leaving {
            let _ = leaving.await;
        }
        if let Some(admin) = admin {
            let _ = admin.await;
        }
        Ok(())
    }
}

/// What a reload cannot apply to a running daemon: the admin listener, the log, trace export,
/// the dispatcher pools' bounds and the region (placement and identity; but the spread, which
/// a reload gives the region group at once). A change there is applied at the next restart.
fn restart_only_fingerprint(config: &Config) -> u64 {
    let mut region = config.region.clone();
    region.placement.spread = 0;
    crate::config::fingerprint(&(
        &config.server,
        &config.log,
        &config.otlp,
        &config.dispatch,
        &region,
    ))
}

/// The daemon's side of the region group: what it placed here, the partition counts that
/// admit a connection's later-ranked replicas, and the handovers to answer.
struct RegionLink {
    region: Region,
    placements: watch::Receiver<Placement>,
    handovers: mpsc::Receiver<Handover>,
    counts: PartitionCounts,
    /// The latest placement (less what was handed over since).
    last: Placement,
    /// Stale partition counts are asked for again on this tick.
    tick: tokio::time::Interval,
}

/// What the region has for the daemon.
enum RegionEvent {
    /// Stop these connections before the slots are released.
    Handover(Handover),
    /// What runs here changed.
    Placement(Placement),
    /// A connection's partition count was learned.
    Counted,
    /// Time to look at stale partition counts again.
    Tick,
}

impl RegionLink {
    fn start(config: &Config) -> std::io::Result<Self> {
        let region = Region::start(config)?;
        let handovers = region
            .take_handovers()
            .ok_or_else(|| std::io::Error::other("the region's handovers were taken"))?;
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(Self {
            placements: region.placement.clone(),
            region,
            handovers,
            counts: PartitionCounts::default(),
            last: Placement::default(),
            tick,
        })
    }

    async fn next(&mut self) -> Option<RegionEvent> {
        tokio::select! {
            biased;
            Some(h) = self.handovers.recv() => Some(RegionEvent::Handover(h)),
            Ok(()) = self.placements.changed() => Some(RegionEvent::Placement(self.placements.borrow_and_update().clone())),
            Some(_) = self.counts.next() => Some(RegionEvent::Counted),
            _ = self.tick.tick() => Some(RegionEvent::Tick),
        }
    }

    async fn handle(
        &mut self,
        event: RegionEvent,
        config: &Config,
        fleet: &mut Fleet,
        health: &HealthRegistry,
    ) {
        match event {
            RegionEvent::Handover(h) => {
                fleet.hand_over(&h.stop).await;
                self.last.runs.retain(|c, _| !h.stop.contains(c));
                let _ = h.done.send(());
                // A placement published before the revoke may still wait, naming what was
                // just handed over: it is passed over (the region publishes the one after).
                let waiting = self.placements.borrow_and_update().clone();
                if !waiting.runs.keys().any(|c| h.stop.contains(c)) {
                    self.last = waiting;
                }
            }
            RegionEvent::Placement(p) => self.last = p,
            RegionEvent::Counted => self.region.set_demand(self.counts.demand(config)),
            RegionEvent::Tick => {}
        }
        let admitted = self.counts.admit(&self.last.runs, config);
        health.set_region(region_health(config, &self.last, &admitted));
        fleet.placed = Some(admitted);
        fleet.apply(config);
    }

    /// Leaves the region group (see [`Region::leave`]); handovers are no longer answered.
    async fn leave(self) {
        drop(self.handovers);
        self.region.leave().await;
    }
}

/// The region's next event (never, without a region cluster).
async fn next_region_event(region: &mut Option<RegionLink>) -> Option<RegionEvent> {
    match region {
        Some(link) => link.next().await,
        None => std::future::pending().await,
    }
}

/// `/health`'s `region`: this replica in the region group, and which connections it runs
/// (`admitted` of what the region placed here) and why.
fn region_health(
    config: &Config,
    placement: &Placement,
    admitted: &BTreeSet<String>,
) -> serde_json::Value {
    let (runs, not_needed): (BTreeMap<_, _>, BTreeMap<_, _>) = placement
        .runs
        .iter()
        .partition(|(c, _)| admitted.contains(*c));
    serde_json::json!({
        "name": config.region.name,
        "replica_id": config.region.replica_id(),
        "group": config.region.placement_group_id(),
        "placement_topic": config.region.placement_topic(),
        "joined": placement.joined,
        "generation": placement.generation,
        "replicas": placement.replicas,
        "slots": placement.slots,
        "error": placement.error,
        "runs_here": runs,
        // Placed here as a later replica of a connection whose partitions the replicas
        // ranked before this one already cover (or whose partition count is being asked).
        "not_needed_here": not_needed.keys().collect::<Vec<_>>(),
        "placed_elsewhere": config
            .connections
            .iter()
            .filter(|(name, c)| c.consumes() && !placement.runs.contains_key(*name))
            .count(),
    })
}

/// Reads and validates the configuration at `path` (as `config check` does, secrets from
/// files read again) and applies what changed; an invalid one is refused and the running
/// configuration kept. Returns the configuration applied.
async fn reload(path: &Path, why: &str, produce: &ProduceApi, fleet: &mut Fleet) -> Option<Config> {
    match Config::load(path) {
        Ok(new) => {
            let changes = fleet.apply_plan(&new);
            if changes == Changes::default() {
                tracing::debug!(
                    trigger = why,
                    "configuration reloaded: no connection changed"
                );
            } else {
                tracing::info!(trigger = why, started = ?changes.start, stopped = ?changes.stop,
                    restarted = ?changes.restart, "configuration reloaded");
            }
            produce.set_config(new.produce.clone());
            fleet.control.set_config(Arc::new(new.clone()));
            fleet.apply(&new);
            metrics::config_reload("ok");
            Some(new)
        }
        Err(e) => {
            tracing::error!(trigger = why, error = %e, "configuration reload refused: the running configuration is kept");
            metrics::config_reload("invalid");
            None
        }
    }
}

/// `POST /-/reload`: asks for a reload and answers at once (the result is in the log and in
/// `tessel_kafka_config_reloads_total`).
fn reload_route(reload: mpsc::Sender<&'static str>) -> axum::Router {
    use axum::http::StatusCode;
    axum::Router::new().route(
        "/-/reload",
        axum::routing::post(move || {
            let reload = reload.clone();
            async move {
                match reload.try_send("POST /-/reload") {
                    // A reload already waiting reads the file as it is then.
                    Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => {
                        (StatusCode::ACCEPTED, "reload requested\n")
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n")
                    }
                }
            }
        }),
    )
}

/// Watches the directory of the config file `path` and those of the `secrets` files (not
/// recursive): an edit, a file renamed over it, or a Kubernetes ConfigMap's or Secret's
/// `..data` symlink swap all show there. Only events that name a watched file itself, or one
/// of the `..`-prefixed entries a ConfigMap or Secret mount swaps, ask for a reload: other
/// files of the directories (a log written next to the config) must not. One reload waiting
/// is enough, so events in a burst coalesce.
fn watch_config(
    path: &Path,
    secrets: &std::collections::BTreeSet<PathBuf>,
    reload: mpsc::Sender<&'static str>,
) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher as _;
    let watched = Watched::new(path, secrets);
    let dirs = watched.dirs();
    let handler = move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else {
            return;
        };
        if event.kind.is_access() {
            return;
        }
        if let Some(why) = watched.reason(&event.paths) {
            let _ = reload.try_send(why);
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the configuration's files; reload with SIGHUP");
            return None;
        }
    };
    for dir in dirs {
        if let Err(e) = watcher.watch(&dir, notify::RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch this directory of the configuration's files; reload with SIGHUP");
        }
    }
    Some(watcher)
}

/// The files a reload reads: the config file and the secret files, by directory.
struct Watched {
    /// The config file's directory and name.
    config: (PathBuf, Option<std::ffi::OsString>),
    /// Each directory holding secret files, with their names.
    secrets: BTreeMap<PathBuf, std::collections::BTreeSet<std::ffi::OsString>>,
}

/// The directory (`.` for a bare name) and the name of `path`.
fn dir_and_name(path: &Path) -> (PathBuf, Option<std::ffi::OsString>) {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    (
        dir.to_owned(),
        path.file_name().map(std::ffi::OsStr::to_owned),
    )
}

impl Watched {
    fn new(config: &Path, secrets: &std::collections::BTreeSet<PathBuf>) -> Self {
        let mut by_dir: BTreeMap<PathBuf, std::collections::BTreeSet<_>> = BTreeMap::new();
        for secret in secrets {
            let (dir, name) = dir_and_name(secret);
            by_dir.entry(dir).or_default().extend(name);
        }
        Self {
            config: dir_and_name(config),
            secrets: by_dir,
        }
    }

    /// Every directory to watch.
    fn dirs(&self) -> std::collections::BTreeSet<PathBuf> {
        std::iter::once(self.config.0.clone())
            .chain(self.secrets.keys().cloned())
            .collect()
    }

    /// Why an event on `paths` asks for a reload, if it does: it names a watched file, or a
    /// `..`-prefixed entry (`..data`, `..2026_12_06_...`: a ConfigMap's or Secret's mount
    /// swapping its files) of a watched directory.
    fn reason(&self, paths: &[PathBuf]) -> Option<&'static str> {
        paths.iter().find_map(|p| {
            let (dir, name) = dir_and_name(p);
            let name = name?;
            let swap = name.to_string_lossy().starts_with("..");
            if dir == self.config.0 && (swap || Some(&name) == self.config.1.as_ref()) {
                return Some("config file changed");
            }
            let names = self.secrets.get(&dir)?;
            (swap || names.contains(&name)).then_some("secret file changed")
        })
    }
}

/// What a connection runs from: its configuration and what the produce API asks of it.
#[derive(Clone)]
struct ConnectionSpec {
    name: String,
    config: ConnectionConfig,
    /// A produce token grants this connection.
    produces: bool,
    /// The topic a connection without triggers probes.
    probe_topic: Option<String>,
    /// Its triggers run here: it has some, and (with a region cluster) it is placed here.
    /// Otherwise it runs here only to serve the produce API.
    consume: bool,
    /// The daemon's dispatcher pools (not part of the fingerprint).
    dispatch: Arc<DispatchPools>,
}

impl ConnectionSpec {
    fn of(
        config: &Config,
        name: &str,
        c: &ConnectionConfig,
        dispatch: &Arc<DispatchPools>,
    ) -> Self {
        Self {
            name: name.to_owned(),
            config: c.clone(),
            produces: config.produce.grants_connection(name),
            probe_topic: config.produced_topics(name).into_iter().next(),
            consume: c.consumes(),
            dispatch: Arc::clone(dispatch),
        }
    }

    /// Changes whenever anything the connection runs from changes, secrets included.
    fn fingerprint(&self) -> u64 {
        crate::config::fingerprint(&(&self.config, self.produces, &self.probe_topic, self.consume))
    }
}

/// A connection's task while it runs.
struct Running {
    fingerprint: u64,
    /// Its triggers run (not only its produce API).
    consume: bool,
    token: CancellationToken,
    handle: JoinHandle<()>,
}

/// Every connection's task, by name.
struct Fleet {
    running: BTreeMap<String, Running>,
    /// Connections removed by a reload, while they drain.
    stopping: Vec<JoinHandle<()>>,
    /// With a region cluster, the connections placed here (None: every connection runs).
    placed: Option<BTreeSet<String>>,
    health: HealthRegistry,
    produce: Arc<ProduceApi>,
    control: Arc<ControlHub>,
    dispatch: Arc<DispatchPools>,
    shutdown: CancellationToken,
}

/// What applying a configuration does, by connection name.
#[derive(Debug, Default, PartialEq, Eq)]
struct Changes {
    start: Vec<String>,
    stop: Vec<String>,
    restart: Vec<String>,
}

/// The difference between what runs (name and fingerprint) and what `wanted` holds: the pure
/// part of a reload.
fn plan(running: &BTreeMap<String, u64>, wanted: &BTreeMap<String, u64>) -> Changes {
    let mut c = Changes::default();
    for (name, fp) in running {
        match wanted.get(name) {
            None => c.stop.push(name.clone()),
            Some(w) if w != fp => c.restart.push(name.clone()),
            Some(_) => {}
        }
    }
    c.start = wanted
        .keys()
        .filter(|n| !running.contains_key(*n))
        .cloned()
        .collect();
    c
}

impl Fleet {
    /// The connections of `config` that run here, with what they run from: with a region
    /// cluster, the triggers of those placed here, and the produce API of every connection
    /// a produce token grants (served by every replica, whichever runs the triggers).
    fn specs(&self, config: &Config) -> BTreeMap<String, ConnectionSpec> {
        config
            .connections
            .iter()
            .filter_map(|(name, c)| {
                let mut spec = ConnectionSpec::of(config, name, c, &self.dispatch);
                spec.consume &= self.placed.as_ref().is_none_or(|p| p.contains(name));
                (spec.consume || spec.produces).then(|| (name.clone(), spec))
            })
            .collect()
    }

    /// The connections whose triggers run here.
    fn consuming(&self) -> usize {
        self.running.values().filter(|r| r.consume).count()
    }

    fn apply_plan(&self, config: &Config) -> Changes {
        let running = self
            .running
            .iter()
            .map(|(n, r)| (n.clone(), r.fingerprint))
            .collect();
        let wanted = self
            .specs(config)
            .into_iter()
            .map(|(n, s)| (n, s.fingerprint()))
            .collect();
        plan(&running, &wanted)
    }

    /// Makes what runs match `config`: connections removed or changed are drained (runs
    /// finished, final commit) and stopped, and a changed one starts again once its old self
    /// stopped (the same group must not see both); those added start at once. Untouched
    /// connections keep running, with the same consumer and assignment. Returns at once: no
    /// connection's drain holds up another's start or the next reload.
    fn apply(&mut self, config: &Config) {
        let changes = self.apply_plan(config);
        let mut old: BTreeMap<String, JoinHandle<()>> = BTreeMap::new();
        for name in changes.stop.iter().chain(&changes.restart) {
            if let Some(r) = self.running.remove(name) {
                r.token.cancel();
                let _ = old.insert(name.clone(), r.handle);
            }
        }
        for name in &changes.stop {
            let Some(handle) = old.remove(name) else {
                continue;
            };
            let (health, name) = (self.health.clone(), name.clone());
            let why = if config.connections.contains_key(&name) {
                // (A connection whose produce API stays is restarted, not stopped.)
                "connection placed on other replicas: drained and stopped here"
            } else {
                "connection removed by a reload: drained and stopped"
            };
            self.stopping.push(tokio::spawn(async move {
                let _ = handle.await;
                health.remove(&name);
                metrics::forget_connection(&name);
                tracing::info!(connection = %name, "{why}");
            }));
        }
        let specs = self.specs(config);
        self.produce.set_running(
            specs
                .iter()
                .filter(|(_, spec)| spec.produces)
                .map(|(name, _)| name.clone()),
        );
        for name in changes.start.iter().chain(&changes.restart) {
            let Some(spec) = specs.get(name) else {
                continue;
            };
            let token = self.shutdown.child_token();
            let predecessor = old.remove(name);
            // A connection with nothing to wait for gets its clients now, so that its produce
            // API is there as soon as the daemon answers (a restarted one waits for its old
            // self, which takes its publisher away when it stops).
            let prepared = if predecessor.is_none() {
                prepare(spec, &self.produce, &self.control).ok()
            } else {
                None
            };
            let run = run_connection(
                spec.clone(),
                self.health.clone(),
                Arc::clone(&self.produce),
                Arc::clone(&self.control),
                token.clone(),
                prepared,
            );
            let handle = tokio::spawn(async move {
                if let Some(p) = predecessor {
                    let _ = p.await;
                }
                run.await;
            });
            let _ = self.running.insert(
                name.clone(),
                Running {
                    fingerprint: spec.fingerprint(),
                    consume: spec.consume,
                    token,
                    handle,
                },
            );
        }
        self.stopping.retain(|h| !h.is_finished());
        metrics::region_connections_placed(self.consuming());
    }

    /// Hands `names` over to other replicas: each is drained (runs finished, final commit)
    /// and stopped, and no longer counted as placed here, before this returns.
    async fn hand_over(&mut self, names: &BTreeSet<String>) {
        let mut handles = Vec::new();
        for name in names {
            if let Some(p) = self.placed.as_mut() {
                let _ = p.remove(name);
            }
            if let Some(r) = self.running.remove(name) {
                r.token.cancel();
                handles.push((name, r.handle));
            }
        }
        for (name, handle) in handles {
            let _ = handle.await;
            self.health.remove(name);
            metrics::forget_connection(name);
            tracing::info!(connection = %name, "connection handed over to another replica: drained and stopped here");
        }
        metrics::region_connections_placed(self.consuming());
    }

    /// Drains and stops every connection (the shutdown token is cancelled already).
    async fn stop_all(self) {
        for r in self.running.values() {
            r.token.cancel();
        }
        for (_, r) in self.running {
            let _ = r.handle.await;
        }
        for h in self.stopping {
            let _ = h.await;
        }
    }
}

/// Runs one connection until `token` fires: starts it, and whenever it cannot start or stops
/// with an error, reports why (log, `tessel_kafka_connection_up` 0 and the failure counter,
/// `start_error` in its health) and starts it again after a backoff of 1 s doubling to 5 min.
async fn run_connection(
    spec: ConnectionSpec,
    health: HealthRegistry,
    produce: Arc<ProduceApi>,
    control: Arc<ControlHub>,
    token: CancellationToken,
    mut prepared: Option<SharedClients>,
) {
    let name = spec.name.as_str();
    let mut delay = RESTART_INITIAL;
    let mut panics = 0u32;
    loop {
        let started = Instant::now();
        let result =
            start_and_run(&spec, prepared.take(), &health, &produce, &control, &token).await;
        produce.set_publisher(name, None);
        let Err(e) = result else {
            metrics::connection_up(name, false);
            health.set_panic_restarts(name, 0);
            return;
        };
        if started.elapsed() >= RAN_LONG_ENOUGH {
            delay = RESTART_INITIAL;
            panics = 0;
        }
        if e.is_panic() {
            panics += 1;
        }
        health.set_panic_restarts(name, panics);
        metrics::connection_up(name, false);
        metrics::connection_failure(name);
        let reason = crate::config::redacted_error_chain(&e);
        health.set(
            name,
            ConnectionHealth {
                start_error: Some(reason.clone()),
                ..ConnectionHealth::default()
            },
        );
        tracing::error!(connection = %name, error = %reason, retry_in_ms = delay.as_millis() as u64,
            "connection cannot run; the other connections are not affected; it is started again");
        tokio::select! {
            _ = token.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(RESTART_MAX);
    }
}

/// Creates the clients `spec` shares with the produce API, and puts its publisher in the API.
fn prepare(
    spec: &ConnectionSpec,
    produce: &ProduceApi,
    control: &ControlHub,
) -> Result<SharedClients, SupervisorError> {
    let mut shared = SharedClients::try_new(&spec.name, &spec.config, spec.produces)?
        .with_dispatch_pools(Arc::clone(&spec.dispatch));
    shared.control = control.connection(&spec.name);
    if let (true, Some(producer)) = (spec.produces, &shared.producer) {
        let publisher = Publisher::new(
            &spec.name,
            &spec.config,
            producer.clone(),
            shared.registry.clone(),
        );
        produce.set_publisher(&spec.name, Some(Arc::new(publisher)));
    }
    Ok(shared)
}

/// Creates the connection's clients (unless `prepared` holds them) and runs it until
/// `token` fires (Ok) or it fails.
async fn start_and_run(
    spec: &ConnectionSpec,
    prepared: Option<SharedClients>,
    health: &HealthRegistry,
    produce: &ProduceApi,
    control: &ControlHub,
    token: &CancellationToken,
) -> Result<(), SupervisorError> {
    let name = spec.name.as_str();
    let shared = match prepared {
        Some(shared) => shared,
        None => prepare(spec, produce, control)?,
    };
    let supervisor = if spec.consume {
        Some(ConnectionSupervisor::try_new(
            name,
            &spec.config,
            health.clone(),
            &shared,
        )?)
    } else {
        None
    };
    health.set(name, ConnectionHealth::default());
    metrics::connection_up(name, true);
    match (supervisor, &shared.producer) {
        // A panic of the supervisor itself ends this run like one of its tasks' does: the
        // connection starts again.
        (Some(s), _) => std::panic::AssertUnwindSafe(s.run(token.clone()))
            .catch_unwind()
            .await
            .unwrap_or_else(|payload| {
                metrics::connection_panic(name);
                Err(SupervisorError::Panicked {
                    connection: name.to_owned(),
                    task: "supervisor",
                    reason: crate::consumer::panic_message(&*payload),
                })
            }),
        (None, Some(producer)) => {
            // Validation makes sure a token grants every connection without triggers.
            ProduceOnly::new(
                name,
                producer.clone(),
                shared.registry.clone(),
                spec.probe_topic.clone(),
                health.clone(),
            )
            .run(token.clone())
            .await;
            Ok(())
        }
        (None, None) => {
            token.cancelled().await;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fps(items: &[(&str, u64)]) -> BTreeMap<String, u64> {
        items.iter().map(|(n, f)| ((*n).to_owned(), *f)).collect()
    }

    #[test]
    fn only_the_config_file_a_secret_file_or_a_mount_swap_asks_for_a_reload() {
        let secrets = [
            PathBuf::from("/run/secrets/tk/kafka-password"),
            PathBuf::from("/run/secrets/tk/dispatcher-token"),
            PathBuf::from("/etc/tessel/ca.pem"),
        ]
        .into_iter()
        .collect();
        let w = Watched::new(Path::new("/etc/tessel/config.toml"), &secrets);
        assert_eq!(
            w.dirs().into_iter().collect::<Vec<_>>(),
            [
                PathBuf::from("/etc/tessel"),
                PathBuf::from("/run/secrets/tk")
            ]
        );
        let at = |p: &str| w.reason(&[PathBuf::from(p)]);
        assert_eq!(at("/etc/tessel/config.toml"), Some("config file changed"));
        assert_eq!(at("/etc/tessel/..data"), Some("config file changed"));
        assert_eq!(
            at("/etc/tessel/..2026_12_06_01_00_00.123"),
            Some("config file changed")
        );
        assert_eq!(at("/etc/tessel/ca.pem"), Some("secret file changed"));
        assert_eq!(
            at("/run/secrets/tk/kafka-password"),
            Some("secret file changed")
        );
        // A Kubernetes Secret's mount swaps its `..data` link when the Secret changes.
        assert_eq!(at("/run/secrets/tk/..data"), Some("secret file changed"));
        // A log or another file next to the config or the secrets: no reload (a reload logs,
        // and a log beside the config once made every log line reload it).
        assert_eq!(at("/etc/tessel/daemon.log"), None);
        assert_eq!(at("/etc/tessel/.config.toml.new"), None);
        assert_eq!(at("/run/secrets/tk/other"), None);
        assert_eq!(at("/elsewhere/..data"), None);
        assert_eq!(w.reason(&[]), None);
        // A bare file name is in the working directory.
        let w = Watched::new(Path::new("config.toml"), &Default::default());
        assert_eq!(
            w.dirs().into_iter().collect::<Vec<_>>(),
            [PathBuf::from(".")]
        );
        assert_eq!(
            w.reason(&[PathBuf::from("./config.toml")]),
            Some("config file changed")
        );
    }

    #[test]
    fn a_reload_starts_the_new_stops_the_removed_and_restarts_only_the_changed() {
        let running = fps(&[("a", 1), ("b", 2), ("c", 3)]);
        let wanted = fps(&[("a", 1), ("c", 30), ("d", 4)]);
        assert_eq!(
            plan(&running, &wanted),
            Changes {
                start: vec!["d".into()],
                stop: vec!["b".into()],
                restart: vec!["c".into()],
            }
        );
        assert_eq!(
            plan(&wanted, &wanted),
            Changes::default(),
            "nothing changed"
        );
    }

    #[test]
    fn a_changed_secret_changes_a_connection_fingerprint() {
        let load = |password: &str| {
            let text = format!(
                r#"
[connections.a]
[connections.a.kafka]
"bootstrap.servers" = "127.0.0.1:9092"
"group.id" = "g"
"security.protocol" = "SASL_SSL"
"sasl.mechanism" = "SCRAM-SHA-512"
"sasl.username" = "u"
"sasl.password" = "{password}"
[connections.a.triggers.t]
topics = ["x"]
workflow = "w"
dispatcher = {{ url = "http://127.0.0.1:1/runs" }}
"#
            );
            let config = Config::from_toml_with_env(&text, Vec::new()).unwrap();
            ConnectionSpec::of(&config, "a", &config.connections["a"], &Arc::default())
                .fingerprint()
        };
        assert_eq!(load("one"), load("one"));
        assert_ne!(load("one"), load("two"));
    }
}
