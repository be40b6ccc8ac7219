//! What `/readyz` reports: per connection, its assigned partitions, partitions that stalled
//! (a backlog and no progress for `stall_after_ms`) with the reason, and triggers stopped by a
//! configuration error. Supervisors write it; the admin server reads it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// Shared health state of the daemon.
#[derive(Clone, Debug, Default)]
pub struct HealthRegistry {
    inner: Arc<Mutex<BTreeMap<String, ConnectionHealth>>>,
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
    /// Ready when the brokers and the registry are reachable and nothing is stalled or
    /// stopped. A connection with no partitions assigned is idle by design (more daemons
    /// than partitions), not unready.
    pub fn is_ready(&self) -> bool {
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

    /// Forgets a connection (removed by a reload).
    pub fn remove(&self, connection: &str) {
        let _ = self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(connection);
    }

    /// Every connection's health.
    pub fn snapshot(&self) -> BTreeMap<String, ConnectionHealth> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
