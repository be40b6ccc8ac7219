//! How many replicas a connection can use: no more than its partitions. A replica placed as a
//! connection's second (or later) replica asks the tenant's cluster how many partitions the
//! connection's topics have before it starts it, and stays out when the replicas ranked
//! before it already cover them. The best-ranked replica never asks: it always runs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Semaphore};

use super::{Demand, PlacedHere};
use crate::config::Config;

/// How long a partition count is trusted (topics gain partitions now and then).
const FRESH_FOR: Duration = Duration::from_secs(600);
/// Counts asked for at once (each a short-lived client of a tenant's cluster).
const AT_ONCE: usize = 4;

/// A connection's partition count, as last learned.
#[derive(Clone, Debug)]
struct Count {
    /// The connection's configuration fingerprint it was learned for.
    fingerprint: u64,
    at: Instant,
    /// None: it could not be learned (the connection then runs: availability first).
    partitions: Option<usize>,
}

/// An answer: connection, fingerprint, partitions (or why not).
type Answer = (String, u64, Result<usize, String>);

/// The partition counts this replica learned, and the ones it is asking for.
pub struct PartitionCounts {
    known: HashMap<String, Count>,
    asking: HashSet<String>,
    answers_tx: mpsc::Sender<Answer>,
    answers: mpsc::Receiver<Answer>,
    limit: Arc<Semaphore>,
}

impl Default for PartitionCounts {
    fn default() -> Self {
        let (answers_tx, answers) = mpsc::channel(64);
        Self {
            known: HashMap::new(),
            asking: HashSet::new(),
            answers_tx,
            answers,
            limit: Arc::new(Semaphore::new(AT_ONCE)),
        }
    }
}

/// Whether a connection placed here at `rank` may run, given what is known of its
/// partitions: rank 0 always; a later rank once the partitions are known to outnumber it
/// (or could not be learned). None: not known yet.
fn admitted(rank: usize, partitions: Option<Option<usize>>) -> Option<bool> {
    if rank == 0 {
        return Some(true);
    }
    match partitions {
        None => None,
        Some(None) => Some(true),
        Some(Some(p)) => Some(p > rank),
    }
}

impl PartitionCounts {
    /// What is known of `name`'s partitions for its configuration in `config` (None:
    /// nothing), and whether it is still fresh.
    fn lookup(&self, name: &str, config: &Config) -> Option<(Option<usize>, bool)> {
        let c = self.known.get(name)?;
        let fingerprint = crate::config::fingerprint(config.connections.get(name)?);
        (c.fingerprint == fingerprint).then_some((c.partitions, c.at.elapsed() < FRESH_FOR))
    }

    /// The connections of `runs` that may start now (see [`admitted`]); asks for the counts
    /// it lacks, whose answers [`PartitionCounts::next`] brings.
    pub fn admit(
        &mut self,
        runs: &BTreeMap<String, PlacedHere>,
        config: &Config,
    ) -> BTreeSet<String> {
        let mut admitted_now = BTreeSet::new();
        for (name, here) in runs {
            let known = self.lookup(name, config);
            // A stale count still decides (a running connection is not stopped to ask
            // again); it is asked for anew meanwhile.
            if here.rank > 0 && known.is_none_or(|(_, fresh)| !fresh) {
                self.ask(name, config);
            }
            if admitted(here.rank, known.map(|(p, _)| p)) == Some(true) {
                let _ = admitted_now.insert(name.clone());
            }
        }
        admitted_now
    }

    /// Asks the tenant's cluster for `name`'s partition count, once at a time.
    fn ask(&mut self, name: &str, config: &Config) {
        let Some(conn) = config.connections.get(name) else {
            return;
        };
        if !self.asking.insert(name.to_owned()) {
            return;
        }
        let (name, conn) = (name.to_owned(), conn.clone());
        let (tx, limit) = (self.answers_tx.clone(), Arc::clone(&self.limit));
        let fingerprint = crate::config::fingerprint(&conn);
        tokio::spawn(async move {
            let Ok(_permit) = limit.acquire_owned().await else {
                return;
            };
            let probe = name.clone();
            let answer = tokio::task::spawn_blocking(move || {
                crate::clients::probe::partition_count(&probe, &conn).map_err(|e| format!("{e:#}"))
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
            let _ = tx.send((name, fingerprint, answer)).await;
        });
    }

    /// The next answer, recorded: the connection it is about.
    pub async fn next(&mut self) -> Option<String> {
        let (name, fingerprint, answer) = self.answers.recv().await?;
        let _ = self.asking.remove(&name);
        let partitions = match answer {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(connection = %name, error = %e,
                    "cannot learn the connection's partition count; it runs on every replica placed for it");
                None
            }
        };
        let _ = self.known.insert(
            name.clone(),
            Count {
                fingerprint,
                at: Instant::now(),
                partitions,
            },
        );
        Some(name)
    }

    /// The demand of `config`: each connection wants `spread` replicas, or fewer when its
    /// partitions are known to be fewer.
    pub fn demand(&self, config: &Config) -> Demand {
        let mut demand = Demand::of(config);
        for (name, want) in demand.wants.iter_mut() {
            if let Some((Some(p), _)) = self.lookup(name, config) {
                *want = (*want).min(p.max(1));
            }
        }
        demand
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_ranks_run_only_where_the_partitions_outnumber_them() {
        assert_eq!(admitted(0, None), Some(true), "the best-ranked always runs");
        assert_eq!(admitted(1, None), None, "not known yet: ask first");
        assert_eq!(admitted(1, Some(Some(1))), Some(false));
        assert_eq!(admitted(1, Some(Some(2))), Some(true));
        assert_eq!(admitted(2, Some(Some(2))), Some(false));
        assert_eq!(admitted(1, Some(None)), Some(true), "unknown: it runs");
    }
}
