//! The connection's idempotent producer (`enable.idempotence=true`, `acks=all`), shared by
//! dead-letter writes and the produce API, and its transactional sibling for all-or-nothing
//! batches. A record counts as written only once the broker acknowledged it.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

use crate::clients::security::{ConnectFailure, MskIamSigner, SecurityContext};
use crate::config::ConnectionConfig;

/// The producer client: its context forwards librdkafka's log and serves MSK IAM tokens.
type Client = FutureProducer<SecurityContext>;

/// How long a blocking metadata or transaction call may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

pub use crate::clients::producer_config;

/// One header added to a written record.
pub type ExtraHeader = (String, String);

/// The idempotent producer of a connection. After a fatal error (for example the broker
/// refused the producer id for lack of WRITE) librdkafka fails every later write; the
/// producer is then replaced by a new one, at most every [`REBUILD_INTERVAL`], so a
/// permission granted later takes effect without a restart.
#[derive(Clone)]
pub struct IdempotentProducer {
    shared: std::sync::Arc<Shared>,
    connection: String,
    ack_timeout: Duration,
}

/// What the clones of an [`IdempotentProducer`] share.
struct Shared {
    /// The client in use; replaced after a fatal error.
    current: std::sync::RwLock<Client>,
    /// How a replacement is built.
    config: ClientConfig,
    signer: Option<std::sync::Arc<MskIamSigner>>,
    /// The last connection failure of the current client (and of the ones it replaced).
    failures: std::sync::Arc<std::sync::Mutex<Option<ConnectFailure>>>,
    /// The fatal error that caused the last replacement, until a write succeeds.
    last_fatal: std::sync::Mutex<Option<(RDKafkaErrorCode, String)>>,
    /// When the client was last replaced.
    last_rebuild: std::sync::Mutex<Option<std::time::Instant>>,
}

/// Least time between two replacements of a fatally failed producer.
const REBUILD_INTERVAL: Duration = Duration::from_secs(5);

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
        let signer = MskIamSigner::from_config(conn, |v| std::env::var(v).ok())
            .map_err(|e| KafkaError::ClientCreation(e.to_string()))?
            .map(std::sync::Arc::new);
        let config = producer_config(name, conn);
        let context = SecurityContext::new(name, signer.clone());
        let failures = context.failure_slot();
        let client = config.create_with_context(context)?;
        Ok(Self {
            shared: std::sync::Arc::new(Shared {
                current: std::sync::RwLock::new(client),
                config,
                signer,
                failures,
                last_fatal: std::sync::Mutex::new(None),
                last_rebuild: std::sync::Mutex::new(None),
            }),
            connection: name.to_owned(),
            ack_timeout: Duration::from_millis(conn.producer.ack_timeout_ms),
        })
    }

    /// The client in use.
    fn client(&self) -> Client {
        self.shared
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The error that made the producer unusable, if any (librdkafka's fatal error: for
    /// the idempotent producer, typically a refused producer id), also when the producer
    /// was already replaced because of it.
    pub fn fatal_error(&self) -> Option<(RDKafkaErrorCode, String)> {
        self.client().client().fatal_error().or_else(|| {
            self.shared
                .last_fatal
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        })
    }

    /// After a failed write: replaces the client when it failed fatally (not more often
    /// than every [`REBUILD_INTERVAL`]). The old client is closed off the async threads.
    fn replace_if_fatal(&self) {
        let Some(fatal) = self.client().client().fatal_error() else {
            return;
        };
        *self
            .shared
            .last_fatal
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(fatal.clone());
        {
            let mut last = self
                .shared
                .last_rebuild
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < REBUILD_INTERVAL) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        let context = SecurityContext::new(&self.connection, self.shared.signer.clone())
            .with_failure_slot(std::sync::Arc::clone(&self.shared.failures));
        match self.shared.config.create_with_context(context) {
            Ok(new) => {
                let old = std::mem::replace(
                    &mut *self
                        .shared
                        .current
                        .write()
                        .unwrap_or_else(|p| p.into_inner()),
                    new,
                );
                drop(tokio::task::spawn_blocking(move || drop(old)));
                tracing::warn!(connection = %self.connection, code = ?fatal.0, error = %fatal.1, "idempotent producer failed fatally; replaced by a new one");
            }
            Err(e) => {
                tracing::error!(connection = %self.connection, error = %e, "cannot replace the fatally failed producer")
            }
        }
    }

    /// Asks the cluster for `topic`'s metadata (every topic's when None), off the async
    /// threads: whether a broker answers within `timeout`.
    pub async fn probe(&self, topic: Option<String>, timeout: Duration) -> Result<(), KafkaError> {
        let client = self.client();
        let fetch = tokio::task::spawn_blocking(move || {
            client
                .client()
                .fetch_metadata(topic.as_deref(), timeout)
                .map(|_| ())
        });
        match fetch.await {
            Ok(result) => result,
            Err(e) => {
                tracing::error!(connection = %self.connection, error = %e, "the metadata probe thread failed");
                Err(KafkaError::MetadataFetch(RDKafkaErrorCode::Fail))
            }
        }
    }

    /// The last authentication, TLS or connection failure librdkafka reported.
    pub fn connect_failure(&self) -> Option<ConnectFailure> {
        self.shared
            .failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The connection name.
    pub fn connection(&self) -> &str {
        &self.connection
    }

    /// How long the broker may take to acknowledge a record.
    pub fn ack_timeout(&self) -> Duration {
        self.ack_timeout
    }

    /// The partition count of `topic`, from a metadata request (blocking, run off the async
    /// threads). Unknown topics and refused DESCRIBE come back as the broker's error code.
    pub async fn partition_count(&self, topic: &str) -> Result<usize, KafkaError> {
        partition_count(self.client(), topic).await
    }

    /// Queues `record` in order behind the records queued before it and returns the
    /// acknowledgement to wait for. A full local queue is waited out, not refused.
    pub async fn enqueue(&self, record: &OutRecord) -> Result<DeliveryFuture, KafkaError> {
        let result = enqueue(&self.client(), record, self.ack_timeout).await;
        if result.is_err() {
            self.replace_if_fatal();
        }
        result
    }

    /// After the outcome of an [`IdempotentProducer::enqueue`]d record: a success clears a
    /// remembered fatal error; a failure replaces a fatally failed client and returns the
    /// fatal error that explains it (the record's own error is then only a consequence,
    /// such as a purged queue).
    pub fn settle(&self, ok: bool) -> Option<(RDKafkaErrorCode, String)> {
        if ok {
            *self
                .shared
                .last_fatal
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = None;
            return None;
        }
        self.replace_if_fatal();
        self.fatal_error()
    }

    /// Records a delivery outcome in the producer metrics.
    pub fn observe(&self, ok: bool, started: std::time::Instant) {
        crate::telemetry::metrics::producer_delivery(
            &self.connection,
            ok,
            started.elapsed().as_secs_f64(),
        );
    }

    /// Writes `original` (key, value and headers kept) to `topic` with `extra` headers
    /// appended, and waits for the broker's acknowledgement. The copy is stamped with the
    /// time it is written, not the original's timestamp: an old timestamp could let the
    /// topic's `retention.ms` delete it at once, or the broker refuse it
    /// (`log.message.timestamp.before.max.ms`); callers keep the original's in a header.
    pub async fn write_copy(
        &self,
        topic: &str,
        original: &OwnedMessage,
        extra: &[ExtraHeader],
    ) -> Result<(i32, i64), KafkaError> {
        // Copied whole by librdkafka: names need not be UTF-8 (see `codec::headers`).
        let mut headers = original
            .headers()
            .map_or_else(OwnedHeaders::new, |h| h.as_borrowed().detach());
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
        let started = std::time::Instant::now();
        let result = self
            .client()
            .send(record, self.ack_timeout)
            .await
            .map(|d| (d.partition, d.offset))
            .map_err(|(e, _)| e);
        match &result {
            Ok(_) => {
                *self
                    .shared
                    .last_fatal
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = None;
            }
            Err(_) => self.replace_if_fatal(),
        }
        crate::telemetry::metrics::producer_delivery(
            &self.connection,
            result.is_ok(),
            started.elapsed().as_secs_f64(),
        );
        result
    }
}

/// If writing to `topic` failed for lack of WRITE, the explanation, naming the permission the
/// way the product page does: the broker answered TOPIC_AUTHORIZATION_FAILED, or refused
/// the idempotent producer its id (`fatal`, from [`IdempotentProducer::fatal_error`]),
/// which since Kafka 2.8 WRITE on a topic grants (before, IDEMPOTENT_WRITE on the cluster).
pub fn refused_write(
    e: &KafkaError,
    fatal: Option<&(RDKafkaErrorCode, String)>,
    topic: &str,
) -> Option<String> {
    let fatal = fatal.filter(|(code, _)| {
        matches!(
            code,
            RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::TopicAuthorizationFailed
        )
    });
    let permission = format!("WRITE on topic {topic}");
    match fatal {
        Some((_, why)) => Some(format!(
            "missing {permission}, or IDEMPOTENT_WRITE on the cluster before Kafka 2.8 \
             ({e}: {why})"
        )),
        None if e.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
            Some(format!("missing {permission} ({e})"))
        }
        None => None,
    }
}

/// A record ready to be written: encoded key and value, headers, an optional partition and
/// timestamp.
#[derive(Clone, Debug, Default)]
pub struct OutRecord {
    /// Destination topic.
    pub topic: String,
    /// Partition, or the partitioner's choice by key.
    pub partition: Option<i32>,
    /// Encoded key.
    pub key: Option<Vec<u8>>,
    /// Encoded value; `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    /// Headers in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Create time in milliseconds; default now.
    pub timestamp: Option<i64>,
}

impl OutRecord {
    /// Bytes of key, value and headers.
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.value.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
    }
}

async fn enqueue(
    producer: &Client,
    r: &OutRecord,
    wait_limit: Duration,
) -> Result<DeliveryFuture, KafkaError> {
    let deadline = tokio::time::Instant::now() + wait_limit;
    loop {
        let mut headers = OwnedHeaders::new_with_capacity(r.headers.len());
        for (k, v) in &r.headers {
            headers = headers.insert(Header {
                key: k,
                value: v.as_deref(),
            });
        }
        let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&r.topic).headers(headers);
        if let Some(k) = &r.key {
            record = record.key(k.as_slice());
        }
        if let Some(v) = &r.value {
            record = record.payload(v.as_slice());
        }
        if let Some(p) = r.partition {
            record = record.partition(p);
        }
        if let Some(t) = r.timestamp {
            record = record.timestamp(t);
        }
        match producer.send_result(record) {
            Ok(delivery) => return Ok(delivery),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((e, _)) => return Err(e),
        }
    }
}

async fn partition_count(producer: Client, topic: &str) -> Result<usize, KafkaError> {
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let md = producer
            .client()
            .fetch_metadata(Some(&topic), CONTROL_TIMEOUT)?;
        let t = md
            .topics()
            .iter()
            .find(|t| t.name() == topic)
            .ok_or(KafkaError::MetadataFetch(
                RDKafkaErrorCode::UnknownTopicOrPartition,
            ))?;
        if let Some(e) = t.error() {
            return Err(KafkaError::MetadataFetch(e.into()));
        }
        if t.partitions().is_empty() {
            return Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::UnknownTopicOrPartition,
            ));
        }
        Ok(t.partitions().len())
    })
    .await
    .unwrap_or(Err(KafkaError::Canceled))
}

/// A transactional producer for all-or-nothing batches (`transactional.id` =
/// `<prefix>-<connection>`). One transaction at a time; callers queue on its lock. After a
/// fatal error it is built again on next use (which fences the old one).
pub struct TransactionalProducer {
    config: ClientConfig,
    connection: String,
    ack_timeout: Duration,
    /// Signs MSK IAM tokens (or why it cannot), for each producer built.
    signer: Result<Option<std::sync::Arc<MskIamSigner>>, String>,
    producer: tokio::sync::Mutex<Option<Client>>,
}

impl std::fmt::Debug for TransactionalProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalProducer")
            .field("connection", &self.connection)
            .finish_non_exhaustive()
    }
}

/// Why a transaction did not commit.
#[derive(Debug, thiserror::Error)]
pub enum TransactionError {
    /// A record was refused; the transaction was aborted and nothing is visible.
    #[error(
        "record {index} was refused ({source}); the transaction was aborted, nothing was written"
    )]
    Record {
        /// Position of the refused record in the batch.
        index: usize,
        /// The broker's or client's error.
        #[source]
        source: KafkaError,
    },
    /// Beginning, committing or aborting failed.
    #[error("transaction {stage} failed: {source}")]
    Control {
        /// `init`, `begin`, `commit` or `abort`.
        stage: &'static str,
        /// The error.
        #[source]
        source: KafkaError,
    },
}

impl TransactionalProducer {
    /// Prepares the producer; it connects on first use.
    pub fn new(name: &str, conn: &ConnectionConfig, prefix: &str) -> Self {
        let mut config = producer_config(name, conn);
        let _ = config
            .set("transactional.id", format!("{prefix}-{name}"))
            .set(
                "transaction.timeout.ms",
                (conn.producer.ack_timeout_ms * 2).max(60_000).to_string(),
            );
        Self {
            config,
            connection: name.to_owned(),
            ack_timeout: Duration::from_millis(conn.producer.ack_timeout_ms),
            signer: MskIamSigner::from_config(conn, |v| std::env::var(v).ok())
                .map(|s| s.map(std::sync::Arc::new))
                .map_err(|e| e.to_string()),
            producer: tokio::sync::Mutex::new(None),
        }
    }

    /// Writes `records` in one transaction: all become visible to read_committed consumers,
    /// or none. Returns each record's (partition, offset).
    pub async fn write_all(
        &self,
        records: &[OutRecord],
    ) -> Result<Vec<(i32, i64)>, TransactionError> {
        let mut slot = self.producer.lock().await;
        if slot.is_none() {
            let signer = self.signer.clone().map_err(|e| TransactionError::Control {
                stage: "init",
                source: KafkaError::ClientCreation(e),
            })?;
            let p: Client = self
                .config
                .create_with_context(SecurityContext::new(&self.connection, signer))
                .map_err(|source| TransactionError::Control {
                    stage: "init",
                    source,
                })?;
            let q = p.clone();
            blocking(move || q.init_transactions(CONTROL_TIMEOUT))
                .await
                .map_err(|source| TransactionError::Control {
                    stage: "init",
                    source,
                })?;
            *slot = Some(p);
        }
        let producer = slot.clone().expect("set above");
        let result = self.run(&producer, records).await;
        if let Err(e) = &result {
            let fatal = match e {
                TransactionError::Control { source, .. }
                | TransactionError::Record { source, .. } => is_fatal(source),
            };
            if fatal {
                tracing::warn!(connection = %self.connection, error = %e, "transactional producer failed fatally; it is rebuilt on next use");
                *slot = None;
            }
        }
        result
    }

    async fn run(
        &self,
        producer: &Client,
        records: &[OutRecord],
    ) -> Result<Vec<(i32, i64)>, TransactionError> {
        let p = producer.clone();
        blocking(move || p.begin_transaction())
            .await
            .map_err(|source| TransactionError::Control {
                stage: "begin",
                source,
            })?;
        let mut deliveries = Vec::with_capacity(records.len());
        let mut failure = None;
        for (index, r) in records.iter().enumerate() {
            match enqueue(producer, r, self.ack_timeout).await {
                Ok(d) => deliveries.push(d),
                Err(source) => {
                    failure = Some(TransactionError::Record { index, source });
                    break;
                }
            }
        }
        let mut offsets = Vec::with_capacity(deliveries.len());
        for (index, d) in deliveries.into_iter().enumerate() {
            match d.await {
                Ok(Ok(delivery)) => offsets.push((delivery.partition, delivery.offset)),
                Ok(Err((source, _))) => {
                    failure.get_or_insert(TransactionError::Record { index, source });
                }
                Err(_) => {
                    failure.get_or_insert(TransactionError::Record {
                        index,
                        source: KafkaError::Canceled,
                    });
                }
            }
        }
        if let Some(f) = failure {
            let p = producer.clone();
            if let Err(source) = blocking(move || p.abort_transaction(CONTROL_TIMEOUT)).await {
                tracing::warn!(connection = %self.connection, error = %source, "aborting the transaction failed");
                return Err(TransactionError::Control {
                    stage: "abort",
                    source,
                });
            }
            return Err(f);
        }
        let p = producer.clone();
        match blocking(move || p.commit_transaction(CONTROL_TIMEOUT)).await {
            Ok(()) => Ok(offsets),
            Err(source) => {
                // An abortable commit failure leaves the transaction to abort; nothing is visible.
                let p = producer.clone();
                let _ = blocking(move || p.abort_transaction(CONTROL_TIMEOUT)).await;
                Err(TransactionError::Control {
                    stage: "commit",
                    source,
                })
            }
        }
    }
}

fn is_fatal(e: &KafkaError) -> bool {
    match e {
        KafkaError::Transaction(err) => err.is_fatal(),
        KafkaError::Canceled => true,
        _ => false,
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, KafkaError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or(Err(KafkaError::Canceled))
}
