//! A connection without triggers: no consumer and no group, only the produce API over the
//! connection's idempotent producer. What `/health` says of it comes from a metadata request
//! every [`PROBE_EVERY`] and the registry's probe.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::producer::IdempotentProducer;
use crate::admin::health::{ConnectionHealth, HealthRegistry};
use crate::codec::registry::RegistryClient;
use crate::telemetry::metrics;

/// Pause between two probes.
const PROBE_EVERY: Duration = Duration::from_secs(5);

/// How long a metadata request may take before the brokers count as unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Reports the health of a produce-only connection until shutdown.
#[derive(Debug)]
pub struct ProduceOnly {
    name: String,
    producer: IdempotentProducer,
    registry: Option<Arc<RegistryClient>>,
    /// A topic the connection writes to, so the probe asks for one topic's metadata rather
    /// than the whole cluster's.
    probe_topic: Option<String>,
    health: HealthRegistry,
}

impl ProduceOnly {
    /// The watch of connection `name`; `probe_topic` is one of the topics it writes to.
    pub fn new(
        name: &str,
        producer: IdempotentProducer,
        registry: Option<Arc<RegistryClient>>,
        probe_topic: Option<String>,
        health: HealthRegistry,
    ) -> Self {
        Self {
            name: name.to_owned(),
            producer,
            registry,
            probe_topic,
            health,
        }
    }

    /// Probes until `shutdown` fires.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(connection = %self.name, "no triggers: the connection only serves the produce API");
        let mut was_up = None;
        loop {
            let probe = self
                .producer
                .probe(self.probe_topic.clone(), PROBE_TIMEOUT)
                .await;
            let registry_reachable = match &self.registry {
                Some(r) => r.probe().await.is_ok(),
                None => true,
            };
            let brokers_up = probe.is_ok();
            let kafka_error = if brokers_up {
                None
            } else {
                self.producer.connect_failure().map(|f| f.to_string())
            };
            if was_up != Some(brokers_up) {
                match &probe {
                    Ok(()) => tracing::info!(connection = %self.name, "brokers reachable"),
                    Err(e) => {
                        tracing::warn!(connection = %self.name, error = %e, kafka_error = ?kafka_error, "brokers unreachable")
                    }
                }
                was_up = Some(brokers_up);
            }
            metrics::brokers_up(&self.name, brokers_up);
            self.health.set(
                &self.name,
                ConnectionHealth {
                    brokers_up,
                    registry_reachable,
                    kafka_error,
                    ..ConnectionHealth::default()
                },
            );
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(PROBE_EVERY) => {}
            }
        }
    }
}
