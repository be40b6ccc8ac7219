//! Redrives: a range of a trigger's dead letters dispatched again into it, started as an
//! action on the replica that received it, with its progress kept there. It is what
//! `tessel-kafka dlq replay` does ([`crate::ops::replay`]), run by the daemon.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::trigger::now_ms;
use crate::config::Config;
use crate::ops::replay::{dlq_replay, ReplayRequest};

/// Redrives kept for `GET /api/v1/redrives` (the oldest finished ones go first).
const KEPT: usize = 100;

/// A redrive's progress.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RedriveProgress {
    /// Its id (the replica's id and a number).
    pub id: String,
    /// The replica running it.
    pub replica: String,
    /// Its connection.
    pub connection: String,
    /// Its trigger.
    pub trigger: String,
    /// The token that started it.
    pub by: String,
    /// `running`, `done` or `failed`.
    pub state: String,
    /// Dead-letter partitions asked for (empty: every one).
    pub partitions: Vec<i32>,
    /// First offset in each partition.
    pub from: i64,
    /// End (exclusive) in each partition; none: the end.
    #[serde(default)]
    pub to: Option<i64>,
    /// A dry run: nothing is sent.
    pub dry_run: bool,
    /// Dead letters read so far.
    pub records: u64,
    /// Of those, accepted by the dispatcher.
    pub accepted: u64,
    /// Of those, not accepted (retries exhausted, rejected, undecodable).
    pub failed: u64,
    /// Why it stopped, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it started, in milliseconds since the epoch.
    pub started_ms: i64,
    /// When it ended.
    #[serde(default)]
    pub finished_ms: Option<i64>,
}

/// The redrives of this replica.
#[derive(Debug, Default)]
pub struct Redrives {
    next: AtomicU64,
    all: Mutex<BTreeMap<u64, Arc<Mutex<RedriveProgress>>>>,
}

impl Redrives {
    /// Starts redriving `request` (its trigger of `connection`) on the runtime; returns its
    /// progress as it starts.
    pub fn start(
        &self,
        config: Arc<Config>,
        connection: &str,
        request: ReplayRequest,
        by: &str,
        replica: &str,
    ) -> RedriveProgress {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let progress = RedriveProgress {
            id: format!("{replica}-{n}"),
            replica: replica.to_owned(),
            connection: connection.to_owned(),
            trigger: request.trigger.clone(),
            by: by.to_owned(),
            state: "running".to_owned(),
            partitions: request.partitions.clone(),
            from: request.from,
            to: request.to,
            dry_run: request.dry_run,
            started_ms: now_ms(),
            ..RedriveProgress::default()
        };
        let shared = Arc::new(Mutex::new(progress.clone()));
        {
            let mut all = lock(&self.all);
            let _ = all.insert(n, Arc::clone(&shared));
            while all.len() > KEPT {
                let oldest_done = all
                    .iter()
                    .find(|(_, p)| lock(p).state != "running")
                    .map(|(k, _)| *k);
                match oldest_done {
                    Some(k) => drop(all.remove(&k)),
                    None => break,
                }
            }
        }
        let connection = connection.to_owned();
        drop(tokio::spawn(async move {
            let emit_to = Arc::clone(&shared);
            let emit = move |r: &crate::ops::replay::Replayed| {
                let mut p = lock(&emit_to);
                p.records += 1;
                match r.outcome.as_str() {
                    "accepted" => p.accepted += 1,
                    "dry_run" => {}
                    _ => p.failed += 1,
                }
            };
            let result = dlq_replay(&config, Some(&connection), &request, emit).await;
            let mut p = lock(&shared);
            p.finished_ms = Some(now_ms());
            match result {
                Ok(_) => {
                    p.state = "done".to_owned();
                    tracing::info!(redrive = %p.id, connection = %p.connection, trigger = %p.trigger,
                        records = p.records, accepted = p.accepted, failed = p.failed, "redrive done");
                }
                Err(e) => {
                    p.state = "failed".to_owned();
                    let why = crate::config::redacted_error_chain(&*e);
                    tracing::warn!(redrive = %p.id, connection = %p.connection, trigger = %p.trigger, error = %why, "redrive failed");
                    p.error = Some(why);
                }
            }
        }));
        progress
    }

    /// The redrive with `id`, if this replica runs or ran it.
    pub fn get(&self, id: &str) -> Option<RedriveProgress> {
        lock(&self.all)
            .values()
            .map(|p| lock(p).clone())
            .find(|p| p.id == id)
    }

    /// Every redrive kept here, oldest first.
    pub fn list(&self) -> Vec<RedriveProgress> {
        lock(&self.all).values().map(|p| lock(p).clone()).collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
