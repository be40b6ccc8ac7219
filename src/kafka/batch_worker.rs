//! One batch's journey (batch triggers): each record is checked for age, decoded and filtered
//! on its own (a record that needs no run is handled there), the rest go out as one request,
//! and the batch is retried, split or partly retried until every record is handled or the
//! partition is taken away.
//!
//! - 409: the batch's key was seen before, which says nothing of which events that request
//!   had accepted: the batch goes again under a key of its own, whose answer counts (a 409 to
//!   that one: every event accepted);
//! - 2xx: accepted, except the events the answer names in `{"failed": [ids]}`: those,
//!   and the later records of their keys, are sent again (as a smaller batch, with the
//!   backoff, counting against `retry.max_attempts`);
//! - 5xx, 429, timeouts, connection errors: the whole batch is retried with the backoff, then
//!   `on_error` applies to each record;
//! - 4xx (a record the dispatcher refuses): the batch is split in two halves, earlier offsets
//!   first, until the refused record is alone; `on_error` applies to it, the rest are sent;
//! - 401, 403: the trigger stops, as for single runs.
//!
//! The decisions are in [`super::batch`] (pure) and [`super::worker::decide`].

use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;

use futures::FutureExt as _;
use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::batch;
use super::worker::{
    self, acquire_permit, apply_error_policy, decide, on_decode_error, on_panic, Attempts, Failure,
    Next, Observed, Step, TriggerRuntime, WorkOutcome, STOPPED_RETRY,
};
use crate::codec::Decoded;
use crate::dispatch::cloudevents;
use crate::dispatch::event::{self, EventHeader, EventSource};
use crate::dispatch::DispatchOutcome;

/// A record of the batch.
struct Record {
    msg: OwnedMessage,
    id: String,
    headers: Vec<EventHeader>,
    attempts: Attempts,
    /// Its event, once decoded and let through by the filter: the JSON of docs/event.md or
    /// a structured CloudEvent.
    event: Option<Rendered>,
    outcome: Option<WorkOutcome>,
}

enum Rendered {
    Tessel(Vec<u8>),
    CloudEvent(serde_json::Value),
}

/// Processes the batch `msgs` (one partition's records in offset order) until each record is
/// handled or abandoned; returns each record's outcome, in the order given. `drain` stops
/// further attempts (revoke, shutdown) but lets one in progress finish; `cancel` abandons
/// even that; `yielded` is called whenever the batch gives its permit back to wait.
pub(super) async fn process(
    trigger: Arc<TriggerRuntime>,
    msgs: Vec<OwnedMessage>,
    permit: OwnedSemaphorePermit,
    drain: CancellationToken,
    cancel: CancellationToken,
    yielded: impl Fn(),
) -> Vec<WorkOutcome> {
    let mut records: Vec<Record> = msgs
        .into_iter()
        .map(|msg| Record {
            id: event::idempotency_key(&trigger.group, msg.topic(), msg.partition(), msg.offset()),
            headers: event::headers_of(&msg),
            msg,
            attempts: Attempts {
                total: 0,
                transient: 0,
                first_schema_not_found: None,
            },
            event: None,
            outcome: None,
        })
        .collect();
    let mut batch = Batch {
        conflict_nonce: None,
        trigger: &trigger,
        permit: Some(permit),
        drain: &drain,
        cancel: &cancel,
        yielded: &yielded,
    };
    let _ = batch.run(&mut records).await;
    records
        .into_iter()
        .map(|r| r.outcome.unwrap_or(WorkOutcome::Abandoned))
        .collect()
}

/// The partition was taken away (or the daemon stops): records not handled are abandoned.
struct Abandon;

struct Batch<'a, Y: Fn()> {
    trigger: &'a TriggerRuntime,
    /// Set at the first 409: later requests of this batch carry Idempotency-Keys of their
    /// own (see [`batch::conflict_key`]).
    conflict_nonce: Option<u64>,
    permit: Option<OwnedSemaphorePermit>,
    drain: &'a CancellationToken,
    cancel: &'a CancellationToken,
    yielded: &'a Y,
}

impl<Y: Fn()> Batch<'_, Y> {
    async fn run(&mut self, records: &mut [Record]) -> Result<(), Abandon> {
        for r in records.iter_mut() {
            self.prepare(r).await?;
        }
        let pending: Vec<usize> = (0..records.len())
            .filter(|&i| records[i].outcome.is_none())
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        // Groups still to send, the next on top: a rejected group is replaced by its halves,
        // the earlier one on top, so the records of a key always go out in offset order.
        let mut stack = vec![pending];
        // Transient failures of the group on top (its retry budget).
        let mut transient = 0u32;
        let mut total = 0u32;
        while let Some(group) = stack.last() {
            // Draining (revoke, shutdown): no further attempt; a batch flushed by the drain
            // itself still makes its first.
            if self.drain.is_cancelled() && total > 0 {
                return Err(Abandon);
            }
            self.wait_for_turn().await?;
            total += 1;
            let group = group.clone();
            for &i in &group {
                records[i].attempts.total += 1;
            }
            let (outcome, answer) = self.send(records, &group, total).await?;
            let policy = self.trigger.retry_policy();
            let retry_after = match outcome {
                // A 409 to a request whose key was used before (by this owner or an earlier
                // one) says the key was seen, not which events that request had accepted:
                // the group goes again under a key of its own, and the answer to that one
                // counts. A 409 to such a fresh key means every event was seen: accepted.
                DispatchOutcome::Accepted { status: 409 } if self.conflict_nonce.is_none() => {
                    self.conflict_nonce = Some(rand::random());
                    tracing::info!(
                        connection = %self.trigger.connection, trigger = %self.trigger.name,
                        records = group.len(),
                        "dispatcher answered 409 to the batch; it is sent again under its own key"
                    );
                    continue;
                }
                DispatchOutcome::Accepted { .. } => {
                    self.trigger.resume();
                    let failed = batch::failed_ids(&answer).unwrap_or_else(|reason| {
                        // Which events failed cannot be read: none counts as accepted.
                        tracing::warn!(
                            connection = %self.trigger.connection, trigger = %self.trigger.name,
                            error = %reason, "unreadable partial-failure answer; the batch is sent again"
                        );
                        group.iter().map(|&i| records[i].id.clone()).collect()
                    });
                    let keyed: Vec<(&str, Option<&[u8]>)> = group
                        .iter()
                        .map(|&i| (records[i].id.as_str(), records[i].msg.key()))
                        .collect();
                    let retry: Vec<usize> = batch::to_retry(&keyed, &failed)
                        .into_iter()
                        .map(|j| group[j])
                        .collect();
                    for &i in &group {
                        if !retry.contains(&i) {
                            self.accepted(&mut records[i]);
                        }
                    }
                    let _ = stack.pop();
                    if retry.is_empty() {
                        transient = 0;
                        continue;
                    }
                    tracing::warn!(
                        connection = %self.trigger.connection, trigger = %self.trigger.name,
                        topic = records[group[0]].msg.topic(), partition = records[group[0]].msg.partition(),
                        failed = failed.len(), retried = retry.len(),
                        "dispatcher accepted the batch but for some events; they are sent again"
                    );
                    transient += 1;
                    stack.push(retry);
                    let next = decide(
                        Observed::Retryable { retry_after: None },
                        transient,
                        &policy,
                    );
                    match self
                        .after_failure(
                            records,
                            &mut stack,
                            next,
                            "some events of the batch failed",
                            None,
                        )
                        .await
                    {
                        Some(ra) => ra,
                        None => {
                            transient = 0;
                            continue;
                        }
                    }
                }
                DispatchOutcome::Retryable {
                    status,
                    reason,
                    retry_after,
                } => {
                    self.trigger.resume();
                    if let (Some(429 | 503), Some(ra)) = (status, retry_after) {
                        self.trigger.throttle(ra);
                    }
                    transient += 1;
                    self.trigger
                        .failed(&format!("dispatcher failing: {reason}"));
                    tracing::warn!(
                        connection = %self.trigger.connection, trigger = %self.trigger.name,
                        records = group.len(), status = ?status, attempt = transient, error = %reason,
                        "batch dispatch failed, will retry"
                    );
                    let next = decide(Observed::Retryable { retry_after }, transient, &policy);
                    let message = format!("{transient} attempts failed; last: {reason}");
                    match self
                        .after_failure(records, &mut stack, next, &message, status)
                        .await
                    {
                        Some(ra) => ra,
                        None => {
                            transient = 0;
                            continue;
                        }
                    }
                }
                DispatchOutcome::Rejected { status, reason } => {
                    self.trigger.resume();
                    let _ = stack.pop();
                    if let Some((first, second)) = batch::bisect(&group) {
                        tracing::info!(
                            connection = %self.trigger.connection, trigger = %self.trigger.name,
                            records = group.len(), status, "dispatcher rejected the batch; splitting it to find the record it refuses"
                        );
                        stack.push(second);
                        stack.push(first);
                        transient = 0;
                        continue;
                    }
                    self.trigger
                        .failed(&format!("dispatcher rejected a message with HTTP {status}"));
                    stack.push(group);
                    let message = format!("dispatcher answered HTTP {status}: {reason}");
                    let next = decide(Observed::Rejected, transient, &policy);
                    match self
                        .after_failure(records, &mut stack, next, &message, Some(status))
                        .await
                    {
                        Some(ra) => ra,
                        None => {
                            transient = 0;
                            continue;
                        }
                    }
                }
                DispatchOutcome::Invalid { reason } => {
                    self.trigger
                        .failed(&format!("batch cannot be sent to the dispatcher: {reason}"));
                    let message = format!("request cannot be built: {reason}");
                    let next = decide(Observed::Invalid, transient, &policy);
                    match self
                        .after_failure(records, &mut stack, next, &message, None)
                        .await
                    {
                        Some(ra) => ra,
                        None => {
                            transient = 0;
                            continue;
                        }
                    }
                }
                DispatchOutcome::Unauthorized { status, reason } => {
                    self.trigger
                        .stop(&format!("dispatcher answered HTTP {status} ({reason})"));
                    Some(STOPPED_RETRY)
                }
            };
            self.back_off(total, retry_after).await?;
        }
        Ok(())
    }

    /// After a failure of the group on top of `stack`: `next` is [`decide`]'s verdict.
    /// Returns the Retry-After to wait before sending the group again, or None when the
    /// group is done with (each record handled by `on_error`, and the stack moved on). A
    /// record `on_error` cannot handle (`block`, a dead-letter write that failed) keeps its
    /// place in the group, which is then sent again after the backoff.
    async fn after_failure(
        &mut self,
        records: &mut [Record],
        stack: &mut Vec<Vec<usize>>,
        next: Next,
        message: &str,
        status: Option<u16>,
    ) -> Option<Option<std::time::Duration>> {
        let class = match next {
            Next::Retry { retry_after } => return Some(retry_after),
            Next::Stop => return Some(Some(STOPPED_RETRY)),
            Next::Done(_) => return None,
            Next::Fail(class) => class,
        };
        let group = stack.pop().unwrap_or_default();
        let mut left = Vec::new();
        for i in group {
            let r = &mut records[i];
            let failure = Failure {
                stage: "DISPATCH",
                class,
                message: message.to_owned(),
                status,
                schema_id: None,
            };
            match apply_error_policy(self.trigger, &r.msg, &r.id, &r.attempts, &failure).await {
                Some(outcome) => r.outcome = Some(outcome),
                None => left.push(i),
            }
        }
        if left.is_empty() {
            return None;
        }
        stack.push(left);
        Some(None)
    }

    /// One request for the records `group` of `records`.
    async fn send(
        &mut self,
        records: &[Record],
        group: &[usize],
        attempt: u32,
    ) -> Result<(DispatchOutcome, bytes::Bytes), Abandon> {
        let first = &records[group[0]].msg;
        let last = &records[group[group.len() - 1]].msg;
        let mut key = batch::idempotency_key(
            &self.trigger.group,
            first.topic(),
            first.partition(),
            first.offset(),
            last.offset(),
            group.len(),
        );
        if let Some(nonce) = self.conflict_nonce {
            key = batch::conflict_key(&key, nonce);
        }
        let (body, envelope) = if self.trigger.cloudevents.is_some() {
            let events: Vec<serde_json::Value> = group
                .iter()
                .filter_map(|&i| match &records[i].event {
                    Some(Rendered::CloudEvent(e)) => Some(e.clone()),
                    _ => None,
                })
                .collect();
            cloudevents::structured_batch(&events)
        } else {
            let events: Vec<Vec<u8>> = group
                .iter()
                .filter_map(|&i| match &records[i].event {
                    Some(Rendered::Tessel(e)) => Some(e.clone()),
                    _ => None,
                })
                .collect();
            let head = event::BatchHead {
                id: &key,
                source: event::EventSource {
                    connection: &self.trigger.connection,
                    trigger: &self.trigger.name,
                    workflow: &self.trigger.config.workflow,
                },
                topic: first.topic(),
                partition: first.partition(),
                first_offset: first.offset(),
                last_offset: last.offset(),
                count: group.len(),
            };
            (event::render_batch(&head, &events), Default::default())
        };
        let started = std::time::Instant::now();
        // With traces exported (a child of the batch's span) the run continues this span's
        // trace; the records' own traces are linked from the batch's span.
        let dispatching = if crate::telemetry::trace::exporting() {
            tracing::info_span!(
                target: crate::telemetry::trace::TARGET,
                "dispatch",
                otel.kind = "client",
                tessel.workflow = %self.trigger.config.workflow,
                tessel.attempt = i64::from(attempt),
                messaging.batch.message_count = group.len() as i64,
                tessel.dispatch.outcome = tracing::field::Empty,
            )
        } else {
            tracing::Span::none()
        };
        let traceparent = crate::telemetry::trace::traceparent_of(&dispatching);
        let request = self
            .trigger
            .dispatcher
            .dispatch_batch(body, &key, traceparent.as_deref(), envelope)
            .instrument(dispatching.clone());
        let answer = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(Abandon),
            a = request => a,
        };
        dispatching.record("tessel.dispatch.outcome", answer.0.label());
        self.trigger
            .metrics()
            .dispatch_attempt(answer.0.label(), started.elapsed().as_secs_f64());
        tracing::debug!(
            connection = %self.trigger.connection, trigger = %self.trigger.name,
            topic = first.topic(), partition = first.partition(), first_offset = first.offset(),
            last_offset = last.offset(), records = group.len(), attempt, outcome = answer.0.label(),
            "batch dispatched"
        );
        Ok(answer)
    }

    fn accepted(&self, r: &mut Record) {
        r.outcome = Some(WorkOutcome::Accepted);
        if let Some(ts) = r.msg.timestamp().to_millis() {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            self.trigger
                .metrics()
                .end_to_end((now_ms - ts).max(0) as f64 / 1000.0);
        }
    }

    /// Age, decoding and the filter for one record, retried as a single run's would be; sets
    /// its outcome when it needs no run (or `on_error` handled it), its event otherwise.
    async fn prepare(&mut self, r: &mut Record) -> Result<(), Abandon> {
        if event::has_invalid_traceparent(&r.headers)
            && !self
                .trigger
                .warned_traceparent
                .swap(true, AtomicOrdering::Relaxed)
        {
            tracing::warn!(
                connection = %self.trigger.connection, trigger = %self.trigger.name, topic = r.msg.topic(),
                partition = r.msg.partition(), offset = r.msg.offset(),
                "record carries a traceparent header that is not W3C trace context; ignored (said once per trigger)"
            );
        }
        loop {
            r.attempts.total += 1;
            let attempt = std::panic::AssertUnwindSafe(self.screen(r)).catch_unwind();
            let step = tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return Err(Abandon),
                s = attempt => s,
            };
            let step = match step {
                Ok(Ok(event)) => {
                    r.event = Some(event);
                    return Ok(());
                }
                Ok(Err(step)) => step,
                Err(panic) => on_panic(self.trigger, &r.msg, &*panic, &mut r.attempts),
            };
            let retry_after = match step {
                Step::Done(outcome) => {
                    r.outcome = Some(outcome);
                    return Ok(());
                }
                Step::Retry { retry_after } => retry_after,
                Step::Fail(failure) => {
                    match apply_error_policy(self.trigger, &r.msg, &r.id, &r.attempts, &failure)
                        .await
                    {
                        Some(outcome) => {
                            r.outcome = Some(outcome);
                            return Ok(());
                        }
                        None => None,
                    }
                }
            };
            self.back_off(r.attempts.total, retry_after).await?;
        }
    }

    /// The record's event, or the step it takes instead.
    async fn screen(&self, r: &mut Record) -> Result<Rendered, Step> {
        let trigger = self.trigger;
        if let Some(step) = worker::expired(trigger, &r.msg) {
            return Err(step);
        }
        let (key, value): (Decoded, Decoded) = match worker::decode(trigger, &r.msg).await {
            Ok(kv) => {
                trigger.metrics().decoded(kv.1.schema.format);
                kv
            }
            Err((field, e)) => {
                return Err(on_decode_error(trigger, &r.msg, field, &e, &mut r.attempts))
            }
        };
        if let Some(outcome) = super::filter::screen(trigger, &r.msg, &r.headers, &key, &value) {
            return Err(Step::Done(outcome));
        }
        Ok(match &trigger.cloudevents {
            Some(ce) => Rendered::CloudEvent(
                ce.structured(&cloudevents::ce_record(&r.id, &r.msg, &key, &value)),
            ),
            None => {
                let source = EventSource {
                    connection: &trigger.connection,
                    trigger: &trigger.name,
                    workflow: &trigger.config.workflow,
                };
                Rendered::Tessel(event::render(
                    source, &r.id, &r.msg, &r.headers, &key, &value,
                ))
            }
        })
    }

    /// Waits for the trigger's throttle and a permit (given back while waiting).
    async fn wait_for_turn(&mut self) -> Result<(), Abandon> {
        if let Some(until) = self
            .trigger
            .throttle_deadline()
            .filter(|u| *u > Instant::now())
        {
            if self.permit.take().is_some() {
                (self.yielded)();
            }
            tokio::select! {
                _ = self.drain.cancelled() => return Err(Abandon),
                _ = tokio::time::sleep_until(until) => {}
            }
        }
        if self.permit.is_none() {
            match acquire_permit(self.trigger, self.drain).await {
                Some(p) => self.permit = Some(p),
                None => return Err(Abandon),
            }
        }
        Ok(())
    }

    /// Gives the permit back and waits the backoff; Abandon when draining.
    async fn back_off(
        &mut self,
        attempt: u32,
        retry_after: Option<std::time::Duration>,
    ) -> Result<(), Abandon> {
        if self.permit.take().is_some() {
            (self.yielded)();
        }
        let delay = self
            .trigger
            .backoff
            .delay(attempt, retry_after, rand::random::<f64>());
        tokio::select! {
            _ = self.drain.cancelled() => Err(Abandon),
            _ = tokio::time::sleep(delay) => Ok(()),
        }
    }
}
