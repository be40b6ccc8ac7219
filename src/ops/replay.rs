//! `dlq replay`: a trigger's dead letters dispatched again, as the daemon dispatches records.
//!
//! Every partition of the dead-letter topic is read (or those asked for), one record at a
//! time through the daemon's bounded consumer settings: a record is decoded, sent (or put in
//! the batch being filled) and let go, so memory holds at most one batch, whatever the range.
//! Each record goes as its trigger would send it: in the trigger's envelope, alone with its
//! original idempotency key, or for a batch trigger in batches of up to `batch.max_records`
//! and `batch.max_bytes` of dead letters from one original partition, rendered as the
//! daemon's batches are ([`Renderer`]). Each answer is read as the daemon's runs read theirs
//! ([`plan::read`]: a 409 to a batch's key, failed events named, a refused batch halved), and
//! failures are retried with the trigger's `retry` settings and [`Backoff`]; a dry run says
//! which requests would go and sends none. The trigger's `filter` and `max_record_age_ms`
//! do not apply (replaying a record is asking for its run), and `on_error` neither: a record
//! that still fails is reported, never dead-lettered again.

use std::time::Duration;

use anyhow::{bail, Context};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::tools::{connection, TIMEOUT};
use crate::clients::security::SecurityContext;
use crate::codec::headers::raw_headers;
use crate::codec::registry::RegistryClient;
use crate::codec::{DecodeError, Decoded, Decoder, Field};
use crate::config::{Config, ConnectionConfig, TriggerConfig};
use crate::core::batch::BatchLimits;
use crate::dispatch::cloudevents::CloudEvents;
use crate::dispatch::event::{self, EventRecord, EventSource};
use crate::dispatch::retry::Backoff;
use crate::dispatch::{DispatchOutcome, DispatchRequest, HttpDispatcher};
use crate::run::body::{Rendered, Renderer};
use crate::run::plan::{self, Member, Request, Verdict};
use crate::run::{decide, Next, Observed, RetryPolicy};

/// How long a partition may yield no record before its end is reached.
const IDLE: Duration = Duration::from_secs(30);

/// What `dlq replay` is asked to do.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// The trigger whose `dead_letter_topic` is replayed.
    pub trigger: String,
    /// Only these partitions of the dead-letter topic (default: every one).
    pub partitions: Vec<i32>,
    /// The first offset replayed in each partition (earlier ones are skipped).
    pub from: i64,
    /// Stop before this offset in each partition (default: the end of each).
    pub to: Option<i64>,
    /// Say what would be sent, and send nothing.
    pub dry_run: bool,
}

/// What became of one dead-letter record.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Replayed {
    /// Partition of the record in the dead-letter topic.
    pub dead_letter_partition: i32,
    /// Offset of the record in the dead-letter topic.
    pub dead_letter_offset: i64,
    /// The original record's idempotency key (its event's `id`).
    pub idempotency_key: String,
    /// The Idempotency-Key of the request that carried it (for a batch trigger, the batch's;
    /// otherwise the record's own); None when no request was built.
    pub request_key: Option<String>,
    /// Requests made for it (0 in a dry run).
    pub attempts: u32,
    /// `accepted`; `dry_run` (it would be sent); `retryable` (retries exhausted, per the
    /// trigger's `retry.max_attempts`); `rejected`, `invalid`, `unauthorized` (the dispatcher's
    /// answer); `undecodable`; `not_a_dead_letter_record`.
    pub outcome: String,
}

/// What a replay did, over every partition.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Whether it was a dry run.
    pub dry_run: bool,
    /// The dead-letter partitions read.
    pub partitions: Vec<i32>,
    /// Records read.
    pub records: usize,
    /// Requests sent (in a dry run: that would be sent).
    pub requests: usize,
    /// Records the dispatcher accepted.
    pub accepted: usize,
    /// Records neither accepted nor, in a dry run, to be sent.
    pub failed: usize,
}

/// Replays the dead letters of `request.trigger` as [`ReplayRequest`] says, calling `emit`
/// for each record once its fate is known (in dead-letter order within a partition). Stops
/// with an error when the dispatcher refuses the trigger's credentials, after reporting the
/// records of that request.
pub async fn dlq_replay(
    config: &Config,
    name: Option<&str>,
    request: &ReplayRequest,
    emit: impl FnMut(&Replayed),
) -> anyhow::Result<ReplaySummary> {
    let (cname, conn) = connection(config, name)?;
    let tname = request.trigger.as_str();
    let trigger = conn
        .triggers
        .get(tname)
        .with_context(|| format!("no trigger {tname} in connection {cname}"))?;
    let dlq = trigger
        .dead_letter_topic
        .as_deref()
        .with_context(|| format!("trigger {tname} has no dead_letter_topic"))?;
    let consumer = reading_consumer(cname, conn)?;
    let metadata = consumer
        .fetch_metadata(Some(dlq), TIMEOUT)
        .with_context(|| format!("cannot read the metadata of topic {dlq}"))?;
    let mut all: Vec<i32> = Vec::new();
    for t in metadata.topics() {
        if let Some(e) = t.error() {
            bail!("topic {dlq}: {e:?}");
        }
        all.extend(t.partitions().iter().map(|p| p.id()));
    }
    all.sort_unstable();
    if all.is_empty() {
        bail!("topic {dlq} has no partitions (does it exist?)");
    }
    for p in &request.partitions {
        if !all.contains(p) {
            bail!(
                "topic {dlq} has no partition {p} (it has {} partitions, from 0)",
                all.len()
            );
        }
    }
    let partitions: Vec<i32> = if request.partitions.is_empty() {
        all
    } else {
        all.into_iter()
            .filter(|p| request.partitions.contains(p))
            .collect()
    };
    let registry = match &conn.schema_registry {
        Some(r) => Some(std::sync::Arc::new(RegistryClient::try_new(r)?)),
        None => None,
    };
    let mut replayer = Replayer {
        connection: cname,
        group: conn.group_id(),
        name: tname,
        trigger,
        decoder: Decoder::new(registry),
        dispatcher: HttpDispatcher::try_new(&trigger.dispatcher).map_err(anyhow::Error::msg)?,
        cloudevents: CloudEvents::for_dispatcher(
            &trigger.dispatcher,
            conn.kafka
                .get("bootstrap.servers")
                .map_or("", String::as_str),
        ),
        backoff: crate::dispatch::retry::Backoff::from(&trigger.retry),
        policy: RetryPolicy::from(&trigger.retry),
        limits: trigger.batch.as_ref().map(BatchLimits::from),
        dry_run: request.dry_run,
        batch: Vec::new(),
        emit,
        summary: ReplaySummary {
            dry_run: request.dry_run,
            partitions: partitions.clone(),
            ..ReplaySummary::default()
        },
    };
    for p in partitions {
        let (low, high) = consumer
            .fetch_watermarks(dlq, p, TIMEOUT)
            .with_context(|| format!("cannot read the watermarks of {dlq}[{p}]"))?;
        let start = request.from.max(low);
        let end = request.to.map_or(high, |t| t.min(high));
        if start >= end {
            continue;
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(dlq, p, Offset::Offset(start))?;
        consumer.assign(&tpl)?;
        let mut next = start;
        while next < end {
            let record = match tokio::time::timeout(IDLE, consumer.recv()).await {
                Ok(Ok(m)) => m.detach(),
                Ok(Err(KafkaError::PartitionEOF(_))) => break,
                Ok(Err(e)) => bail!("reading {dlq}[{p}] at offset {next}: {e}"),
                Err(_) => bail!(
                    "no record of {dlq}[{p}] arrived within {} s at offset {next} (end {end})",
                    IDLE.as_secs()
                ),
            };
            if record.partition() != p {
                continue;
            }
            next = record.offset() + 1;
            if record.offset() < end {
                replayer.replay(record).await?;
            }
        }
        replayer.flush().await?;
    }
    Ok(replayer.summary)
}

/// A consumer of the connection's cluster with the daemon's consumer settings (bounded
/// prefetch, `read_committed`) that never joins the group nor commits, and says where a
/// partition ends.
fn reading_consumer(
    name: &str,
    conn: &ConnectionConfig,
) -> anyhow::Result<StreamConsumer<SecurityContext>> {
    let mut cfg = crate::consumer::consumer_config(name, conn);
    let _ = cfg
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true");
    super::tools::client(&cfg, conn)
}

/// A decoded dead letter waiting in the batch being filled.
struct Pending {
    dead_letter: (i32, i64),
    id: String,
    /// The original record's topic id, where the dead letter says it.
    topic_id: Option<String>,
    original: OwnedMessage,
    event: Rendered,
}

struct Replayer<'a, E: FnMut(&Replayed)> {
    connection: &'a str,
    group: &'a str,
    name: &'a str,
    trigger: &'a TriggerConfig,
    decoder: Decoder,
    dispatcher: HttpDispatcher,
    cloudevents: Option<CloudEvents>,
    backoff: Backoff,
    policy: RetryPolicy,
    /// Some for a batch trigger.
    limits: Option<BatchLimits>,
    dry_run: bool,
    /// The batch being filled: dead letters of one original partition, in dead-letter order.
    batch: Vec<Pending>,
    emit: E,
    summary: ReplaySummary,
}

impl<E: FnMut(&Replayed)> Replayer<'_, E> {
    /// How the trigger's records become requests, as the daemon's runs build them.
    fn renderer(&self) -> Renderer<'_> {
        Renderer {
            source: EventSource {
                connection: self.connection,
                trigger: self.name,
                workflow: &self.trigger.workflow,
            },
            group: self.group,
            cloudevents: self.cloudevents.as_ref(),
        }
    }

    fn report(
        &mut self,
        dead_letter: (i32, i64),
        id: &str,
        request_key: Option<&str>,
        attempts: u32,
        outcome: &str,
    ) {
        self.summary.records += 1;
        match outcome {
            "accepted" => self.summary.accepted += 1,
            "dry_run" => {}
            _ => self.summary.failed += 1,
        }
        (self.emit)(&Replayed {
            dead_letter_partition: dead_letter.0,
            dead_letter_offset: dead_letter.1,
            idempotency_key: id.to_owned(),
            request_key: request_key.map(str::to_owned),
            attempts,
            outcome: outcome.to_owned(),
        });
    }

    /// One dead letter: sent, or added to the batch (which goes first when it is full or
    /// holds another partition's records).
    async fn replay(&mut self, dead: OwnedMessage) -> anyhow::Result<()> {
        let at = (dead.partition(), dead.offset());
        let Some(original) = original_of(&dead) else {
            self.report(at, "", None, 0, "not_a_dead_letter_record");
            return Ok(());
        };
        let id = header(&dead, "tessel.idempotency.key").unwrap_or_else(|| {
            event::idempotency_key(
                self.group,
                original.topic(),
                None,
                original.partition(),
                original.offset(),
            )
        });
        let topic_id = header(&dead, crate::run::TOPIC_ID_HEADER);
        drop(dead);
        let Some((key, value)) = self.decode(&original).await? else {
            self.report(at, &id, None, 0, "undecodable");
            return Ok(());
        };
        let headers = event::headers_of(&original);
        let record = EventRecord {
            id: &id,
            msg: &original,
            headers: &headers,
            key: &key,
            value: &value,
        };
        let Some(limits) = self.limits else {
            let (body, envelope) = self.renderer().single(&record);
            let traceparent = event::traceparent(&headers).map(str::to_owned);
            let request = DispatchRequest {
                key: id.clone(),
                body,
                envelope,
            };
            return self.send_one(at, request, traceparent.as_deref()).await;
        };
        let event = self.renderer().event(&record);
        // A batch holds one original partition's records, within the trigger's bounds.
        if let Some(first) = self.batch.first() {
            let same_partition = first.original.topic() == original.topic()
                && first.original.partition() == original.partition();
            let sizes = self
                .batch
                .iter()
                .map(|r| size_of(&r.original))
                .chain([size_of(&original)]);
            if !same_partition || limits.take(sizes) <= self.batch.len() {
                self.flush().await?;
            }
        }
        self.batch.push(Pending {
            dead_letter: at,
            topic_id,
            id,
            original,
            event,
        });
        if self.batch.len() >= limits.max_records {
            self.flush().await?;
        }
        Ok(())
    }

    /// The record's key and value, retried as the daemon retries decoding (a registry outage,
    /// a schema id not there yet); None when it cannot be decoded.
    async fn decode(&self, msg: &OwnedMessage) -> anyhow::Result<Option<(Decoded, Decoded)>> {
        let mut missing_since: Option<tokio::time::Instant> = None;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let e = match self.decode_once(msg).await {
                Ok(kv) => return Ok(Some(kv)),
                Err(e) => e,
            };
            let observed = Observed::undecodable(&e, &mut missing_since);
            match decide(observed, 0, &self.policy) {
                Next::Retry { retry_after } => {
                    let delay = self.delay(attempt, retry_after);
                    tracing::warn!(
                        topic = msg.topic(), partition = msg.partition(), offset = msg.offset(),
                        error = %e, retry_in_ms = delay.as_millis() as u64,
                        "cannot decode the dead letter yet; retrying"
                    );
                    tokio::time::sleep(delay).await;
                }
                Next::Stop => bail!(
                    "cannot decode {}[{}] offset {}: {e}",
                    msg.topic(),
                    msg.partition(),
                    msg.offset()
                ),
                Next::Done(_) | Next::Fail(_) => return Ok(None),
            }
        }
    }

    async fn decode_once(&self, msg: &OwnedMessage) -> Result<(Decoded, Decoded), DecodeError> {
        let key = self
            .decoder
            .decode(self.trigger.key_format, msg.key(), msg.topic(), Field::Key)
            .await?;
        let value = self
            .decoder
            .decode(
                self.trigger.value_format,
                msg.payload(),
                msg.topic(),
                Field::Value,
            )
            .await?;
        Ok((key, value))
    }

    fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        self.backoff
            .delay(attempt, retry_after, crate::clock::draw())
    }

    /// A record of a trigger without batches: one request under its own key, retried per
    /// the trigger's policy.
    async fn send_one(
        &mut self,
        at: (i32, i64),
        request: DispatchRequest,
        traceparent: Option<&str>,
    ) -> anyhow::Result<()> {
        let id = request.key.as_str();
        self.summary.requests += 1;
        if self.dry_run {
            self.report(at, id, Some(id), 0, "dry_run");
            return Ok(());
        }
        let mut transient = 0u32;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let (outcome, _) = self
                .dispatcher
                .send(request.clone(), traceparent, false)
                .await;
            let member = Member {
                index: 0,
                id,
                key: None,
                transient,
            };
            let verdict = plan::read(Request::Single, &outcome, &[], &[member], &self.policy);
            // A single record is never sent again under another key nor split.
            let Verdict::Settled { failed, .. } = verdict else {
                continue;
            };
            let Some(failed) = failed else {
                self.report(at, id, Some(id), attempts, "accepted");
                return Ok(());
            };
            transient = failed.transient;
            let reason = failure_reason(&outcome);
            match failed.next {
                Next::Retry { retry_after } => {
                    self.wait(attempts, retry_after, &reason, id).await;
                }
                Next::Stop => {
                    self.report(at, id, Some(id), attempts, outcome.label());
                    bail!("{reason}; replay stopped");
                }
                Next::Done(_) | Next::Fail(_) => {
                    self.report(at, id, Some(id), attempts, outcome.label());
                    return Ok(());
                }
            }
        }
    }

    /// Waits the backoff after a failed attempt.
    async fn wait(&self, attempt: u32, retry_after: Option<Duration>, reason: &str, key: &str) {
        let delay = self.delay(attempt, retry_after);
        tracing::warn!(
            trigger = %self.name, idempotency_key = %key, attempt, error = %reason,
            retry_in_ms = delay.as_millis() as u64, "replay attempt failed; retrying"
        );
        tokio::time::sleep(delay).await;
    }

    /// Sends the batch being filled, as the daemon's runs send theirs ([`plan::read`]): a 409
    /// to its key sends it again under a key of its own; the events a 2xx answer names failed
    /// (and the later records of their keys) go again; a refused batch is halved until the
    /// refused record is alone; transient failures are retried per the trigger's policy.
    async fn flush(&mut self) -> anyhow::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let records = std::mem::take(&mut self.batch);
        // Per record: the request that settled it, attempts, outcome.
        let mut settled: Vec<Option<(String, &'static str)>> = vec![None; records.len()];
        let mut attempts = vec![0u32; records.len()];
        let mut stack = vec![(0..records.len()).collect::<Vec<usize>>()];
        let mut conflict_nonce: Option<u64> = None;
        let mut transient = 0u32;
        let mut stopped = None;
        while let Some(group) = stack.last().cloned() {
            let request = self.batch_request(&records, &group, conflict_nonce);
            let key = request.key.clone();
            self.summary.requests += 1;
            if self.dry_run {
                for &i in &group {
                    settled[i] = Some((key.clone(), "dry_run"));
                }
                let _ = stack.pop();
                continue;
            }
            for &i in &group {
                attempts[i] += 1;
            }
            let (outcome, answer) = self.dispatcher.send(request, None, true).await;
            let members: Vec<Member<'_>> = group
                .iter()
                .map(|&i| Member {
                    index: i,
                    id: &records[i].id,
                    key: records[i].original.key(),
                    transient,
                })
                .collect();
            let request = Request::of(true, conflict_nonce);
            let failed = match plan::read(request, &outcome, &answer, &members, &self.policy) {
                Verdict::Rekey => {
                    conflict_nonce = Some(crate::clock::draw_u64());
                    continue;
                }
                Verdict::Split { first, second } => {
                    let _ = stack.pop();
                    stack.push(second);
                    stack.push(first);
                    transient = 0;
                    continue;
                }
                Verdict::Settled { accepted, failed } => {
                    for i in accepted {
                        settled[i] = Some((key.clone(), "accepted"));
                    }
                    let _ = stack.pop();
                    match failed {
                        Some(failed) => failed,
                        None => {
                            transient = 0;
                            continue;
                        }
                    }
                }
            };
            if let Some(reason) = failed.partial.as_ref().and_then(|p| p.unreadable.as_ref()) {
                tracing::warn!(
                    trigger = %self.name, idempotency_key = %key, error = %reason,
                    "unreadable partial-failure answer; the batch is sent again"
                );
            }
            transient = failed.transient;
            match failed.next {
                Next::Retry { retry_after } => {
                    stack.push(failed.records);
                    let reason = match &outcome {
                        DispatchOutcome::Retryable { reason, .. } => reason.clone(),
                        _ => "some events of the batch failed".to_owned(),
                    };
                    self.wait(transient, retry_after, &reason, &key).await;
                }
                next => {
                    let label = match &outcome {
                        // A partial failure whose retries ran out.
                        DispatchOutcome::Accepted { .. } => "retryable",
                        o => o.label(),
                    };
                    for &i in &failed.records {
                        settled[i] = Some((key.clone(), label));
                    }
                    transient = 0;
                    if next == Next::Stop {
                        stopped = Some(failure_reason(&outcome));
                        break;
                    }
                }
            }
        }
        // A record not settled was not sent: the replay stopped before.
        for (i, r) in records.iter().enumerate() {
            if let Some((key, outcome)) = &settled[i] {
                self.report(r.dead_letter, &r.id, Some(key), attempts[i], outcome);
            }
        }
        match stopped {
            Some(reason) => bail!("{reason}; replay stopped"),
            None => Ok(()),
        }
    }

    /// The request for the records `group` of `records`, as the daemon's batch worker
    /// builds it.
    fn batch_request(
        &self,
        records: &[Pending],
        group: &[usize],
        conflict_nonce: Option<u64>,
    ) -> DispatchRequest {
        let first = &records[group[0]].original;
        let last = &records[group[group.len() - 1]].original;
        let topic_id = records[group[0]].topic_id.as_deref();
        let events = group.iter().map(|&i| records[i].event.clone());
        self.renderer()
            .batch(first, last, topic_id, group.len(), conflict_nonce, events)
    }
}

/// Why a request failed, as the replay logs it and stops with.
fn failure_reason(outcome: &DispatchOutcome) -> String {
    match outcome {
        DispatchOutcome::Accepted { .. } => String::new(),
        DispatchOutcome::Retryable { reason, .. } => reason.clone(),
        DispatchOutcome::Rejected { status, reason } => {
            format!("dispatcher answered HTTP {status}: {reason}")
        }
        DispatchOutcome::Invalid { reason } => format!("request cannot be built: {reason}"),
        DispatchOutcome::Unauthorized { status, reason } => {
            format!("the dispatcher refused the trigger's credentials (HTTP {status}): {reason}")
        }
    }
}

/// A record's key and value bytes, as batch bounds count them.
fn size_of(m: &OwnedMessage) -> usize {
    m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len)
}

fn header(m: &OwnedMessage, name: &str) -> Option<String> {
    raw_headers(m)
        .find(|h| h.name == name.as_bytes())
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Rebuilds the original record from a dead-letter record: its topic, partition and offset
/// from the `__connect.errors.*` headers, its own headers without the added ones.
fn original_of(r: &OwnedMessage) -> Option<OwnedMessage> {
    let topic = header(r, "__connect.errors.topic")?;
    let partition = header(r, "__connect.errors.partition")?.parse().ok()?;
    let offset = header(r, "__connect.errors.offset")?.parse().ok()?;
    let mut headers = OwnedHeaders::new();
    for h in raw_headers(r) {
        // rust-rdkafka only writes UTF-8 names: one that is not is replayed with its invalid
        // bytes replaced (the record itself is not changed).
        let name = String::from_utf8_lossy(h.name);
        if name.starts_with("__connect.errors.") || name.starts_with("tessel.") {
            continue;
        }
        headers = headers.insert(Header {
            key: &name,
            value: h.value,
        });
    }
    // A dead letter is stamped with the time it was written; the record's own time is in a
    // header (dead letters written before that carry it as their timestamp).
    let timestamp = header(r, crate::run::ORIGINAL_TIMESTAMP_HEADER)
        .and_then(|t| t.parse().ok())
        .map_or_else(|| r.timestamp(), rdkafka::Timestamp::CreateTime);
    Some(OwnedMessage::new(
        r.payload().map(<[u8]>::to_vec),
        r.key().map(<[u8]>::to_vec),
        topic,
        timestamp,
        partition,
        offset,
        Some(headers),
    ))
}
