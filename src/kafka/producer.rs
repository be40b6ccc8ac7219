//! The connection's idempotent producer (`enable.idempotence=true`, `acks=all`), used for
//! dead-letter records. A record counts as written only once the broker acknowledged it.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Timestamp;

use crate::config::ConnectionConfig;

/// Consumer-only properties that a producer built from a connection leaves out.
const CONSUMER_ONLY: &[&str] = &[
    "group.id",
    "group.instance.id",
    "group.protocol",
    "group.remote.assignor",
    "auto.offset.reset",
    "isolation.level",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.commit.interval.ms",
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "queued.max.messages.kbytes",
    "queued.min.messages",
    "fetch.max.bytes",
    "fetch.min.bytes",
    "fetch.wait.max.ms",
    "max.partition.fetch.bytes",
    "enable.partition.eof",
    "check.crcs",
];

/// How long one write may take before it is reported as failed.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// The producer configuration of a connection: its cluster and security settings, with
/// idempotence and full acknowledgement forced on.
pub fn producer_config(name: &str, conn: &ConnectionConfig) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    for (k, v) in &conn.kafka {
        if !CONSUMER_ONLY.contains(&k.as_str()) {
            let _ = cfg.set(k, v);
        }
    }
    if !conn.kafka.contains_key("client.id") {
        let _ = cfg.set("client.id", format!("tessel-kafka-{name}-producer"));
    }
    let _ = cfg
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set(
            "message.timeout.ms",
            MESSAGE_TIMEOUT.as_millis().to_string(),
        );
    cfg
}

/// One header added to a written record.
pub type ExtraHeader = (String, String);

/// The idempotent producer of a connection.
#[derive(Clone)]
pub struct IdempotentProducer {
    producer: FutureProducer<super::security::SecurityContext>,
    connection: String,
}

impl std::fmt::Debug for IdempotentProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdempotentProducer")
    }
}

impl IdempotentProducer {
    /// Creates the producer (connects lazily).
    /// Its context signs MSK IAM tokens when the connection uses AWS_MSK_IAM; librdkafka
    /// refreshes them from the producer's own polling thread, also while it sends nothing.
    pub fn try_new(name: &str, conn: &ConnectionConfig) -> Result<Self, KafkaError> {
        let context = super::security::SecurityContext::for_connection(name, conn)
            .map_err(|e| KafkaError::ClientCreation(e.to_string()))?;
        Ok(Self {
            producer: producer_config(name, conn).create_with_context(context)?,
            connection: name.to_owned(),
        })
    }

    /// The error that made the producer unusable, if any (librdkafka's fatal error: for
    /// the idempotent producer, typically a refused producer id).
    pub fn fatal_error(&self) -> Option<(rdkafka::types::RDKafkaErrorCode, String)> {
        use rdkafka::producer::Producer as _;
        self.producer.client().fatal_error()
    }

    /// Writes `original` (key, value, headers and timestamp kept) to `topic` with `extra`
    /// headers appended, and waits for the broker's acknowledgement.
    pub async fn write_copy(
        &self,
        topic: &str,
        original: &OwnedMessage,
        extra: &[ExtraHeader],
    ) -> Result<(i32, i64), KafkaError> {
        let mut headers = OwnedHeaders::new();
        if let Some(h) = original.headers() {
            for header in rdkafka::message::Headers::iter(h) {
                headers = headers.insert(Header {
                    key: header.key,
                    value: header.value,
                });
            }
        }
        for (k, v) in extra {
            headers = headers.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).headers(headers);
        if let Some(k) = original.key() {
            record = record.key(k);
        }
        if let Some(p) = original.payload() {
            record = record.payload(p);
        }
        if let Timestamp::CreateTime(t) | Timestamp::LogAppendTime(t) = original.timestamp() {
            record = record.timestamp(t);
        }
        let started = std::time::Instant::now();
        let result = self
            .producer
            .send(record, MESSAGE_TIMEOUT)
            .await
            .map(|d| (d.partition, d.offset))
            .map_err(|(e, _)| e);
        crate::telemetry::metrics::producer_delivery(
            &self.connection,
            result.is_ok(),
            started.elapsed().as_secs_f64(),
        );
        result
    }
}
