//! What differs between a single trigger's run and a batch trigger's: the request (the
//! record's event under its own key, or the batch of docs/event.md under the batch's key).
//! How its answer is read, for either, is [`super::plan`].

use bytes::Bytes;
use hyper::header::HeaderMap;
use rdkafka::message::{Message, OwnedMessage};
use serde_json::Value as Json;

use super::attempt::Record;
use super::TriggerRuntime;
use crate::codec::Decoded;
use crate::dispatch::batch;
use crate::dispatch::cloudevents::{self, CloudEvents};
use crate::dispatch::event::{self, EventHeader, EventRecord, EventSource};
use crate::dispatch::{DispatchOutcome, DispatchRequest};

/// Whether a run of `trigger` with `records` records goes as a batch (a batch trigger's run,
/// even of one record).
pub(super) fn is_batch(trigger: &TriggerRuntime, records: usize) -> bool {
    records > 1 || trigger.config.batch.is_some()
}

/// A record's part of its run's request, rendered by the attempt that screened it (or by a
/// dead-letter replay).
#[derive(Clone)]
pub(crate) enum Rendered {
    /// A single event's request: the event of docs/event.md, or a CloudEvent in binary mode,
    /// and the headers its envelope adds.
    Single(Vec<u8>, HeaderMap),
    /// One event of a batch (docs/event.md).
    Event(Vec<u8>),
    /// One CloudEvent of a batch, in structured mode.
    CloudEvent(Json),
}

/// How a trigger's records become requests: the source its events name, its consumer group
/// (part of a batch's key) and its CloudEvents envelope, if any. The daemon's runs and
/// `dlq replay` build the same requests through it.
pub(crate) struct Renderer<'a> {
    /// Connection, trigger and workflow.
    pub(crate) source: EventSource<'a>,
    /// The consumer group.
    pub(crate) group: &'a str,
    /// The trigger's CloudEvents envelope.
    pub(crate) cloudevents: Option<&'a CloudEvents>,
}

impl Renderer<'_> {
    /// The record's part of the request: a single record's request (`batch` false), or its
    /// event in a batch.
    pub(crate) fn record(&self, batch: bool, record: &EventRecord<'_>) -> Rendered {
        if batch {
            self.event(record)
        } else {
            let (body, envelope) = self.single(record);
            Rendered::Single(body, envelope)
        }
    }

    /// A single record's request: its body and the headers its envelope adds.
    pub(crate) fn single(&self, record: &EventRecord<'_>) -> (Vec<u8>, HeaderMap) {
        cloudevents::request(self.cloudevents, self.source, record)
    }

    /// A record's event in a batch.
    pub(crate) fn event(&self, record: &EventRecord<'_>) -> Rendered {
        match self.cloudevents {
            None => Rendered::Event(event::render(self.source, record)),
            Some(ce) => Rendered::CloudEvent(ce.structured(&cloudevents::ce_record(record))),
        }
    }

    /// The request for a batch of `count` records from `first` to `last` of one partition,
    /// whose events are `events`: the batch body under the batch's key (a key of its own
    /// after a 409: [`batch::conflict_key`]).
    pub(crate) fn batch(
        &self,
        first: &OwnedMessage,
        last: &OwnedMessage,
        topic_id: Option<&str>,
        count: usize,
        conflict_nonce: Option<u64>,
        events: impl IntoIterator<Item = Rendered>,
    ) -> DispatchRequest {
        let (mut tessel, mut structured) = (Vec::new(), Vec::new());
        for e in events {
            match e {
                Rendered::Single(body, _) | Rendered::Event(body) => tessel.push(body),
                Rendered::CloudEvent(e) => structured.push(e),
            }
        }
        let key = batch::request_key(self.group, topic_id, first, last, count, conflict_nonce);
        let (body, envelope) = if self.cloudevents.is_some() {
            cloudevents::structured_batch(&structured)
        } else {
            let head = event::BatchHead {
                lead: event::Lead {
                    id: &key,
                    source: self.source,
                    topic: first.topic(),
                    partition: first.partition(),
                },
                first_offset: first.offset(),
                last_offset: last.offset(),
                count,
            };
            (event::render_batch(&head, &tessel), HeaderMap::new())
        };
        DispatchRequest {
            key,
            body,
            envelope,
        }
    }
}

fn renderer(trigger: &TriggerRuntime) -> Renderer<'_> {
    Renderer {
        source: EventSource {
            connection: &trigger.connection,
            trigger: &trigger.name,
            workflow: &trigger.config.workflow,
        },
        group: &trigger.group,
        cloudevents: trigger.cloudevents.as_ref(),
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
    let record = EventRecord {
        id,
        msg,
        headers,
        key,
        value,
    };
    renderer(trigger).record(batch, &record)
}

/// The request for the records `group` of `records`, each rendered by this attempt (the
/// renderings are taken): a single record's event under its own key, or the batch body under
/// the batch's key ([`Renderer::batch`]).
pub(super) fn request(
    trigger: &TriggerRuntime,
    batch: bool,
    topic_id: Option<&str>,
    records: &mut [Record<'_>],
    group: &[usize],
    conflict_nonce: Option<u64>,
) -> DispatchRequest {
    let mut events = group.iter().filter_map(|&i| records[i].event.take());
    if !batch {
        let (body, envelope) = match events.next() {
            Some(Rendered::Single(body, envelope)) => (body, envelope),
            // Not reached: a single trigger's record is rendered as `Single`.
            _ => (b"{}".to_vec(), HeaderMap::new()),
        };
        let key = records[group[0]].id.clone();
        return DispatchRequest {
            key,
            body,
            envelope,
        };
    }
    let events: Vec<Rendered> = events.collect();
    let (first, last) = (&records[group[0]].msg, &records[group[group.len() - 1]].msg);
    renderer(trigger).batch(first, last, topic_id, group.len(), conflict_nonce, events)
}

/// Sends `request`; a batch's answer also brings the body of a 2xx (which may name failed
/// events; an answer not read whole is retryable).
pub(super) async fn send(
    trigger: &TriggerRuntime,
    batch: bool,
    request: DispatchRequest,
    traceparent: Option<&str>,
) -> (DispatchOutcome, Bytes) {
    trigger.dispatcher.send(request, traceparent, batch).await
}
