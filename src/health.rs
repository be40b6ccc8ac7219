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
    /// Partitions assigned to this daemon.
    pub assigned_partitions: usize,
    /// Stalled partitions (`topic[partition]`) and why.
    pub stalled_partitions: BTreeMap<String, String>,
    /// Triggers stopped by a configuration error, and why.
    pub stopped_triggers: BTreeMap<String, String>,
}

impl ConnectionHealth {
    /// Ready when nothing is stalled or stopped.
    pub fn is_ready(&self) -> bool {
        self.stalled_partitions.is_empty() && self.stopped_triggers.is_empty()
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

    /// Every connection's health.
    pub fn snapshot(&self) -> BTreeMap<String, ConnectionHealth> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
