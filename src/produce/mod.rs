//! The produce path: workflows (through the HTTP API) and operators (through
//! `tessel-kafka produce`) write records with the connection's idempotent producer.
//!
//! A request is checked whole before anything is written: every topic exists and every key
//! and value encodes. Then the records are queued in request order, so records with the same
//! key keep their order (the idempotent producer keeps per-partition order across retries),
//! and the answer waits for every acknowledgement. A transactional batch is all or nothing.

pub mod api;
pub mod produce_only;
pub mod producer;
mod request;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use serde::Serialize;
use serde_json::Value as Json;

pub use request::{parse_request, parse_value, MessageIn, ProduceRequest, RequestError};

use crate::codec::encode::{EncodeError, Encoder, ProduceFormat};
use crate::codec::registry::RegistryError;
use crate::config::ConnectionConfig;
use crate::produce::producer::{
    refused_write, IdempotentProducer, OutRecord, TransactionError, TransactionalProducer,
};

/// How long a topic's partition count is trusted.
const TOPIC_TTL: Duration = Duration::from_secs(60);

/// How long a topic the cluster says does not exist is asked about again before the request
/// is answered 404: a topic just created reaches every broker's metadata a moment after its
/// creation is acknowledged (librdkafka's producer allows `topic.metadata.propagation.max.ms`
/// for it). Seen on Kafka 3.9: a topic created and at once produced to was answered 404.
const TOPIC_PROPAGATION: Duration = Duration::from_secs(3);

/// The pause between two of those questions.
const TOPIC_PROPAGATION_STEP: Duration = Duration::from_millis(200);

/// Whether `e` says that the cluster does not know the topic.
fn unknown_topic(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic)
    )
}

/// Where one record was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Written {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
}

/// The outcome of one record of a non-transactional batch.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum RecordOutcome {
    /// Written and acknowledged.
    Written(Written),
    /// Not acknowledged.
    Failed {
        /// HTTP-style status of this record's failure.
        status: u16,
        /// Why.
        error: String,
    },
}

/// Why a request was refused or failed; each maps to an HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    /// The body is not a valid request (400).
    #[error("{0}")]
    BadRequest(String),
    /// Over a configured limit (413).
    #[error("{0}")]
    TooLarge(String),
    /// A key or value does not encode (422).
    #[error("messages[{index}]: {source}")]
    Encode {
        /// Position in the batch.
        index: usize,
        /// Why.
        #[source]
        source: EncodeError,
    },
    /// The topic does not exist (404).
    #[error("messages[{index}]: topic {topic:?} does not exist on connection {connection}")]
    UnknownTopic {
        /// Position in the batch.
        index: usize,
        /// Topic.
        topic: String,
        /// Connection.
        connection: String,
    },
    /// The partition does not exist (422).
    #[error("messages[{index}]: partition {partition} does not exist; topic {topic:?} has {count} partitions")]
    UnknownPartition {
        /// Position in the batch.
        index: usize,
        /// Topic.
        topic: String,
        /// Partition asked for.
        partition: i32,
        /// Partitions the topic has.
        count: usize,
    },
    /// The broker refused (403 for authorization, else by code).
    #[error("messages[{index}]: {reason}")]
    Broker {
        /// Position in the batch.
        index: usize,
        /// HTTP status chosen for the broker's error.
        status: u16,
        /// The broker's reason, with what permission is missing when it is one.
        reason: String,
        /// Outcomes of every record, for a non-transactional batch.
        results: Option<Vec<RecordOutcome>>,
    },
    /// Transactions are not configured for the connection (422).
    #[error("transactional batches need [connections.{0}.producer] transactional_id_prefix")]
    NoTransactions(String),
}

impl ProduceError {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Self::BadRequest(_) => 400,
            Self::TooLarge(_) => 413,
            Self::UnknownTopic { .. } => 404,
            Self::Encode { source, .. } => match source {
                EncodeError::Registry {
                    source: RegistryError::Unavailable(_),
                    ..
                } => 503,
                EncodeError::Registry {
                    source: RegistryError::Unauthorized { .. },
                    ..
                } => 502,
                _ => 422,
            },
            Self::UnknownPartition { .. } | Self::NoTransactions(_) => 422,
            Self::Broker { status, .. } => *status,
        }
    }

    /// Per-record outcomes, when some records may have been written.
    pub fn results(&self) -> Option<&[RecordOutcome]> {
        match self {
            Self::Broker { results, .. } => results.as_deref(),
            _ => None,
        }
    }
}

/// HTTP status and reason for a broker or client error on `topic`.
pub fn classify_kafka_error(e: &KafkaError, topic: &str, ack_timeout: Duration) -> (u16, String) {
    let code = e.rdkafka_error_code();
    match code {
        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => (
            403,
            format!("the broker refused: {e} (the principal needs WRITE on topic {topic})"),
        ),
        Some(RDKafkaErrorCode::ClusterAuthorizationFailed) => (
            403,
            format!("the broker refused: {e} (clusters before 2.8 need IDEMPOTENT_WRITE on the cluster)"),
        ),
        Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed) => (
            403,
            format!("the broker refused: {e} (the principal needs WRITE on the transactional id)"),
        ),
        Some(RDKafkaErrorCode::MessageTimedOut) => (
            504,
            format!(
                "not acknowledged by the broker within {} ms; the record may or may not have been written",
                ack_timeout.as_millis()
            ),
        ),
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
            (404, format!("topic {topic:?} does not exist: {e}"))
        }
        Some(RDKafkaErrorCode::UnknownPartition) => (422, format!("{e}")),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::MessageBatchTooLarge,
        ) => (413, format!("the record is too large for topic {topic:?}: {e}")),
        Some(RDKafkaErrorCode::QueueFull) => (503, format!("the producer queue is full: {e}")),
        Some(
            RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::NotEnoughReplicas
            | RDKafkaErrorCode::NotEnoughReplicasAfterAppend
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::OperationTimedOut,
        ) => (503, format!("the cluster is unavailable: {e}")),
        _ => (502, format!("the broker answered an error: {e}")),
    }
}

/// Everything one connection needs to produce.
pub struct Publisher {
    connection: String,
    producer: IdempotentProducer,
    transactional: Option<TransactionalProducer>,
    encoder: Encoder,
    default_value_format: ProduceFormat,
    partitions: Mutex<HashMap<String, (usize, Instant)>>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("connection", &self.connection)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// A publisher over the connection's shared producer and registry client.
    pub fn new(
        name: &str,
        conn: &ConnectionConfig,
        producer: IdempotentProducer,
        registry: Option<Arc<crate::codec::registry::RegistryClient>>,
    ) -> Self {
        let default_value_format = if registry.is_some() {
            ProduceFormat::SchemaRegistry
        } else {
            ProduceFormat::Json
        };
        Self {
            connection: name.to_owned(),
            transactional: conn
                .producer
                .transactional_id_prefix
                .as_deref()
                .map(|p| TransactionalProducer::new(name, conn, p)),
            producer,
            encoder: Encoder::new(registry),
            default_value_format,
            partitions: Mutex::new(HashMap::new()),
        }
    }

    /// The connection name.
    pub fn connection(&self) -> &str {
        &self.connection
    }

    /// Checks, encodes and writes `messages`; all or nothing when `transactional`.
    pub async fn publish(
        &self,
        messages: &[MessageIn],
        transactional: bool,
    ) -> Result<Vec<Written>, ProduceError> {
        if transactional && self.transactional.is_none() {
            return Err(ProduceError::NoTransactions(self.connection.clone()));
        }
        let records = self.prepare(messages).await?;
        if let (true, Some(tx)) = (transactional, &self.transactional) {
            let started = Instant::now();
            return match tx.write_all(&records).await {
                Ok(offsets) => {
                    for _ in &records {
                        self.producer.observe(true, started);
                    }
                    Ok(records
                        .iter()
                        .zip(offsets)
                        .map(|(r, (partition, offset))| Written {
                            topic: r.topic.clone(),
                            partition,
                            offset,
                        })
                        .collect())
                }
                Err(e) => {
                    self.producer.observe(false, started);
                    let (index, source) = match &e {
                        TransactionError::Record { index, source } => (*index, source),
                        TransactionError::Control { source, .. } => (0, source),
                    };
                    let topic = records.get(index).map_or("", |r| r.topic.as_str());
                    let (status, reason) =
                        classify_kafka_error(source, topic, self.producer.ack_timeout());
                    Err(ProduceError::Broker {
                        index,
                        status,
                        reason: format!(
                            "{reason}; the transaction was aborted, nothing is visible"
                        ),
                        results: None,
                    })
                }
            };
        }
        self.write(records).await
    }

    async fn write(&self, records: Vec<OutRecord>) -> Result<Vec<Written>, ProduceError> {
        let started = Instant::now();
        let mut pending = Vec::with_capacity(records.len());
        for r in &records {
            pending.push(self.producer.enqueue(r).await);
        }
        let mut outcomes = Vec::with_capacity(records.len());
        let mut first_failure: Option<(usize, u16, String)> = None;
        for (index, (r, p)) in records.iter().zip(pending).enumerate() {
            let result = match p {
                Ok(delivery) => match delivery.await {
                    Ok(Ok(d)) => Ok((d.partition, d.offset)),
                    Ok(Err((e, _))) => Err(e),
                    Err(_) => Err(KafkaError::Canceled),
                },
                Err(e) => Err(e),
            };
            self.producer.observe(result.is_ok(), started);
            let fatal = self.producer.settle(result.is_ok());
            match result {
                Ok((partition, offset)) => outcomes.push(RecordOutcome::Written(Written {
                    topic: r.topic.clone(),
                    partition,
                    offset,
                })),
                Err(e) => {
                    let (status, error) = match (refused_write(&e, fatal.as_ref(), &r.topic), &fatal) {
                        (Some(reason), _) => (403, format!("the broker refused: {reason}")),
                        // Fenced or otherwise broken: it is rebuilt on the next write.
                        (None, Some((code, why))) => (
                            503,
                            format!("the idempotent producer failed ({code:?}: {why}); it is being rebuilt"),
                        ),
                        (None, None) => {
                            classify_kafka_error(&e, &r.topic, self.producer.ack_timeout())
                        }
                    };
                    if first_failure.is_none() {
                        first_failure = Some((index, status, error.clone()));
                    }
                    outcomes.push(RecordOutcome::Failed { status, error });
                }
            }
        }
        match first_failure {
            None => Ok(outcomes
                .into_iter()
                .filter_map(|o| match o {
                    RecordOutcome::Written(w) => Some(w),
                    RecordOutcome::Failed { .. } => None,
                })
                .collect()),
            Some((index, status, reason)) => Err(ProduceError::Broker {
                index,
                status,
                reason,
                results: Some(outcomes),
            }),
        }
    }

    /// Checks topics and partitions and encodes every record, before anything is written.
    async fn prepare(&self, messages: &[MessageIn]) -> Result<Vec<OutRecord>, ProduceError> {
        let mut records = Vec::with_capacity(messages.len());
        for (index, m) in messages.iter().enumerate() {
            let count = self.partition_count(index, &m.topic).await?;
            if let Some(p) = m.partition {
                if p < 0 || p as usize >= count {
                    return Err(ProduceError::UnknownPartition {
                        index,
                        topic: m.topic.clone(),
                        partition: p,
                        count,
                    });
                }
            }
            let key_format = m.key_format.unwrap_or(match &m.key {
                Json::String(_) => ProduceFormat::String,
                _ => ProduceFormat::Json,
            });
            let value_format = m.value_format.unwrap_or(self.default_value_format);
            let key = self
                .encoder
                .encode(&m.key, key_format, &m.key_schema, &m.topic, true)
                .await
                .map_err(|source| ProduceError::Encode { index, source })?;
            let value = self
                .encoder
                .encode(&m.value, value_format, &m.value_schema, &m.topic, false)
                .await
                .map_err(|source| ProduceError::Encode { index, source })?;
            records.push(OutRecord {
                topic: m.topic.clone(),
                partition: m.partition,
                key,
                value,
                headers: m
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_ref().map(|v| v.as_bytes().to_vec())))
                    .collect(),
                timestamp: m.timestamp,
            });
        }
        Ok(records)
    }

    async fn partition_count(&self, index: usize, topic: &str) -> Result<usize, ProduceError> {
        {
            let cache = self.partitions.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((n, at)) = cache.get(topic) {
                if at.elapsed() < TOPIC_TTL {
                    return Ok(*n);
                }
            }
        }
        let deadline = tokio::time::Instant::now() + TOPIC_PROPAGATION;
        let mut answer = self.producer.partition_count(topic).await;
        while answer.as_ref().is_err_and(unknown_topic)
            && tokio::time::Instant::now() + TOPIC_PROPAGATION_STEP < deadline
        {
            tokio::time::sleep(TOPIC_PROPAGATION_STEP).await;
            answer = self.producer.partition_count(topic).await;
        }
        match answer {
            Ok(n) => {
                let mut cache = self.partitions.lock().unwrap_or_else(|p| p.into_inner());
                let _ = cache.insert(topic.to_owned(), (n, Instant::now()));
                Ok(n)
            }
            Err(e) if unknown_topic(&e) => Err(ProduceError::UnknownTopic {
                index,
                topic: topic.to_owned(),
                connection: self.connection.clone(),
            }),
            Err(e) => {
                let (status, reason) = match e.rdkafka_error_code() {
                    Some(RDKafkaErrorCode::TopicAuthorizationFailed) => (
                        403,
                        format!(
                            "the broker refused: {e} (the principal needs WRITE on topic {topic})"
                        ),
                    ),
                    _ => classify_kafka_error(&e, topic, self.producer.ack_timeout()),
                };
                Err(ProduceError::Broker {
                    index,
                    status,
                    reason,
                    results: None,
                })
            }
        }
    }
}
