//! One message's journey after it may start: decode key and value, render the event, dispatch,
//! and retry until it is handled (accepted, skipped or dead-lettered) or its partition is taken
//! away.
//!
//! Outcomes, per the trigger's configuration:
//! - dispatcher 2xx or 409: accepted;
//! - 429 and 503: retried after the dispatcher's Retry-After, and the whole trigger waits that
//!   long before its next dispatch;
//! - other 5xx, timeouts, connection errors: retried with exponential backoff and jitter, up to
//!   `retry.max_attempts` (0: until the dispatcher recovers), then `on_error`;
//! - 400, 404, 410, 422 and other 4xx: rejected, `on_error` applies;
//! - 401 and 403: a configuration error. The trigger is marked stopped, says why, and retries
//!   every 30 s; such messages are never dead-lettered;
//! - undecodable payloads: `on_error` at once; a schema id the registry does not know is
//!   retried for `retry.schema_not_found_ms` first; registry outages are retried without
//!   limit and never dead-lettered; registry 401/403 stops the trigger like the dispatcher's.
//!
//! While waiting to retry, the message gives its concurrency permit back, so a failing key
//! only parks itself: other keys keep the trigger's full concurrency.

use futures::FutureExt as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::Instrument as _;

use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::codec::{DecodeError, Decoded, Decoder, Disposition, Field};
use crate::config::{ErrorPolicy, ExpiredPolicy, TriggerConfig};
use crate::dispatch::event::{self, EventSource};
use crate::dispatch::retry::Backoff;
use crate::dispatch::{DispatchOutcome, HttpDispatcher};
use crate::produce::producer::{ExtraHeader, IdempotentProducer};
use crate::telemetry::metrics;

use super::record_age;

/// How long a trigger stopped by a configuration error waits between attempts.
pub(super) const STOPPED_RETRY: Duration = Duration::from_secs(30);

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
}

impl TriggerRuntime {
    /// The trigger's metric handles (registered on first use, once the recorder is installed).
    pub fn metrics(&self) -> &metrics::TriggerMetrics {
        self.metrics
            .get_or_init(|| metrics::TriggerMetrics::new(&self.connection, &self.name))
    }

    /// The trigger's retry settings, for [`decide`].
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.config.retry.max_attempts,
            schema_not_found: Duration::from_millis(self.config.retry.schema_not_found_ms),
        }
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

/// Why a message is handed to the error policy.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    /// `KEY_DESERIALIZE`, `VALUE_DESERIALIZE` or `DISPATCH`.
    pub(super) stage: &'static str,
    /// Stable error class.
    pub(super) class: &'static str,
    /// Sanitised, one line.
    pub(super) message: String,
    pub(super) status: Option<u16>,
    pub(super) schema_id: Option<u32>,
}

pub(super) enum Step {
    Done(WorkOutcome),
    Retry { retry_after: Option<Duration> },
    Fail(Failure),
}

impl Step {
    /// The step [`decide`] chose; `failure` describes the failure, given its class, when
    /// `on_error` applies.
    fn of(next: Next, failure: impl FnOnce(&'static str) -> Failure) -> Self {
        match next {
            Next::Done(outcome) => Step::Done(outcome),
            Next::Retry { retry_after } => Step::Retry { retry_after },
            Next::Stop => Step::Retry {
                retry_after: Some(STOPPED_RETRY),
            },
            Next::Fail(class) => Step::Fail(failure(class)),
        }
    }
}

/// What one attempt observed, as far as the next step depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// The dispatcher accepted the run (2xx, or 409 for a run it already has).
    Accepted,
    /// A transient dispatch failure (5xx, 429, timeout, connection error).
    Retryable {
        /// The dispatcher's Retry-After, if it sent one.
        retry_after: Option<Duration>,
    },
    /// The dispatcher refused this message (4xx other than 401, 403, 409, 429).
    Rejected,
    /// No request can be built from this record.
    Invalid,
    /// The dispatcher refused the connector's credentials (401, 403).
    Unauthorized,
    /// The key or value could not be decoded.
    Undecodable {
        /// What the error means.
        disposition: Disposition,
        /// The registry does not know the schema id (yet).
        schema_not_found: bool,
        /// Since the schema id was first found missing.
        missing_for: Duration,
    },
    /// The attempt panicked.
    Panicked,
}

/// The retry settings [`decide`] applies.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Transient failures before `on_error` applies (0: no limit).
    pub max_attempts: u32,
    /// How long an unknown schema id is retried before `on_error` applies.
    pub schema_not_found: Duration,
}

/// What happens next to a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// It is handled.
    Done(WorkOutcome),
    /// Try again after the backoff (or the dispatcher's Retry-After).
    Retry {
        /// The dispatcher's Retry-After.
        retry_after: Option<Duration>,
    },
    /// `on_error` applies, with this error class.
    Fail(&'static str),
    /// A configuration error: the trigger stops and tries again every 30 s.
    Stop,
}

/// The next step for a message after an attempt: `transient` counts its transient failures,
/// this attempt's included. Pure; every branch is unit-tested.
pub fn decide(observed: Observed, transient: u32, policy: &RetryPolicy) -> Next {
    match observed {
        Observed::Accepted => Next::Done(WorkOutcome::Accepted),
        Observed::Retryable { retry_after } => {
            if policy.max_attempts > 0 && transient >= policy.max_attempts {
                Next::Fail("retries_exhausted")
            } else {
                Next::Retry { retry_after }
            }
        }
        Observed::Rejected => Next::Fail("dispatch_rejected"),
        Observed::Invalid => Next::Fail("request_invalid"),
        Observed::Unauthorized => Next::Stop,
        Observed::Undecodable {
            disposition,
            schema_not_found,
            missing_for,
        } => match disposition {
            Disposition::Reject => Next::Fail("decode"),
            Disposition::Retry if schema_not_found && missing_for >= policy.schema_not_found => {
                Next::Fail("decode")
            }
            Disposition::Retry => Next::Retry { retry_after: None },
            Disposition::Fatal => Next::Stop,
        },
        // A panic is retried like a transient failure, but never without limit: a record
        // that panics the decoder would otherwise block its key for ever.
        Observed::Panicked => {
            if transient >= policy.max_attempts.max(1) {
                Next::Fail("worker_panic")
            } else {
                Next::Retry { retry_after: None }
            }
        }
    }
}

/// Per-message retry state.
pub(super) struct Attempts {
    pub(super) total: u32,
    pub(super) transient: u32,
    pub(super) first_schema_not_found: Option<Instant>,
}

/// Processes one message until it is handled. `drain` stops further attempts (revoke,
/// shutdown) but lets an attempt in progress finish; `cancel` abandons even that. `yielded` is
/// called whenever the worker gives its permit back to wait.
pub async fn process(
    trigger: Arc<TriggerRuntime>,
    msg: OwnedMessage,
    mut permit: Option<OwnedSemaphorePermit>,
    drain: CancellationToken,
    cancel: CancellationToken,
    yielded: impl Fn(),
) -> WorkOutcome {
    let id = event::idempotency_key(&trigger.group, msg.topic(), msg.partition(), msg.offset());
    let headers = event::headers_of(&msg);
    if event::has_invalid_traceparent(&headers)
        && !trigger.warned_traceparent.swap(true, Ordering::Relaxed)
    {
        tracing::warn!(
            connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
            partition = msg.partition(), offset = msg.offset(),
            "record carries a traceparent header that is not W3C trace context; ignored (said once per trigger)"
        );
    }
    let mut attempts = Attempts {
        total: 0,
        transient: 0,
        first_schema_not_found: None,
    };
    loop {
        if let Some(until) = trigger.throttle_deadline().filter(|u| *u > Instant::now()) {
            // A throttled trigger holds no permit while it waits: other triggers' keys and
            // this trigger's retries compete for the permits as usual afterwards.
            if permit.take().is_some() {
                yielded();
            }
            tokio::select! {
                _ = drain.cancelled() => return WorkOutcome::Abandoned,
                _ = tokio::time::sleep_until(until) => {}
            }
        }
        if permit.is_none() {
            match acquire_permit(&trigger, &drain).await {
                Some(p) => permit = Some(p),
                None => return WorkOutcome::Abandoned,
            }
        }
        attempts.total += 1;
        // A panic while decoding or dispatching (a decoder bug a record's bytes reach) is
        // contained here: counted, logged with the record's coordinates, and treated as a
        // failed attempt, so the retry policy and then `on_error` apply and the key moves.
        let attempt = std::panic::AssertUnwindSafe(attempt_once(
            &trigger,
            &msg,
            &id,
            &headers,
            &mut attempts,
        ))
        .catch_unwind();
        let result = tokio::select! {
            biased;
            _ = cancel.cancelled() => return WorkOutcome::Abandoned,
            s = attempt => s,
        };
        let step = result.unwrap_or_else(|panic| on_panic(&trigger, &msg, &*panic, &mut attempts));
        let retry_after = match step {
            Step::Done(outcome) => return outcome,
            Step::Retry { retry_after } => retry_after,
            Step::Fail(failure) => {
                match apply_error_policy(&trigger, &msg, &id, &attempts, &failure).await {
                    Some(outcome) => return outcome,
                    None => None,
                }
            }
        };
        // Give the permit back while waiting so that other keys keep their concurrency.
        if permit.take().is_some() {
            yielded();
        }
        let delay = trigger
            .backoff
            .delay(attempts.total, retry_after, rand::random::<f64>());
        tokio::select! {
            _ = drain.cancelled() => return WorkOutcome::Abandoned,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// A permit for a retry. Retries do not queue for a permit: a queued waiter would take every
/// permit that frees up ahead of the partition's fresh messages, and a key that keeps failing
/// (or a schema the registry cannot serve) would starve the other keys. They try now and
/// then. None when draining.
pub(super) async fn acquire_permit(
    trigger: &TriggerRuntime,
    drain: &CancellationToken,
) -> Option<OwnedSemaphorePermit> {
    loop {
        match Arc::clone(&trigger.permits).try_acquire_owned() {
            Ok(p) => return Some(p),
            Err(tokio::sync::TryAcquireError::Closed) => return None,
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                let pause = Duration::from_millis(10 + rand::random::<u64>() % 20);
                tokio::select! {
                    _ = drain.cancelled() => return None,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}

/// A panic inside one attempt: counted and logged; the attempt failed like a transient
/// dispatch failure, so `retry.max_attempts` and then `on_error` decide.
/// The text a panic carried (`panic!` with a literal or with formatting).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

pub(super) fn on_panic(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    panic: &(dyn std::any::Any + Send),
    attempts: &mut Attempts,
) -> Step {
    let what = panic_message(panic);
    metrics::worker_panic(&trigger.connection, &trigger.name);
    attempts.transient += 1;
    trigger.failed(&format!("worker panicked on a record: {what}"));
    tracing::error!(
        connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
        partition = msg.partition(), offset = msg.offset(), attempt = attempts.transient,
        error = %sanitize(&what), "worker panicked while handling the record; it is retried per the trigger's retry policy, then on_error applies"
    );
    Step::of(
        decide(
            Observed::Panicked,
            attempts.transient,
            &trigger.retry_policy(),
        ),
        |class| Failure {
            stage: "DISPATCH",
            class,
            message: format!("worker panicked: {what}"),
            status: None,
            schema_id: None,
        },
    )
}

async fn attempt_once(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    id: &str,
    headers: &[event::EventHeader],
    attempts: &mut Attempts,
) -> Step {
    if let Some(step) = expired(trigger, msg) {
        return step;
    }
    let traced = crate::telemetry::trace::exporting();
    let decoded = if traced {
        let decoding = tracing::info_span!(target: crate::telemetry::trace::TARGET, "decode");
        decode(trigger, msg).instrument(decoding).await
    } else {
        decode(trigger, msg).await
    };
    let (key, value) = match decoded {
        Ok(kv) => {
            trigger.metrics().decoded(kv.1.schema.format);
            kv
        }
        Err((field, e)) => return on_decode_error(trigger, msg, field, &e, attempts),
    };
    if let Some(outcome) = super::filter::screen(trigger, msg, headers, &key, &value) {
        return Step::Done(outcome);
    }
    let source = EventSource {
        connection: &trigger.connection,
        trigger: &trigger.name,
        workflow: &trigger.config.workflow,
    };
    let (body, envelope) = crate::dispatch::cloudevents::request(
        trigger.cloudevents.as_ref(),
        source,
        id,
        msg,
        headers,
        &key,
        &value,
    );
    let started = std::time::Instant::now();
    let outcome = if traced {
        let dispatching = tracing::info_span!(
            target: crate::telemetry::trace::TARGET,
            "dispatch",
            otel.kind = "client",
            tessel.workflow = %trigger.config.workflow,
            tessel.attempt = i64::from(attempts.total),
            tessel.dispatch.outcome = tracing::field::Empty,
        );
        // With traces exported the run continues this span's trace.
        let traceparent = crate::telemetry::trace::traceparent_of(&dispatching);
        let outcome = trigger
            .dispatcher
            .dispatch_with(
                body,
                id,
                traceparent.as_deref().or(event::traceparent(headers)),
                envelope,
            )
            .instrument(dispatching.clone())
            .await;
        dispatching.record("tessel.dispatch.outcome", outcome.label());
        outcome
    } else {
        // Otherwise the message's own trace, if it carries one.
        trigger
            .dispatcher
            .dispatch_with(body, id, event::traceparent(headers), envelope)
            .await
    };
    trigger
        .metrics()
        .dispatch_attempt(outcome.label(), started.elapsed().as_secs_f64());
    // What the outcome was, with what `on_error` would be told; then one decision.
    let (observed, message, status) = match outcome {
        DispatchOutcome::Accepted { .. } => {
            trigger.resume();
            if let Some(ts) = msg.timestamp().to_millis() {
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                trigger
                    .metrics()
                    .end_to_end((now_ms - ts).max(0) as f64 / 1000.0);
            }
            tracing::debug!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(), "run accepted"
            );
            (Observed::Accepted, String::new(), None)
        }
        DispatchOutcome::Retryable {
            status,
            reason,
            retry_after,
        } => {
            trigger.resume();
            if let (Some(429 | 503), Some(ra)) = (status, retry_after) {
                trigger.throttle(ra);
            }
            attempts.transient += 1;
            trigger.failed(&format!("dispatcher failing: {reason}"));
            tracing::warn!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(), status = ?status,
                attempt = attempts.transient, error = %reason, "dispatch failed, will retry"
            );
            let message = format!("{} attempts failed; last: {reason}", attempts.transient);
            (Observed::Retryable { retry_after }, message, status)
        }
        DispatchOutcome::Rejected { status, reason } => {
            trigger.resume();
            trigger.failed(&format!("dispatcher rejected a message with HTTP {status}"));
            tracing::warn!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(), status, error = %reason,
                "dispatcher rejected the message"
            );
            let message = format!("dispatcher answered HTTP {status}: {reason}");
            (Observed::Rejected, message, Some(status))
        }
        DispatchOutcome::Invalid { reason } => {
            trigger.failed(&format!(
                "record cannot be sent to the dispatcher: {reason}"
            ));
            tracing::warn!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(), error = %reason,
                "record cannot be sent to the dispatcher"
            );
            let message = format!("request cannot be built: {reason}");
            (Observed::Invalid, message, None)
        }
        DispatchOutcome::Unauthorized { status, reason } => {
            trigger.stop(&format!("dispatcher answered HTTP {status} ({reason})"));
            (Observed::Unauthorized, String::new(), Some(status))
        }
    };
    let schema_id = value.schema.id;
    Step::of(
        decide(observed, attempts.transient, &trigger.retry_policy()),
        |class| Failure {
            stage: "DISPATCH",
            class,
            message,
            status,
            schema_id,
        },
    )
}

pub(super) fn on_decode_error(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    field: Field,
    e: &DecodeError,
    attempts: &mut Attempts,
) -> Step {
    metrics::decode_error(&trigger.connection, &trigger.name, e.class());
    trigger.failed(&format!(
        "cannot decode {}[{}] offset {}: {}",
        msg.topic(),
        msg.partition(),
        msg.offset(),
        e.class()
    ));
    if matches!(e, DecodeError::Registry(_)) {
        metrics::registry_error(&trigger.connection, e.class());
    }
    tracing::warn!(
        connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
        partition = msg.partition(), offset = msg.offset(), field = ?field,
        class = e.class(), error = %e, "cannot decode message"
    );
    let failure = || Failure {
        stage: if field == Field::Key {
            "KEY_DESERIALIZE"
        } else {
            "VALUE_DESERIALIZE"
        },
        class: e.class(),
        message: e.to_string(),
        status: None,
        schema_id: e.schema_id(),
    };
    let schema_not_found = e.class() == "schema_not_found";
    let missing_for = if schema_not_found {
        attempts
            .first_schema_not_found
            .get_or_insert_with(Instant::now)
            .elapsed()
    } else {
        Duration::ZERO
    };
    let observed = Observed::Undecodable {
        disposition: e.disposition(),
        schema_not_found,
        missing_for,
    };
    let next = decide(observed, attempts.transient, &trigger.retry_policy());
    if next == Next::Stop {
        trigger.stop(&e.to_string());
    }
    // The failure keeps the decoder's own class.
    Step::of(next, |_| failure())
}

/// Applies `on_error`; None means "not handled, retry later".
pub(super) async fn apply_error_policy(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    id: &str,
    attempts: &Attempts,
    failure: &Failure,
) -> Option<WorkOutcome> {
    // An expired record reaches here only with on_expired = "dead_letter".
    let expired = failure.stage == record_age::STAGE;
    let policy = if expired {
        ErrorPolicy::DeadLetter
    } else {
        trigger.config.on_error
    };
    match policy {
        ErrorPolicy::Block => None,
        ErrorPolicy::Skip => {
            tracing::warn!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(), class = failure.class,
                error = %failure.message, "message skipped by on_error = skip"
            );
            Some(WorkOutcome::Skipped)
        }
        ErrorPolicy::DeadLetter => {
            let (Some(producer), Some(topic)) =
                (&trigger.producer, &trigger.config.dead_letter_topic)
            else {
                return None;
            };
            let extra = dead_letter_headers(trigger, msg, id, attempts, failure);
            match producer.write_copy(topic, msg, &extra).await {
                Ok((partition, offset)) => {
                    tracing::warn!(
                        connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                        partition = msg.partition(), offset = msg.offset(), class = failure.class,
                        dead_letter_topic = %topic, dead_letter_partition = partition,
                        dead_letter_offset = offset, error = %failure.message, "message dead-lettered"
                    );
                    Some(if expired {
                        WorkOutcome::ExpiredDeadLettered
                    } else {
                        WorkOutcome::DeadLettered
                    })
                }
                Err(e) => {
                    let fatal = producer.fatal_error();
                    let reason =
                        match crate::produce::producer::refused_write(&e, fatal.as_ref(), topic) {
                            Some(reason) => {
                                *trigger
                                    .missing_permission
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner()) =
                                    Some((Instant::now(), format!("WRITE on topic {topic}")));
                                reason
                            }
                            None => e.to_string(),
                        };
                    trigger.failed(&format!("cannot write to the dead-letter topic: {reason}"));
                    tracing::error!(
                        connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                        partition = msg.partition(), offset = msg.offset(), dead_letter_topic = %topic,
                        error = %reason, "cannot write to the dead-letter topic; the offset is not committed and the write is retried"
                    );
                    None
                }
            }
        }
    }
}

/// The dead letter's header with the original record's timestamp, in milliseconds since the
/// epoch (absent when the record had none).
pub const ORIGINAL_TIMESTAMP_HEADER: &str = "tessel.original.timestamp.ms";

/// The Kafka Connect error headers (UTF-8 strings) plus the connector's own `tessel.*`.
fn dead_letter_headers(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    id: &str,
    attempts: &Attempts,
    failure: &Failure,
) -> Vec<ExtraHeader> {
    let message = sanitize(&failure.message);
    let mut h: Vec<ExtraHeader> = vec![
        ("__connect.errors.topic".into(), msg.topic().to_owned()),
        (
            "__connect.errors.partition".into(),
            msg.partition().to_string(),
        ),
        ("__connect.errors.offset".into(), msg.offset().to_string()),
        (
            "__connect.errors.connector.name".into(),
            format!("tessel-kafka/{}", trigger.connection),
        ),
        ("__connect.errors.stage".into(), failure.stage.to_owned()),
        (
            "__connect.errors.class.name".into(),
            "tessel-kafka".to_owned(),
        ),
        (
            "__connect.errors.exception.class.name".into(),
            format!("tessel.{}", failure.class),
        ),
        ("__connect.errors.exception.message".into(), message),
        ("tessel.trigger".into(), trigger.name.clone()),
        ("tessel.consumer.group".into(), trigger.group.clone()),
        ("tessel.stage".into(), failure.stage.to_owned()),
        ("tessel.error.class".into(), failure.class.to_owned()),
        ("tessel.attempts".into(), attempts.total.to_string()),
        ("tessel.idempotency.key".into(), id.to_owned()),
    ];
    if let Some(s) = failure.status {
        h.push(("tessel.http.status".into(), s.to_string()));
    }
    if let Some(sid) = failure.schema_id {
        h.push(("tessel.schema.id".into(), sid.to_string()));
    }
    if let Some(t) = msg.timestamp().to_millis() {
        // The copy is written with the time of writing; the record's own time travels here.
        h.push((ORIGINAL_TIMESTAMP_HEADER.into(), t.to_string()));
    }
    if failure.stage == record_age::STAGE {
        let age = record_age::age_ms(msg.timestamp().to_millis(), record_age::now_ms());
        h.push((record_age::AGE_HEADER.into(), age.unwrap_or(0).to_string()));
    }
    h
}

/// `max_record_age_ms`: the step for a record older than that (skipped, or handed to the
/// dead-letter path with stage `RECORD_AGE`); None when it may run.
pub(super) fn expired(trigger: &TriggerRuntime, msg: &OwnedMessage) -> Option<Step> {
    let max = trigger.config.max_record_age_ms?;
    let age = record_age::expired(msg.timestamp().to_millis(), record_age::now_ms(), Some(max))?;
    tracing::debug!(
        connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
        partition = msg.partition(), offset = msg.offset(), age_ms = age,
        "record older than max_record_age_ms; no run"
    );
    Some(match trigger.config.on_expired {
        ExpiredPolicy::Skip => Step::Done(WorkOutcome::Expired),
        ExpiredPolicy::DeadLetter => Step::Fail(Failure {
            stage: record_age::STAGE,
            class: record_age::CLASS,
            message: format!("record is {age} ms old, older than max_record_age_ms = {max}"),
            status: None,
            schema_id: None,
        }),
    })
}

/// One line, bounded, with credentials in URLs (user info, secret query values) removed.
pub(super) fn sanitize(message: &str) -> String {
    let one_line: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    crate::config::redact_text(&one_line)
        .chars()
        .take(500)
        .collect()
}

pub(super) async fn decode(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
) -> Result<(Decoded, Decoded), (Field, DecodeError)> {
    let cfg = &trigger.config;
    let key = trigger
        .decoder
        .decode(cfg.key_format, msg.key(), msg.topic(), Field::Key)
        .await
        .map_err(|e| (Field::Key, e))?;
    let value = trigger
        .decoder
        .decode(cfg.value_format, msg.payload(), msg.topic(), Field::Value)
        .await
        .map_err(|e| (Field::Value, e))?;
    Ok((key, value))
}

#[cfg(test)]
mod tests {
    use super::{
        decide, panic_message, sanitize, Disposition, Next, Observed, RetryPolicy, WorkOutcome,
    };
    use std::time::Duration;

    /// A panic inside an attempt is contained where the worker awaits the attempt, and what
    /// it said becomes the failure's message (then the retry policy and `on_error` apply, as
    /// `decide(Observed::Panicked, …)` below shows). Tested here rather than through a hook
    /// compiled into the binary the broker tests run.
    #[tokio::test]
    async fn a_panic_in_an_attempt_is_contained_with_its_message() {
        use futures::FutureExt as _;
        let n = 7;
        let caught = std::panic::AssertUnwindSafe(async move {
            assert!(n == 0, "decoder bug at {n}");
        })
        .catch_unwind()
        .await
        .expect_err("the panic is caught");
        assert_eq!(panic_message(&*caught), "decoder bug at 7");
        let caught = std::panic::AssertUnwindSafe(async { panic!("literal") })
            .catch_unwind()
            .await
            .expect_err("the panic is caught");
        assert_eq!(panic_message(&*caught), "literal");
    }

    const POLICY: RetryPolicy = RetryPolicy {
        max_attempts: 3,
        schema_not_found: Duration::from_secs(60),
    };
    const UNLIMITED: RetryPolicy = RetryPolicy {
        max_attempts: 0,
        ..POLICY
    };

    #[test]
    fn an_accepted_run_is_done() {
        assert_eq!(
            decide(Observed::Accepted, 0, &POLICY),
            Next::Done(WorkOutcome::Accepted)
        );
    }

    #[test]
    fn transient_failures_retry_until_the_budget_then_fail() {
        let ra = Some(Duration::from_secs(2));
        let observed = Observed::Retryable { retry_after: ra };
        assert_eq!(
            decide(observed, 1, &POLICY),
            Next::Retry { retry_after: ra }
        );
        assert_eq!(
            decide(observed, 2, &POLICY),
            Next::Retry { retry_after: ra }
        );
        assert_eq!(
            decide(observed, 3, &POLICY),
            Next::Fail("retries_exhausted")
        );
        // max_attempts = 0: until the dispatcher recovers.
        assert_eq!(
            decide(observed, 1_000_000, &UNLIMITED),
            Next::Retry { retry_after: ra }
        );
    }

    #[test]
    fn rejections_and_invalid_requests_fail_at_once_and_credentials_stop_the_trigger() {
        assert_eq!(
            decide(Observed::Rejected, 0, &UNLIMITED),
            Next::Fail("dispatch_rejected")
        );
        assert_eq!(
            decide(Observed::Invalid, 0, &UNLIMITED),
            Next::Fail("request_invalid")
        );
        assert_eq!(decide(Observed::Unauthorized, 9, &POLICY), Next::Stop);
    }

    #[test]
    fn decode_errors_follow_their_disposition() {
        let undecodable = |disposition, schema_not_found, missing_for| Observed::Undecodable {
            disposition,
            schema_not_found,
            missing_for,
        };
        let reject = undecodable(Disposition::Reject, false, Duration::ZERO);
        assert_eq!(decide(reject, 0, &POLICY), Next::Fail("decode"));
        // A registry outage is retried without limit, whatever max_attempts says.
        let outage = undecodable(Disposition::Retry, false, Duration::ZERO);
        assert_eq!(
            decide(outage, 50, &POLICY),
            Next::Retry { retry_after: None }
        );
        // An unknown schema id is retried for schema_not_found, then fails.
        let missing = |d| undecodable(Disposition::Retry, true, d);
        assert_eq!(
            decide(missing(Duration::from_secs(59)), 0, &POLICY),
            Next::Retry { retry_after: None }
        );
        assert_eq!(
            decide(missing(Duration::from_secs(60)), 0, &POLICY),
            Next::Fail("decode")
        );
        let fatal = undecodable(Disposition::Fatal, false, Duration::ZERO);
        assert_eq!(decide(fatal, 0, &POLICY), Next::Stop);
    }

    #[test]
    fn a_panic_is_retried_within_the_budget_and_never_without_limit() {
        assert_eq!(
            decide(Observed::Panicked, 1, &POLICY),
            Next::Retry { retry_after: None }
        );
        assert_eq!(
            decide(Observed::Panicked, 3, &POLICY),
            Next::Fail("worker_panic")
        );
        assert_eq!(
            decide(Observed::Panicked, 1, &UNLIMITED),
            Next::Fail("worker_panic")
        );
    }

    #[test]
    fn sanitize_removes_credentials_and_newlines() {
        assert_eq!(
            sanitize("GET https://u:p4ss@host/x failed\nnext"),
            "GET https://***@host/x failed next"
        );
        assert_eq!(
            sanitize("error sending request for url (http://user:s3cr3t@host/runs?token=abc&x=1)"),
            "error sending request for url (http://***@host/runs?token=***&x=1)"
        );
        assert_eq!(sanitize("plain"), "plain");
        assert_eq!(sanitize(&"x".repeat(900)).len(), 500);
    }
}
