//! The daemon: every configured connection running under one shutdown token, each on its own
//! (a connection that cannot start or stops with an error is reported and started again with
//! backoff while the others run), and configuration reloads that restart only what changed.
//!
//! The daemon itself stops with an error only for its own faults: the admin port taken (or the
//! configuration unreadable or invalid at start, before this runs).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::admin::health::{ConnectionHealth, HealthRegistry};
use crate::config::{Config, ConnectionConfig};
use crate::consumer::supervisor::{ConnectionSupervisor, SharedClients, SupervisorError};
use crate::produce::api::ProduceApi;
use crate::produce::produce_only::ProduceOnly;
use crate::produce::Publisher;
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
}

impl App {
    /// The daemon for `config`. Opens no connection and creates no client: each connection's
    /// clients are created when it starts, so one that cannot be built stops only itself.
    pub fn build(config: Config) -> Result<Self, SupervisorError> {
        let health = HealthRegistry::default();
        for name in config.connections.keys() {
            // Every configured connection is in /health from the start, not healthy until it
            // reports: "ready" must never mean "no connection has said anything yet".
            health.set(name, ConnectionHealth::default());
        }
        let produce = Arc::new(ProduceApi::new(HashMap::new(), config.produce.clone()));
        Ok(Self {
            config,
            source: None,
            health,
            produce,
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
        let (reload_tx, mut reload_rx) = mpsc::channel::<&'static str>(1);
        let mut admin = None;
        if serve_admin {
            // Bound before anything starts: a port taken is an error the process exits with.
            let listener = crate::admin::bind(self.config.server.listen).await?;
            let recorder = metrics::install();
            if let Some(handle) = recorder.clone() {
                drop(tokio::spawn(metrics::run_upkeep(handle, shutdown.clone())));
            }
            let mut extra = Arc::clone(&self.produce).router();
            if self.config.server.reload_endpoint {
                extra = extra.merge(reload_route(reload_tx.clone()));
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
        // Kept for as long as reloads may come.
        let _watch = match &self.source {
            Some(path) => {
                crate::shutdown::spawn_reload_signal(reload_tx.clone());
                watch_config(path, reload_tx.clone())
            }
            None => None,
        };
        drop(reload_tx);
        let mut fleet = Fleet {
            running: BTreeMap::new(),
            stopping: Vec::new(),
            health: self.health.clone(),
            produce: Arc::clone(&self.produce),
            shutdown: shutdown.clone(),
        };
        fleet.apply(&self.config);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(why) = reload_rx.recv() => {
                    if let Some(path) = &self.source {
                        reload(path, why, &self.produce, &mut fleet).await;
                    }
                }
            }
        }
        fleet.stop_all().await;
        if let Some(admin) = admin {
            let _ = admin.await;
        }
        Ok(())
    }
}

/// Reads and validates the configuration at `path` (as `config check` does, secrets from
/// files read again) and applies what changed; an invalid one is refused and the running
/// configuration kept.
async fn reload(path: &Path, why: &str, produce: &ProduceApi, fleet: &mut Fleet) {
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
            fleet.apply(&new);
            metrics::config_reload("ok");
        }
        Err(e) => {
            tracing::error!(trigger = why, error = %e, "configuration reload refused: the running configuration is kept");
            metrics::config_reload("invalid");
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

/// Watches the directory of `path` (not recursive): an edit, a file renamed over it, or a
/// Kubernetes ConfigMap's `..data` symlink swap all show there. Only events that name the
/// file itself, or one of the `..`-prefixed entries a ConfigMap swaps, ask for a reload:
/// other files of the directory (a log written next to the config) must not. One reload
/// waiting is enough, so events in a burst coalesce.
fn watch_config(
    path: &Path,
    reload: mpsc::Sender<&'static str>,
) -> Option<notify::RecommendedWatcher> {
    use notify::Watcher as _;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned();
    let file = path.file_name().map(std::ffi::OsStr::to_owned);
    let handler = move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else {
            return;
        };
        if names_config(&event.paths, file.as_deref()) && !event.kind.is_access() {
            let _ = reload.try_send("config file changed");
        }
    };
    let started = notify::recommended_watcher(handler).and_then(|mut w| {
        w.watch(&dir, notify::RecursiveMode::NonRecursive)?;
        Ok(w)
    });
    match started {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the configuration's directory; reload with SIGHUP");
            None
        }
    }
}

/// Whether an event on `paths` concerns the config file named `file`: the file itself, or a
/// `..`-prefixed entry of a Kubernetes ConfigMap mount (`..data`, `..2026_12_06_...`).
fn names_config(paths: &[PathBuf], file: Option<&std::ffi::OsStr>) -> bool {
    paths.iter().any(|p| {
        p.file_name()
            .is_some_and(|name| Some(name) == file || name.to_string_lossy().starts_with(".."))
    })
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
}

impl ConnectionSpec {
    fn of(config: &Config, name: &str, c: &ConnectionConfig) -> Self {
        Self {
            name: name.to_owned(),
            config: c.clone(),
            produces: config.produce.grants_connection(name),
            probe_topic: config.produced_topics(name).into_iter().next(),
        }
    }

    /// Changes whenever anything the connection runs from changes, secrets included.
    fn fingerprint(&self) -> u64 {
        crate::config::fingerprint(&(&self.config, self.produces, &self.probe_topic))
    }
}

/// A connection's task while it runs.
struct Running {
    fingerprint: u64,
    token: CancellationToken,
    handle: JoinHandle<()>,
}

/// Every connection's task, by name.
struct Fleet {
    running: BTreeMap<String, Running>,
    /// Connections removed by a reload, while they drain.
    stopping: Vec<JoinHandle<()>>,
    health: HealthRegistry,
    produce: Arc<ProduceApi>,
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
    fn specs(config: &Config) -> BTreeMap<String, ConnectionSpec> {
        config
            .connections
            .iter()
            .map(|(name, c)| (name.clone(), ConnectionSpec::of(config, name, c)))
            .collect()
    }

    fn apply_plan(&self, config: &Config) -> Changes {
        let running = self
            .running
            .iter()
            .map(|(n, r)| (n.clone(), r.fingerprint))
            .collect();
        let wanted = Self::specs(config)
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
            self.stopping.push(tokio::spawn(async move {
                let _ = handle.await;
                health.remove(&name);
                metrics::connection_up(&name, false);
                tracing::info!(connection = %name, "connection removed by a reload: drained and stopped");
            }));
        }
        let specs = Self::specs(config);
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
                prepare(spec, &self.produce).ok()
            } else {
                None
            };
            let run = run_connection(
                spec.clone(),
                self.health.clone(),
                Arc::clone(&self.produce),
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
                    token,
                    handle,
                },
            );
        }
        self.stopping.retain(|h| !h.is_finished());
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
    token: CancellationToken,
    mut prepared: Option<SharedClients>,
) {
    let name = spec.name.as_str();
    let mut delay = RESTART_INITIAL;
    loop {
        let started = Instant::now();
        let result = start_and_run(&spec, prepared.take(), &health, &produce, &token).await;
        produce.set_publisher(name, None);
        let Err(e) = result else {
            metrics::connection_up(name, false);
            return;
        };
        if started.elapsed() >= RAN_LONG_ENOUGH {
            delay = RESTART_INITIAL;
        }
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
fn prepare(spec: &ConnectionSpec, produce: &ProduceApi) -> Result<SharedClients, SupervisorError> {
    let shared = SharedClients::try_new(&spec.name, &spec.config, spec.produces)?;
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
    token: &CancellationToken,
) -> Result<(), SupervisorError> {
    let name = spec.name.as_str();
    let shared = match prepared {
        Some(shared) => shared,
        None => prepare(spec, produce)?,
    };
    let supervisor = if spec.config.consumes() {
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
        (Some(s), _) => s.run(token.clone()).await,
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
    fn only_the_config_file_or_a_configmap_swap_asks_for_a_reload() {
        let file = Some(std::ffi::OsStr::new("config.toml"));
        let at = |p: &str| vec![PathBuf::from(p)];
        assert!(names_config(&at("/etc/tessel/config.toml"), file));
        assert!(names_config(&at("/etc/tessel/..data"), file));
        assert!(names_config(
            &at("/etc/tessel/..2026_12_06_01_00_00.123"),
            file
        ));
        // A log or another file next to the config: no reload (a reload logs, and a log
        // beside the config once made every log line reload it).
        assert!(!names_config(&at("/etc/tessel/daemon.log"), file));
        assert!(!names_config(&at("/etc/tessel/.config.toml.new"), file));
        assert!(!names_config(&[], file));
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
            ConnectionSpec::of(&config, "a", &config.connections["a"]).fingerprint()
        };
        assert_eq!(load("one"), load("one"));
        assert_ne!(load("one"), load("two"));
    }
}
