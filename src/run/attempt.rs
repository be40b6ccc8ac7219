//! The run loop: one run's records (one for a single trigger, a batch for a batch trigger)
//! from their start until each is handled or the partition is taken away.
//!
//! Each attempt waits for the trigger's throttle and a permit, screens the records still to
//! send (age, decoding, the filter: a record that needs no run is handled there), renders
//! them, sends one request ([`body`]) and reads the answer; then the records not handled are
//! sent again after the backoff, split (a batch a 4xx refused) or handed to `on_error`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use rdkafka::message::{Message, OwnedMessage};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::body::{self, Rendered};
use super::decide::{Attempts, Failure, Step};
use super::error_policy::{
    apply_error_policy, expired, on_decode_error, on_panic, operator_skip, OperatorSkip,
};
use super::plan::{self, Member, Verdict};
use super::{TriggerRuntime, WorkOutcome};
use crate::codec::{DecodeError, Decoded, Field};
use crate::control::{ActionError, ActionOutcome, Directive, ParkedKey, ParkedRun};
use crate::dispatch::event::{self, EventHeader};
use crate::dispatch::DispatchOutcome;
use crate::telemetry::trace;

/// A record of the run.
pub(super) struct Record<'m> {
    pub(super) msg: &'m OwnedMessage,
    /// Its idempotency key (a single event's key, a batch event's id).
    pub(super) id: String,
    headers: Vec<EventHeader>,
    attempts: Attempts,
    /// Its part of this attempt's request, once screened and let through by the filter.
    pub(super) event: Option<Rendered>,
    /// The value's schema id, as this attempt decoded it (for a dead letter).
    schema_id: Option<u32>,
    outcome: Option<WorkOutcome>,
}

impl<'m> Record<'m> {
    fn new(trigger: &TriggerRuntime, topic_id: Option<&str>, msg: &'m OwnedMessage) -> Self {
        let headers = event::headers_of(msg);
        if event::has_invalid_traceparent(&headers)
            && !trigger.warned_traceparent.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                partition = msg.partition(), offset = msg.offset(),
                "record carries a traceparent header that is not W3C trace context; ignored (said once per trigger)"
            );
        }
        Self {
            id: event::idempotency_key(
                &trigger.group,
                msg.topic(),
                topic_id,
                msg.partition(),
                msg.offset(),
            ),
            headers,
            msg,
            attempts: Attempts::default(),
            event: None,
            schema_id: None,
            outcome: None,
        }
    }
}

/// Processes the run `msgs` (one partition's records in offset order; one record for a
/// single trigger) until each record is handled or abandoned; returns each record's outcome,
/// in the order given. `drain` stops further attempts (revoke, shutdown) but lets one in
/// progress finish; `cancel` abandons even that; `yielded` is called whenever the run gives
/// its permit back to wait.
pub(super) async fn process(
    trigger: Arc<TriggerRuntime>,
    topic_id: Option<Arc<str>>,
    msgs: &[OwnedMessage],
    permit: OwnedSemaphorePermit,
    drain: CancellationToken,
    cancel: CancellationToken,
    yielded: impl Fn(),
) -> Vec<WorkOutcome> {
    let mut records: Vec<Record<'_>> = msgs
        .iter()
        .map(|msg| Record::new(&trigger, topic_id.as_deref(), msg))
        .collect();
    let mut run = Run {
        batch: body::is_batch(&trigger, records.len()),
        conflict_nonce: None,
        topic_id: topic_id.as_deref(),
        trigger: &trigger,
        permit: Some(permit),
        drain: &drain,
        cancel: &cancel,
        yielded: &yielded,
        parked: None,
        last_answer: None,
    };
    let _ = run.run(&mut records).await;
    if let Some(parked) = run.parked.take() {
        let moved = records.iter().find_map(|r| r.outcome);
        parked.finish(moved.unwrap_or(WorkOutcome::Abandoned).label());
    }
    records
        .into_iter()
        .map(|r| r.outcome.unwrap_or(WorkOutcome::Abandoned))
        .collect()
}

/// The partition was taken away (or the daemon stops): records not handled are abandoned.
struct Abandon;

/// After an attempt: None to go on at once (the records moved on), or the Retry-After to
/// back off with before the next attempt.
type Then = Option<Option<Duration>>;

struct Run<'a, Y: Fn()> {
    trigger: &'a TriggerRuntime,
    /// The records' topic id (part of a batch's key).
    topic_id: Option<&'a str>,
    /// Whether the request is a batch (see [`body::is_batch`]).
    batch: bool,
    /// Set at a batch's first 409: later requests of this run carry Idempotency-Keys of
    /// their own (see [`crate::dispatch::batch::conflict_key`]).
    conflict_nonce: Option<u64>,
    permit: Option<OwnedSemaphorePermit>,
    drain: &'a CancellationToken,
    cancel: &'a CancellationToken,
    yielded: &'a Y,
    /// The run among its trigger's parked keys, from its first wait to try again on.
    parked: Option<ParkedRun>,
    /// The dispatcher's last answer to this run: its status and what it said.
    last_answer: Option<(Option<u16>, String)>,
}

impl<Y: Fn()> Run<'_, Y> {
    async fn run(&mut self, records: &mut [Record<'_>]) -> Result<(), Abandon> {
        // Groups still to send, the next on top: a rejected batch is replaced by its halves,
        // the earlier one on top, so the records of a key always go out in offset order.
        let mut stack = vec![(0..records.len()).collect::<Vec<usize>>()];
        let mut total = 0u32;
        while !stack.is_empty() {
            // Draining (revoke, shutdown): no further attempt; a run flushed by the drain
            // itself still makes its first.
            if self.drain.is_cancelled() && total > 0 {
                return Err(Abandon);
            }
            self.wait_for_turn().await?;
            total += 1;
            if let Some(retry_after) = self.attempt(records, &mut stack, total).await? {
                self.back_off(records, &mut stack, total, retry_after)
                    .await?;
            }
        }
        Ok(())
    }

    /// One attempt of the group on top of `stack`.
    async fn attempt(
        &mut self,
        records: &mut [Record<'_>],
        stack: &mut Vec<Vec<usize>>,
        total: u32,
    ) -> Result<Then, Abandon> {
        let group = stack.pop().unwrap_or_default();
        let mut wait = None;
        for &i in &group {
            let r = &mut records[i];
            r.attempts.total += 1;
            // A record that must wait holds back the later ones (their keys' order).
            if let Some(retry_after) = self.screen(r).await? {
                wait = Some(retry_after);
                break;
            }
        }
        let group: Vec<usize> = group
            .into_iter()
            .filter(|&i| records[i].outcome.is_none())
            .collect();
        if group.is_empty() {
            return Ok(None);
        }
        if wait.is_some() {
            stack.push(group);
            return Ok(wait);
        }
        // A panic while rendering or dispatching is contained like one while screening: the
        // request's failed attempt.
        let sent =
            std::panic::AssertUnwindSafe(self.dispatch(records, &group, total)).catch_unwind();
        let sent = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(Abandon),
            s = sent => s,
        };
        Ok(match sent {
            Ok((outcome, answer)) => self.read(records, stack, group, outcome, &answer).await,
            Err(panic) => {
                let transient = failed_again(records, &group);
                let step = on_panic(self.trigger, records[group[0]].msg, &*panic, transient);
                self.after_failure(records, stack, group, step, false).await
            }
        })
    }

    /// Age, decoding, the filter and the record's event; sets its outcome when it needs no
    /// run (or `on_error` handled it). Some(Retry-After) when it must wait and try again.
    async fn screen(&self, r: &mut Record<'_>) -> Result<Option<Option<Duration>>, Abandon> {
        // A panic while decoding (a decoder bug a record's bytes reach) is contained here:
        // counted, logged with the record's coordinates, and treated as a failed attempt, so
        // the retry policy and then `on_error` apply and the key moves.
        let attempt =
            std::panic::AssertUnwindSafe(screen_record(self.trigger, self.batch, r)).catch_unwind();
        let step = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(Abandon),
            s = attempt => s,
        };
        let step = match step {
            Ok(Ok(event)) => {
                r.event = Some(event);
                return Ok(None);
            }
            Ok(Err(step)) => step,
            Err(panic) => {
                r.attempts.transient += 1;
                on_panic(self.trigger, r.msg, &*panic, r.attempts.transient)
            }
        };
        Ok(match step {
            Step::Done(outcome) => {
                r.outcome = Some(outcome);
                None
            }
            Step::Retry { retry_after } => Some(retry_after),
            Step::Fail(failure) => {
                match apply_error_policy(
                    self.trigger,
                    r.msg,
                    self.topic_id,
                    &r.id,
                    &r.attempts,
                    &failure,
                )
                .await
                {
                    Some(outcome) => {
                        r.outcome = Some(outcome);
                        None
                    }
                    None => Some(None),
                }
            }
        })
    }

    /// One request for the records `group` of `records`.
    async fn dispatch(
        &self,
        records: &mut [Record<'_>],
        group: &[usize],
        attempt: u32,
    ) -> (DispatchOutcome, bytes::Bytes) {
        let trigger = self.trigger;
        let request = body::request(
            trigger,
            self.batch,
            self.topic_id,
            records,
            group,
            self.conflict_nonce,
        );
        let started = std::time::Instant::now();
        let dispatching = if trace::exporting() {
            tracing::info_span!(
                target: trace::TARGET,
                "dispatch",
                otel.kind = "client",
                tessel.workflow = %trigger.config.workflow,
                tessel.attempt = i64::from(attempt),
                messaging.batch.message_count = tracing::field::Empty,
                tessel.dispatch.outcome = tracing::field::Empty,
            )
        } else {
            tracing::Span::none()
        };
        if self.batch {
            dispatching.record("messaging.batch.message_count", group.len() as i64);
        }
        // With traces exported the run continues this span's trace (a batch's records' own
        // traces are linked from its span); otherwise a single record's own trace, if it
        // carries one.
        let traceparent = trace::traceparent_of(&dispatching);
        let own = match self.batch {
            false => event::traceparent(&records[group[0]].headers),
            true => None,
        };
        let answer = body::send(trigger, self.batch, request, traceparent.as_deref().or(own))
            .instrument(dispatching.clone())
            .await;
        dispatching.record("tessel.dispatch.outcome", answer.0.label());
        trigger
            .metrics()
            .dispatch_attempt(answer.0.label(), started.elapsed().as_secs_f64());
        answer
    }

    /// What the answer to the request for `group` (taken off `stack`) means for its records
    /// ([`plan::read`]); the trigger, the parked run and the logs hear of it here.
    async fn read(
        &mut self,
        records: &mut [Record<'_>],
        stack: &mut Vec<Vec<usize>>,
        group: Vec<usize>,
        outcome: DispatchOutcome,
        answer: &[u8],
    ) -> Then {
        let trigger = self.trigger;
        let policy = trigger.retry_policy();
        let request = plan::Request::of(self.batch, self.conflict_nonce);
        let verdict = plan::read(
            request,
            &outcome,
            answer,
            &members(records, &group),
            &policy,
        );
        // The dispatcher answered (a refused request or refused credentials aside).
        if !matches!(
            outcome,
            DispatchOutcome::Invalid { .. } | DispatchOutcome::Unauthorized { .. }
        ) {
            trigger.resume();
        }
        let failed = match verdict {
            Verdict::Rekey => {
                self.conflict_nonce = Some(crate::clock::draw_u64());
                tracing::info!(
                    connection = %trigger.connection, trigger = %trigger.name,
                    records = group.len(),
                    "dispatcher answered 409 to the batch; it is sent again under its own key"
                );
                stack.push(group);
                return None;
            }
            Verdict::Split { first, second } => {
                if let DispatchOutcome::Rejected { status, .. } = outcome {
                    tracing::info!(
                        connection = %trigger.connection, trigger = %trigger.name,
                        records = group.len(), status, "dispatcher rejected the batch; splitting it to find the record it refuses"
                    );
                }
                stack.push(second);
                stack.push(first);
                return None;
            }
            Verdict::Settled {
                accepted: done,
                failed,
            } => {
                if let DispatchOutcome::Accepted { .. } = outcome {
                    let msg = &records[group[0]].msg;
                    tracing::debug!(
                        connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                        partition = msg.partition(), offset = msg.offset(), "run accepted"
                    );
                }
                for i in done {
                    accepted(trigger, &mut records[i]);
                }
                match failed {
                    Some(failed) => failed,
                    None => return None,
                }
            }
        };
        if failed.counted {
            for &i in &failed.records {
                records[i].attempts.transient += 1;
            }
        }
        let (group, transient) = (failed.records, failed.transient);
        // What `on_error` is told.
        let (message, status) = match outcome {
            DispatchOutcome::Accepted { .. } => {
                let (named, unreadable) = failed
                    .partial
                    .map_or((0, None), |p| (p.named, p.unreadable));
                if let Some(reason) = unreadable {
                    // Which events failed cannot be read: none counts as accepted.
                    tracing::warn!(
                        connection = %trigger.connection, trigger = %trigger.name,
                        error = %reason, "unreadable partial-failure answer; the batch is sent again"
                    );
                }
                let msg = &records[group[0]].msg;
                tracing::warn!(
                    connection = %trigger.connection, trigger = %trigger.name,
                    topic = msg.topic(), partition = msg.partition(),
                    failed = named, retried = group.len(),
                    "dispatcher accepted the batch but for some events; they are sent again"
                );
                ("some events of the batch failed".to_owned(), None)
            }
            DispatchOutcome::Retryable {
                status,
                reason,
                retry_after,
            } => {
                if let (Some(429 | 503), Some(ra)) = (status, retry_after) {
                    trigger.throttle(ra);
                }
                self.last_answer = Some((status, reason.clone()));
                trigger.failed(&format!("dispatcher failing: {reason}"));
                let msg = &records[group[0]].msg;
                tracing::warn!(
                    connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                    partition = msg.partition(), offset = msg.offset(), status = ?status,
                    attempt = transient, error = %reason, "dispatch failed, will retry"
                );
                (
                    format!("{transient} attempts failed; last: {reason}"),
                    status,
                )
            }
            DispatchOutcome::Rejected { status, reason } => {
                self.last_answer = Some((Some(status), reason.clone()));
                trigger.failed(&format!("dispatcher rejected a message with HTTP {status}"));
                let msg = &records[group[0]].msg;
                tracing::warn!(
                    connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                    partition = msg.partition(), offset = msg.offset(), status, error = %reason,
                    "dispatcher rejected the message"
                );
                (
                    format!("dispatcher answered HTTP {status}: {reason}"),
                    Some(status),
                )
            }
            DispatchOutcome::Invalid { reason } => {
                self.last_answer = Some((None, reason.clone()));
                let what = if self.batch { "batch" } else { "record" };
                trigger.failed(&format!(
                    "{what} cannot be sent to the dispatcher: {reason}"
                ));
                let msg = &records[group[0]].msg;
                tracing::warn!(
                    connection = %trigger.connection, trigger = %trigger.name, topic = msg.topic(),
                    partition = msg.partition(), offset = msg.offset(), error = %reason,
                    "{what} cannot be sent to the dispatcher"
                );
                (format!("request cannot be built: {reason}"), None)
            }
            DispatchOutcome::Unauthorized { status, reason } => {
                self.last_answer = Some((Some(status).filter(|s| *s > 0), reason.clone()));
                // Status 0: the TLS handshake was refused (no HTTP answer at all); the
                // reason says which side and what to check.
                trigger.stop(&match status {
                    0 => reason.clone(),
                    _ => format!("dispatcher answered HTTP {status} ({reason})"),
                });
                (String::new(), Some(status))
            }
        };
        let step = Step::of(failed.next, |class| Failure {
            stage: "DISPATCH",
            class,
            message,
            status,
            schema_id: None,
        });
        self.after_failure(records, stack, group, step, true).await
    }

    /// After a failed attempt of `group`: `step` is [`decide`](super::decide::decide)'s
    /// verdict. A record `on_error` cannot handle (`block`, a dead-letter write that failed)
    /// stays in the group, which is then sent again after the backoff. `schema`: the
    /// failure's dead letters carry the schema id each record's value was decoded with.
    async fn after_failure(
        &self,
        records: &mut [Record<'_>],
        stack: &mut Vec<Vec<usize>>,
        group: Vec<usize>,
        step: Step,
        schema: bool,
    ) -> Then {
        let failure = match step {
            Step::Retry { retry_after } => {
                stack.push(group);
                return Some(retry_after);
            }
            Step::Done(outcome) => {
                for i in group {
                    records[i].outcome = Some(outcome);
                }
                return None;
            }
            Step::Fail(failure) => failure,
        };
        let mut left = Vec::new();
        for i in group {
            let r = &mut records[i];
            let failure = Failure {
                schema_id: if schema {
                    r.schema_id
                } else {
                    failure.schema_id
                },
                ..failure.clone()
            };
            match apply_error_policy(
                self.trigger,
                r.msg,
                self.topic_id,
                &r.id,
                &r.attempts,
                &failure,
            )
            .await
            {
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

    /// Waits for the trigger's throttle and a permit (given back while waiting).
    async fn wait_for_turn(&mut self) -> Result<(), Abandon> {
        if let Some(until) = self
            .trigger
            .throttle_deadline()
            .filter(|u| *u > Instant::now())
        {
            // A throttled trigger holds no permit while it waits: other triggers' keys and
            // this trigger's retries compete for the permits as usual afterwards.
            if self.permit.take().is_some() {
                (self.yielded)();
            }
            tokio::select! {
                biased;
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

    /// Gives the permit back (so that other keys keep their concurrency) and waits the
    /// backoff, parked: an operator may have the record tried at once or skipped meanwhile.
    /// Abandon when draining.
    async fn back_off(
        &mut self,
        records: &mut [Record<'_>],
        stack: &mut Vec<Vec<usize>>,
        attempt: u32,
        retry_after: Option<Duration>,
    ) -> Result<(), Abandon> {
        if self.permit.take().is_some() {
            (self.yielded)();
        }
        let delay = self
            .trigger
            .backoff
            .delay(attempt, retry_after, crate::clock::draw());
        let until = Instant::now() + delay;
        self.park(records, stack, delay);
        loop {
            let Some(parked) = self.parked.as_mut() else {
                return Ok(());
            };
            let directive = tokio::select! {
                biased;
                _ = self.drain.cancelled() => return Err(Abandon),
                _ = tokio::time::sleep_until(until) => return Ok(()),
                d = parked.directive() => d,
            };
            match directive {
                Directive::RetryNow { reply } => {
                    let _ = reply.send(Ok(ActionOutcome::new("retrying")));
                    return Ok(());
                }
                Directive::Skip {
                    offset,
                    reason,
                    by,
                    reply,
                } => {
                    let skipped = self.skip(records, stack, offset, &reason, &by).await;
                    let moved = skipped.is_ok();
                    let _ = reply.send(skipped);
                    if moved {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// The run waits to try the group on top of `stack` again in `delay`: it joins (or
    /// updates) its trigger's parked keys.
    fn park(&mut self, records: &[Record<'_>], stack: &[Vec<usize>], delay: Duration) {
        let Some(group) = stack.last() else {
            return;
        };
        let waiting: Vec<&Record> = group
            .iter()
            .map(|&i| &records[i])
            .filter(|r| r.outcome.is_none())
            .collect();
        let Some(first) = waiting.first() else {
            return;
        };
        let trigger = self.trigger;
        let (status, answer) = match &self.last_answer {
            Some((status, answer)) => (*status, Some(answer.clone())),
            None => (None, trigger.recent_failure(Duration::MAX)),
        };
        // The status is shown beside the answer: the reason's own `HTTP 503: ` goes.
        let answer = answer.map(|a| {
            let a = super::error_policy::sanitize(&a);
            let prefix = status.map(|s| format!("HTTP {s}"));
            let rest = prefix
                .as_deref()
                .and_then(|p| a.strip_prefix(p))
                .map_or(a.as_str(), |r| r.trim_start_matches(':').trim_start());
            rest.chars().take(200).collect::<String>()
        });
        let offsets: Vec<i64> = waiting.iter().map(|r| r.msg.offset()).collect();
        let next_attempt_ms =
            crate::control::trigger::now_ms() + i64::try_from(delay.as_millis()).unwrap_or(0);
        let next = crate::control::what_next(&trigger.config, first.attempts.transient);
        let attempts = first.attempts.total;
        match &self.parked {
            Some(parked) => parked.update(|k| {
                k.offset = offsets[0];
                k.offsets = offsets;
                k.attempts = attempts;
                k.next_attempt_ms = next_attempt_ms;
                k.last_status = status;
                k.last_answer = answer;
                k.next = next;
            }),
            None => {
                let (key, key_base64) = crate::control::trigger::shown_key(first.msg.key());
                self.parked = Some(trigger.control.park(ParkedKey {
                    topic: first.msg.topic().to_owned(),
                    partition: first.msg.partition(),
                    offset: offsets[0],
                    offsets,
                    key,
                    key_base64,
                    attempts,
                    since_ms: crate::control::trigger::now_ms(),
                    next_attempt_ms,
                    last_status: status,
                    last_answer: answer,
                    next,
                    owner: String::new(),
                }));
            }
        }
    }

    /// An operator's skip of the run's record at `offset`: dead-lettered (or recorded as
    /// skipped without a dead-letter topic), handled, and out of the groups still to send.
    async fn skip(
        &self,
        records: &mut [Record<'_>],
        stack: &mut Vec<Vec<usize>>,
        offset: i64,
        reason: &str,
        by: &str,
    ) -> Result<ActionOutcome, ActionError> {
        let Some(i) = records
            .iter()
            .position(|r| r.msg.offset() == offset && r.outcome.is_none())
        else {
            return Err(ActionError::NotFound(format!(
                "offset {offset} is not parked in this run"
            )));
        };
        let r = &mut records[i];
        let skip = OperatorSkip {
            reason,
            by,
            last: self.last_answer.as_ref(),
        };
        let (outcome, position) = operator_skip(
            self.trigger,
            r.msg,
            self.topic_id,
            &r.id,
            &r.attempts,
            &skip,
        )
        .await
        .map_err(ActionError::Failed)?;
        r.outcome = Some(outcome);
        for group in stack.iter_mut() {
            group.retain(|&j| j != i);
        }
        stack.retain(|g| !g.is_empty());
        let done = ActionOutcome {
            outcome: outcome.label().to_owned(),
            dead_letter: position,
            already: false,
        };
        let msg = &records[i].msg;
        self.trigger
            .control
            .remember_skip(msg.topic(), msg.partition(), offset, &done);
        Ok(done)
    }
}

/// One more transient failure for each record of `group`; the most any of them has had.
fn failed_again(records: &mut [Record<'_>], group: &[usize]) -> u32 {
    for &i in group {
        records[i].attempts.transient += 1;
    }
    most_transient(records, group)
}

/// The records `group` of `records`, as [`plan::read`] reads an answer for them.
fn members<'r>(records: &'r [Record<'_>], group: &[usize]) -> Vec<Member<'r>> {
    group
        .iter()
        .map(|&i| {
            let r = &records[i];
            Member {
                index: i,
                id: &r.id,
                key: r.msg.key(),
                transient: r.attempts.transient,
            }
        })
        .collect()
}

/// The most transient failures a record of `group` has had.
fn most_transient(records: &[Record<'_>], group: &[usize]) -> u32 {
    group
        .iter()
        .map(|&i| records[i].attempts.transient)
        .max()
        .unwrap_or_default()
}

fn accepted(trigger: &TriggerRuntime, r: &mut Record<'_>) {
    r.outcome = Some(WorkOutcome::Accepted);
    if let Some(ts) = r.msg.timestamp().to_millis() {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        trigger
            .metrics()
            .end_to_end((now_ms - ts).max(0) as f64 / 1000.0);
    }
}

/// The record's event, or the step it takes instead.
async fn screen_record(
    trigger: &TriggerRuntime,
    batch: bool,
    r: &mut Record<'_>,
) -> Result<Rendered, Step> {
    if let Some(step) = expired(trigger, r.msg) {
        return Err(step);
    }
    let decoded = if trace::exporting() {
        let decoding = tracing::info_span!(target: trace::TARGET, "decode");
        decode(trigger, r.msg).instrument(decoding).await
    } else {
        decode(trigger, r.msg).await
    };
    let (key, value) = match decoded {
        Ok(kv) => {
            trigger.metrics().decoded(kv.1.schema.format);
            kv
        }
        Err((field, e)) => return Err(on_decode_error(trigger, r.msg, field, &e, &mut r.attempts)),
    };
    if let Some(outcome) = crate::run::filter::screen(trigger, r.msg, &r.headers, &key, &value) {
        return Err(Step::Done(outcome));
    }
    r.schema_id = value.schema.id;
    Ok(body::render(
        trigger, batch, &r.id, r.msg, &r.headers, &key, &value,
    ))
}

async fn decode(
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

/// A permit for a retry. Retries do not queue for a permit: a queued waiter would take every
/// permit that frees up ahead of the partition's fresh messages, and a key that keeps failing
/// (or a schema the registry cannot serve) would starve the other keys. They try now and
/// then. None when draining.
async fn acquire_permit(
    trigger: &TriggerRuntime,
    drain: &CancellationToken,
) -> Option<OwnedSemaphorePermit> {
    loop {
        match Arc::clone(&trigger.permits).try_acquire_owned() {
            Ok(p) => return Some(p),
            Err(tokio::sync::TryAcquireError::Closed) => return None,
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                let pause = Duration::from_millis(10 + crate::clock::draw_below(20));
                tokio::select! {
                    biased;
                    _ = drain.cancelled() => return None,
                    _ = tokio::time::sleep(pause) => {}
                }
            }
        }
    }
}
