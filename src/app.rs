//! Builds the runtime objects from the configuration and runs them under one shutdown token.

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use std::collections::HashMap;
use std::sync::Arc;

use crate::admin::health::HealthRegistry;
use crate::config::Config;
use crate::kafka::supervisor::{ConnectionSupervisor, SharedClients, SupervisorError};
use crate::produce::api::ProduceApi;
use crate::produce::produce_only::ProduceOnly;
use crate::produce::Publisher;

/// The running daemon.
pub struct App {
    config: Config,
    supervisors: Vec<ConnectionSupervisor>,
    /// Connections without triggers: health probes only.
    produce_only: Vec<ProduceOnly>,
    health: HealthRegistry,
    produce: Arc<ProduceApi>,
}

impl App {
    /// Creates every connection's consumer and clients, and the produce API over the
    /// connections a token grants. Opens no network connection.
    pub fn build(config: Config) -> Result<Self, SupervisorError> {
        let health = HealthRegistry::default();
        let mut supervisors = Vec::new();
        let mut produce_only = Vec::new();
        let mut publishers = HashMap::new();
        for (name, c) in &config.connections {
            // Every configured connection is in /readyz from the start, not ready until it
            // reports: "ready" must never mean "no connection has said anything yet".
            health.set(name, crate::admin::health::ConnectionHealth::default());
            let produces = config.produce.grants_connection(name);
            let shared = SharedClients::try_new(name, c, produces)?;
            if let (true, Some(producer)) = (produces, &shared.producer) {
                let publisher = Publisher::new(name, c, producer.clone(), shared.registry.clone());
                let _ = publishers.insert(name.clone(), Arc::new(publisher));
            }
            if c.consumes() {
                supervisors.push(ConnectionSupervisor::try_new(
                    name,
                    c,
                    health.clone(),
                    &shared,
                )?);
            } else if let Some(producer) = &shared.producer {
                // Validation makes sure a token grants every connection without triggers.
                produce_only.push(ProduceOnly::new(
                    name,
                    producer.clone(),
                    shared.registry.clone(),
                    config.produced_topics(name).into_iter().next(),
                    health.clone(),
                ));
            }
        }
        let produce = Arc::new(ProduceApi::new(publishers, config.produce.clone()));
        Ok(Self {
            config,
            supervisors,
            produce_only,
            health,
            produce,
        })
    }

    /// Runs until `shutdown` fires and every connection has drained and committed.
    /// `serve_admin` starts the metrics and health server.
    pub async fn run(self, shutdown: CancellationToken, serve_admin: bool) -> anyhow::Result<()> {
        let tracker = TaskTracker::new();
        if serve_admin {
            // Bound before anything starts: a port taken is an error the process exits with.
            let listener = crate::admin::bind(self.config.server.listen).await?;
            let metrics = crate::telemetry::metrics::install();
            let health = self.health.clone();
            let addr = self.config.server.listen;
            let token = shutdown.clone();
            let produce = Arc::clone(&self.produce).router();
            if let Some(handle) = metrics.clone() {
                tracker.spawn(crate::telemetry::metrics::run_upkeep(
                    handle,
                    shutdown.clone(),
                ));
            }
            tracker.spawn(async move {
                if let Err(e) = crate::admin::serve(listener, metrics, health, produce, token).await
                {
                    tracing::error!(%addr, error = %e, "admin server failed");
                }
            });
        }
        let mut handles = Vec::new();
        for s in self.supervisors {
            let token = shutdown.clone();
            handles.push(tracker.spawn(async move {
                let result = s.run(token.clone()).await;
                if result.is_err() {
                    // One failed connection stops the daemon so the orchestrator restarts it.
                    token.cancel();
                }
                result
            }));
        }
        for p in self.produce_only {
            drop(tracker.spawn(p.run(shutdown.clone())));
        }
        tracker.close();
        if handles.is_empty() {
            // Only produce-only connections: nothing ends on its own before shutdown.
            shutdown.cancelled().await;
        }
        let mut first_error = None;
        for h in handles {
            match h.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "connection stopped");
                    first_error.get_or_insert(anyhow::Error::new(e));
                }
                Err(e) => {
                    shutdown.cancel();
                    first_error.get_or_insert(anyhow::anyhow!("connection task failed: {e}"));
                }
            }
        }
        shutdown.cancel();
        tracker.wait().await;
        first_error.map_or(Ok(()), Err)
    }
}
