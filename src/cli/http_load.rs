//! `tessel-kafka dev-http-load`: the connector's own HTTP path to a dispatcher, without Kafka.
//!
//! It POSTs one body again and again through [`HttpDispatcher`], the client every trigger
//! uses (same pool, same fixed headers, same handling of the answer), `connections` requests
//! at a time for a duration, each request with its own `Idempotency-Key`. `scripts/bench`
//! runs it against its measuring dispatcher next to `wrk`: a run's CPU in the drain minus a
//! request's CPU here is what consuming, decoding, scheduling and committing cost.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::DispatcherConfig;
use crate::dispatch::{DispatchOutcome, HttpDispatcher};

/// What a load run did.
#[derive(Debug, Serialize, PartialEq)]
pub struct LoadReport {
    /// Requests answered (any answer).
    pub requests: u64,
    /// Requests the dispatcher accepted (2xx or 409).
    pub accepted: u64,
    /// From the first request to the last answer.
    pub seconds: f64,
    /// `requests / seconds`.
    pub rate: f64,
    /// The first outcome that was not an acceptance, if any.
    pub first_failure: Option<String>,
}

/// A load run: where to, what, how many at a time, for how long.
#[derive(Clone, Debug)]
pub struct Load {
    /// The dispatcher URL.
    pub url: String,
    /// Extra request headers, as a trigger's `dispatcher.headers`.
    pub headers: BTreeMap<String, String>,
    /// The request body, sent unchanged every time.
    pub body: Vec<u8>,
    /// Requests in flight at once (each on its own pooled connection).
    pub connections: usize,
    /// How long to send for; requests in flight at the end are awaited.
    pub duration: Duration,
    /// Idempotency keys are `<prefix>:<n>`.
    pub key_prefix: String,
}

impl Load {
    /// Sends until the duration is over and reports.
    pub async fn run(self) -> Result<LoadReport, String> {
        let config: DispatcherConfig = serde_json::from_value(serde_json::json!({
            "url": self.url,
            "headers": self.headers,
            "timeout_ms": 10_000,
        }))
        .map_err(|e| format!("dispatcher: {e}"))?;
        let client = HttpDispatcher::try_new(&config)?;
        let body = Arc::new(self.body);
        let prefix = Arc::<str>::from(self.key_prefix);
        let next = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let deadline = started + self.duration;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..self.connections.max(1) {
            let (client, body, prefix) = (client.clone(), body.clone(), prefix.clone());
            let (next, accepted) = (next.clone(), accepted.clone());
            drop(tasks.spawn(async move {
                let mut failure = None;
                while Instant::now() < deadline {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let key = format!("{prefix}:{n}");
                    match client.dispatch(body.to_vec(), &key, None).await {
                        DispatchOutcome::Accepted { .. } => {
                            let _ = accepted.fetch_add(1, Ordering::Relaxed);
                        }
                        other => {
                            if failure.is_none() {
                                failure = Some(format!("{other:?}"));
                            }
                        }
                    }
                }
                failure
            }));
        }
        let mut first_failure = None;
        while let Some(joined) = tasks.join_next().await {
            let failure = joined.map_err(|e| format!("a load task failed: {e}"))?;
            first_failure = first_failure.or(failure);
        }
        let seconds = started.elapsed().as_secs_f64();
        let requests = next.load(Ordering::Relaxed);
        Ok(LoadReport {
            requests,
            accepted: accepted.load(Ordering::Relaxed),
            seconds,
            rate: requests as f64 / seconds,
            first_failure,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::dev_dispatcher::bench::BenchDispatcher;
    use tokio_util::sync::CancellationToken;

    #[tokio::test]
    async fn every_request_reaches_the_dispatcher_once_with_its_own_key() {
        let token = CancellationToken::new();
        let d = BenchDispatcher::local(token.clone()).await;
        let body = serde_json::to_vec(&serde_json::json!({
            "topic": "t", "partition": 0, "offset": 1, "timestamp_ms": 1, "key": "k"
        }))
        .unwrap();
        let report = Load {
            url: d.url(),
            headers: BTreeMap::from([("x-load".to_owned(), "1".to_owned())]),
            body,
            connections: 4,
            duration: Duration::from_millis(200),
            key_prefix: "test".to_owned(),
        }
        .run()
        .await
        .unwrap();
        assert!(report.requests > 0, "{report:?}");
        assert_eq!(report.accepted, report.requests, "{report:?}");
        assert_eq!(report.first_failure, None);
        let stats = d.stats();
        assert_eq!(stats["runs"].as_u64(), Some(report.requests), "{stats}");
        assert_eq!(stats["duplicates"].as_u64(), Some(0), "{stats}");
        token.cancel();
    }
}
