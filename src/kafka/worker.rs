//! One message's journey after it may start: decode key and value, render the event, dispatch,
//! and retry with backoff until it is handled or its partition is taken away.
//!
//! While waiting to retry, the message gives its concurrency permit back, so a failing key
//! only parks itself: other keys keep the trigger's full concurrency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::codec::{Decoded, Decoder, Disposition, Field};
use crate::config::{ErrorPolicy, TriggerConfig};
use crate::dispatch::retry::Backoff;
use crate::dispatch::{DispatchOutcome, HttpDispatcher};
use crate::event::{self, EventSource};
use crate::telemetry::metrics;

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
}

/// How a started message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkOutcome {
    /// The dispatcher accepted it.
    Accepted,
    /// The error policy skipped it.
    Skipped,
    /// Its partition was revoked or the daemon is stopping before it was accepted.
    Abandoned,
}

enum Attempt {
    Done(WorkOutcome),
    Retry { retry_after: Option<Duration> },
}

/// Processes one message until it is handled. `drain` stops further attempts (revoke,
/// shutdown) but lets an attempt in progress finish; `cancel` abandons even that.
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
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let result = tokio::select! {
            biased;
            _ = cancel.cancelled() => return WorkOutcome::Abandoned,
            r = attempt_once(&trigger, &msg, &id, &headers) => r,
        };
        let retry_after = match result {
            Attempt::Done(outcome) => return outcome,
            Attempt::Retry { retry_after } => retry_after,
        };
        // Give the permit back while waiting so that other keys keep their concurrency.
        if permit.take().is_some() {
            yielded();
        }
        let delay = trigger
            .backoff
            .delay(attempt, retry_after, rand::random::<f64>());
        tokio::select! {
            _ = drain.cancelled() => return WorkOutcome::Abandoned,
            _ = tokio::time::sleep(delay) => {}
        }
        permit = tokio::select! {
            _ = drain.cancelled() => return WorkOutcome::Abandoned,
            p = Arc::clone(&trigger.permits).acquire_owned() => match p {
                Ok(p) => Some(p),
                Err(_) => return WorkOutcome::Abandoned,
            },
        };
    }
}

async fn attempt_once(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
    id: &str,
    headers: &[event::EventHeader],
) -> Attempt {
    let (key, value) = match decode(trigger, msg).await {
        Ok(kv) => kv,
        Err((field, e)) => {
            metrics::decode_error(&trigger.connection, &trigger.name, e.class());
            let disposition = e.disposition();
            tracing::warn!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(), field = ?field,
                class = e.class(), error = %e, "cannot decode message"
            );
            return match disposition {
                Disposition::Retry | Disposition::Fatal => Attempt::Retry { retry_after: None },
                Disposition::Reject => apply_error_policy(trigger),
            };
        }
    };
    let source = EventSource {
        connection: &trigger.connection,
        trigger: &trigger.name,
        workflow: &trigger.config.workflow,
    };
    let body = event::render(source, id, msg, headers, &key, &value);
    let started = Instant::now();
    let outcome = trigger
        .dispatcher
        .dispatch(body, id, event::traceparent(headers))
        .await;
    metrics::dispatch_attempt(
        &trigger.connection,
        &trigger.name,
        outcome.label(),
        started.elapsed().as_secs_f64(),
    );
    match outcome {
        DispatchOutcome::Accepted { .. } => {
            tracing::debug!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(), "run accepted"
            );
            Attempt::Done(WorkOutcome::Accepted)
        }
        DispatchOutcome::Retryable {
            status,
            reason,
            retry_after,
        } => {
            tracing::warn!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(), status = ?status,
                error = %reason, "dispatch failed, will retry"
            );
            Attempt::Retry { retry_after }
        }
        DispatchOutcome::Rejected { status, reason } => {
            tracing::warn!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(), status, error = %reason,
                "dispatcher rejected the message"
            );
            apply_error_policy(trigger)
        }
        DispatchOutcome::Unauthorized { status, reason } => {
            tracing::error!(
                connection = %trigger.connection, trigger = %trigger.name, status, error = %reason,
                "dispatcher refused the trigger's credentials; check dispatcher.token"
            );
            Attempt::Retry {
                retry_after: Some(Duration::from_secs(30)),
            }
        }
    }
}

fn apply_error_policy(trigger: &TriggerRuntime) -> Attempt {
    match trigger.config.on_error {
        ErrorPolicy::Skip => Attempt::Done(WorkOutcome::Skipped),
        ErrorPolicy::Block => Attempt::Retry { retry_after: None },
    }
}

async fn decode(
    trigger: &TriggerRuntime,
    msg: &OwnedMessage,
) -> Result<(Decoded, Decoded), (Field, crate::codec::DecodeError)> {
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
