//! What differs between a single trigger's run and a batch trigger's: the request (the
//! record's event under its own key, or the batch of docs/event.md under the batch's key) and
//! how an answer that accepts it is read.

use bytes::Bytes;
use hyper::header::HeaderMap;
use rdkafka::message::{Message, OwnedMessage};
use serde_json::Value as Json;

use super::attempt::Record;
use super::TriggerRuntime;
use crate::codec::Decoded;
use crate::core::batch;
use crate::dispatch::cloudevents;
use crate::dispatch::event::{self, EventHeader, EventSource};
use crate::dispatch::DispatchOutcome;

/// Whether a run of `trigger` with `records` records goes as a batch (a batch trigger's run,
/// even of one record).
pub(super) fn is_batch(trigger: &TriggerRuntime, records: usize) -> bool {
    records > 1 || trigger.config.batch.is_some()
}

/// A record's part of its run's request, rendered by the attempt that screened it.
pub(super) enum Rendered {
    /// A single event's request: the event of docs/event.md, or a CloudEvent in binary mode,
    /// and the headers its envelope adds.
    Single(Vec<u8>, HeaderMap),
    /// One event of a batch (docs/event.md).
    Event(Vec<u8>),
    /// One CloudEvent of a batch, in structured mode.
    CloudEvent(Json),
}

fn source(trigger: &TriggerRuntime) -> EventSource<'_> {
    EventSource {
        connection: &trigger.connection,
        trigger: &trigger.name,
        workflow: &trigger.config.workflow,
    }
}

/// The record's part of the request.
pub(super) fn render(
    trigger: &TriggerRuntime,
    batch: bool,
    id: &str,
    msg: &OwnedMessage,
    headers: &[EventHeader],
    key: &Decoded,
    value: &Decoded,
) -> Rendered {
    let ce = trigger.cloudevents.as_ref();
    match (ce, batch) {
        (_, false) => {
            let (body, envelope) =
                cloudevents::request(ce, source(trigger), id, msg, headers, key, value);
            Rendered::Single(body, envelope)
        }
        (None, true) => {
            Rendered::Event(event::render(source(trigger), id, msg, headers, key, value))
        }
        (Some(ce), true) => {
            Rendered::CloudEvent(ce.structured(&cloudevents::ce_record(id, msg, key, value)))
        }
    }
}

/// One request: its Idempotency-Key, its body and the headers its envelope adds.
pub(super) struct Request {
    pub(super) key: String,
    pub(super) body: Vec<u8>,
    pub(super) envelope: HeaderMap,
}

/// The request for the records `group` of `records`, each rendered by this attempt (the
/// renderings are taken): a single record's event under its own key, or the batch body under
/// the batch's key (a key of its own after a 409: [`batch::conflict_key`]).
pub(super) fn request(
    trigger: &TriggerRuntime,
    batch: bool,
    records: &mut [Record],
    group: &[usize],
    conflict_nonce: Option<u64>,
) -> Request {
    let mut events = group.iter().filter_map(|&i| records[i].event.take());
    if !batch {
        let (body, envelope) = match events.next() {
            Some(Rendered::Single(body, envelope)) => (body, envelope),
            // Not reached: a single trigger's record is rendered as `Single`.
            _ => (b"{}".to_vec(), HeaderMap::new()),
        };
        let key = records[group[0]].id.clone();
        return Request {
            key,
            body,
            envelope,
        };
    }
    let (mut tessel, mut structured) = (Vec::new(), Vec::new());
    for e in events {
        match e {
            Rendered::Single(body, _) | Rendered::Event(body) => tessel.push(body),
            Rendered::CloudEvent(e) => structured.push(e),
        }
    }
    let (first, last) = (&records[group[0]].msg, &records[group[group.len() - 1]].msg);
    let key = batch::request_key(&trigger.group, first, last, group.len(), conflict_nonce);
    let (body, envelope) = if trigger.cloudevents.is_some() {
        cloudevents::structured_batch(&structured)
    } else {
        let head = event::BatchHead {
            id: &key,
            source: source(trigger),
            topic: first.topic(),
            partition: first.partition(),
            first_offset: first.offset(),
            last_offset: last.offset(),
            count: group.len(),
        };
        (event::render_batch(&head, &tessel), HeaderMap::new())
    };
    Request {
        key,
        body,
        envelope,
    }
}

/// Sends `request`; a batch's answer also brings the body of a 2xx (which may name failed
/// events; an answer not read whole is retryable).
pub(super) async fn send(
    trigger: &TriggerRuntime,
    batch: bool,
    request: Request,
    traceparent: Option<&str>,
) -> (DispatchOutcome, Bytes) {
    let Request {
        key,
        body,
        envelope,
    } = request;
    let dispatcher = &trigger.dispatcher;
    if batch {
        dispatcher
            .dispatch_batch(body, &key, traceparent, envelope)
            .await
    } else {
        let outcome = dispatcher
            .dispatch_with(body, &key, traceparent, envelope)
            .await;
        (outcome, Bytes::new())
    }
}

/// How an answer that accepts a request is read.
pub(super) enum Acceptance {
    /// Accepted, but for these records of the request (sent again), of `failed` named.
    Accepted { retry: Vec<usize>, failed: usize },
    /// A 409 to a batch's key used before (by this owner or an earlier one): it says the key
    /// was seen, not which events that request had accepted, so the batch goes again under a
    /// key of its own, and the answer to that one counts.
    Conflict,
}

/// Reads the accepting answer (`status`; `answer`, the body a batch's 2xx kept) to the request
/// for `group`. A single event: 2xx and 409 accept it. A batch (docs/event.md): a 409 to a
/// fresh key, or a 2xx, accepts every event but those `{"failed": [ids]}` names, and the later
/// records of their keys; an unreadable `failed` accepts none.
pub(super) fn read_acceptance(
    trigger: &TriggerRuntime,
    batch: bool,
    status: u16,
    answer: &[u8],
    conflict_nonce: Option<u64>,
    records: &[Record],
    group: &[usize],
) -> Acceptance {
    if !batch {
        return Acceptance::Accepted {
            retry: Vec::new(),
            failed: 0,
        };
    }
    if status == 409 && conflict_nonce.is_none() {
        return Acceptance::Conflict;
    }
    let failed = batch::failed_ids(answer).unwrap_or_else(|reason| {
        // Which events failed cannot be read: none counts as accepted.
        tracing::warn!(
            connection = %trigger.connection, trigger = %trigger.name,
            error = %reason, "unreadable partial-failure answer; the batch is sent again"
        );
        group.iter().map(|&i| records[i].id.clone()).collect()
    });
    let keyed: Vec<(&str, Option<&[u8]>)> = group
        .iter()
        .map(|&i| (records[i].id.as_str(), records[i].msg.key()))
        .collect();
    let retry = batch::to_retry(&keyed, &failed)
        .into_iter()
        .map(|j| group[j])
        .collect();
    Acceptance::Accepted {
        retry,
        failed: failed.len(),
    }
}
