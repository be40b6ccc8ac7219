//! Runs: a run is 1..n records of one partition, a single-record trigger's run a batch of
//! one. One loop ([`attempt`]) takes every run until each record is handled (accepted,
//! filtered, expired, skipped or dead-lettered) or its partition is taken away; a single
//! trigger and a batch trigger differ only in the request body ([`body`]) and in how its
//! answer is read ([`plan`]).
//!
//! Outcomes, per the trigger's configuration:
//! - dispatcher 2xx: accepted (a batch's: but for the events its answer names in
//!   `{"failed": [ids]}`, which, with the later records of their keys, are sent again with
//!   the backoff, counting against `retry.max_attempts`);
//! - 409: accepted for a single event; for a batch, the batch's key was seen before, which
//!   says nothing of which events that request had accepted: it goes again under a key of
//!   its own, whose answer counts (a 409 to that one: every event accepted);
//! - 429 and 503: retried after the dispatcher's Retry-After, and the whole trigger waits that
//!   long before its next dispatch;
//! - other 5xx, timeouts, connection errors: retried with exponential backoff and jitter, up to
//!   `retry.max_attempts` (0: until the dispatcher recovers), then `on_error`;
//! - 400, 404, 410, 422 and other 4xx: rejected, `on_error` applies (a batch is first split
//!   in two halves, earlier offsets first, until the refused record is alone);
//! - 401 and 403: a configuration error. The trigger is marked stopped, says why, and retries
//!   every 30 s; such records are never dead-lettered;
//! - undecodable payloads: `on_error` at once; a schema id the registry does not know is
//!   retried for `retry.schema_not_found_ms` first; registry outages are retried without
//!   limit and never dead-lettered; registry 401/403 stops the trigger like the dispatcher's;
//! - a panic in an attempt: that record's (or that request's records') failed attempt,
//!   retried within `retry.max_attempts`, then `on_error`.
//!
//! While waiting to retry, a run gives its concurrency permit back, so a failing key only
//! parks itself: other keys keep the trigger's full concurrency.
//!
//! The decisions are pure: [`decide()`] here, [`plan`] (what an answer means for the
//! records it answers, shared with `dlq replay`) and [`crate::dispatch::batch`].

pub(super) mod attempt;
pub(super) mod body;
mod decide;
mod error_policy;
pub mod filter;
pub(crate) mod plan;
mod span;
pub(crate) mod spawn;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::codec::Decoder;
use crate::config::TriggerConfig;
use crate::dispatch::retry::Backoff;
use crate::dispatch::HttpDispatcher;
use crate::produce::producer::IdempotentProducer;
use crate::telemetry::metrics;

pub use decide::{decide, Next, Observed, RetryPolicy};
use error_policy::sanitize;
pub use error_policy::{ORIGINAL_TIMESTAMP_HEADER, TOPIC_ID_HEADER};

/// Everything a trigger's messages need, shared by its workers.
#[derive(Debug)]
pub struct TriggerRuntime {
    /// Connection name.
    pub connection: String,
    /// Consumer group (part of the idempotency key).
    pub group: String,
    /// Trigger name.
    pub name: String,
    /// The trigger's configuration.
    pub config: TriggerConfig,
    /// Its dispatcher client.
    pub dispatcher: HttpDispatcher,
    /// The concurrency limit across all its partitions.
    pub permits: Arc<Semaphore>,
    /// Retry delays.
    pub backoff: Backoff,
    /// The connection's decoder.
    pub decoder: Decoder,
    /// The connection's idempotent producer, for dead-letter records.
    pub producer: Option<IdempotentProducer>,
    /// No dispatch of this trigger before this instant (the dispatcher's Retry-After).
    pub throttle_until: Mutex<Option<Instant>>,
    /// Set while a configuration error (401/403) keeps the trigger from dispatching.
    pub stopped: AtomicBool,
    /// Why the trigger is stopped, or why its last attempt failed (and when).
    pub last_failure: Mutex<Option<(Instant, String)>>,
    /// Whether an invalid `traceparent` header was logged already (once per trigger).
    pub warned_traceparent: AtomicBool,
    /// A permission the broker refused the last dead-letter write for (`WRITE on topic T`),
    /// and when.
    pub missing_permission: Mutex<Option<(Instant, String)>>,
    /// See [`TriggerRuntime::metrics`].
    pub metrics: std::sync::OnceLock<metrics::TriggerMetrics>,
    /// With `envelope = "cloudevents"`: how records become CloudEvents.
    pub cloudevents: Option<crate::dispatch::cloudevents::CloudEvents>,
    /// What operators see and do: the target state (paused: no new run starts), the parked
    /// keys, the recent outcomes.
    pub control: Arc<crate::control::TriggerControl>,
}

impl TriggerRuntime {
    /// The trigger's metric handles (registered on first use, once the recorder is installed).
    pub fn metrics(&self) -> &metrics::TriggerMetrics {
        self.metrics
            .get_or_init(|| metrics::TriggerMetrics::new(&self.connection, &self.name))
    }

    /// The trigger's retry settings, for [`decide()`].
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::from(&self.config.retry)
    }

    pub(super) fn throttle_deadline(&self) -> Option<Instant> {
        *self
            .throttle_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn throttle(&self, delay: Duration) {
        // `delay` is clamped to the largest backoff; the checked add keeps even a bug there from
        // panicking on Instant arithmetic.
        let Some(until) = Instant::now().checked_add(self.backoff.clamp(delay)) else {
            return;
        };
        let mut t = self
            .throttle_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if t.is_none_or(|cur| cur < until) {
            *t = Some(until);
        }
    }

    pub(super) fn failed(&self, reason: &str) {
        *self.last_failure.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), sanitize(reason)));
    }

    /// The permission the broker refused within `window`, named as the product page does.
    pub fn recent_missing_permission(&self, window: Duration) -> Option<String> {
        let last = self
            .missing_permission
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        last.as_ref()
            .filter(|(at, _)| at.elapsed() <= window)
            .map(|(_, p)| p.clone())
    }

    /// The failure reason if the trigger failed within `window`.
    pub fn recent_failure(&self, window: Duration) -> Option<String> {
        let last = self.last_failure.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref()
            .filter(|(at, _)| at.elapsed() <= window)
            .map(|(_, r)| r.clone())
    }

    pub(super) fn stop(&self, reason: &str) {
        self.failed(reason);
        if !self.stopped.swap(true, Ordering::SeqCst) {
            tracing::error!(connection = %self.connection, trigger = %self.name, error = reason,
                "trigger stopped by a configuration error; fix the credentials, messages wait and are not committed");
        }
    }

    pub(super) fn resume(&self) {
        if self.stopped.swap(false, Ordering::SeqCst) {
            tracing::info!(connection = %self.connection, trigger = %self.name, "trigger dispatching again");
        }
    }
}

/// How a started message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkOutcome {
    /// The dispatcher accepted it.
    Accepted,
    /// The error policy skipped it.
    Skipped,
    /// It was written to the dead-letter topic.
    DeadLettered,
    /// Its partition was revoked or the daemon is stopping before it was handled.
    Abandoned,
    /// The trigger's filter is false for it: handled without a run.
    Filtered,
    /// The trigger's filter could not be evaluated on it (a missing field, a wrong type):
    /// not a match, handled without a run.
    FilterError,
    /// Older than `max_record_age_ms`, skipped (`on_expired = "skip"`).
    Expired,
    /// Older than `max_record_age_ms`, written to the dead-letter topic.
    ExpiredDeadLettered,
}

impl WorkOutcome {
    /// A bounded label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Skipped => "skipped",
            Self::DeadLettered => "dead_lettered",
            Self::Abandoned => "abandoned",
            Self::Filtered => "filtered",
            Self::FilterError => "filter_error",
            Self::Expired => "expired",
            Self::ExpiredDeadLettered => "expired_dead_lettered",
        }
    }

    /// Whether the record is handled (its offset may be committed): all but `Abandoned`.
    pub fn is_handled(self) -> bool {
        self != Self::Abandoned
    }
}
