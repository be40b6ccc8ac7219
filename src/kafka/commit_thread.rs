//! The consumer calls of the commit rule ([`super::committer`] decides, this sends): the
//! connection's commit thread, which commits batches synchronously one request at a time off
//! the runtime and reports the broker's verdict, and the final synchronous commit of a revoke
//! or shutdown.

use std::sync::Arc;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use super::committer::CommitResult;
use super::context::ConnectorContext;
use crate::dispatch::event::TopicPartition;
use crate::telemetry::metrics;

type Consumer_ = BaseConsumer<ConnectorContext>;

/// What the commit thread is asked to commit: partitions with offsets and metadata.
pub type CommitBatch = Vec<(TopicPartition, i64, String)>;

/// Starts the connection's commit thread: it commits each batch synchronously (one request
/// at a time, off the runtime) and answers with the broker's verdict per partition, which an
/// asynchronous manual commit never reports (see [`super::committer`]). It ends when the
/// request sender is dropped.
pub fn spawn(
    connection: &str,
    consumer: Arc<Consumer_>,
    answers: mpsc::UnboundedSender<Vec<CommitResult>>,
) -> std::io::Result<(
    std::sync::mpsc::Sender<CommitBatch>,
    std::thread::JoinHandle<()>,
)> {
    let (tx, rx) = std::sync::mpsc::channel::<CommitBatch>();
    let name = connection.to_owned();
    let handle = std::thread::Builder::new()
        .name(format!("kafka-commit-{connection}"))
        .spawn(move || {
            while let Ok(batch) = rx.recv() {
                let mut tpl = TopicPartitionList::with_capacity(batch.len());
                for (tp, offset, metadata) in &batch {
                    add(&mut tpl, tp, *offset, metadata);
                }
                let refused = match consumer.commit(&tpl, CommitMode::Sync) {
                    Ok(())
                    | Err(rdkafka::error::KafkaError::ConsumerCommit(
                        rdkafka::types::RDKafkaErrorCode::NoOffset,
                    )) => None,
                    Err(e) => Some(e.to_string()),
                };
                metrics::commit(&name, refused.is_none());
                if let Some(reason) = &refused {
                    tracing::debug!(connection = %name, error = %reason, "offset commit refused");
                }
                let results = batch
                    .into_iter()
                    .map(|(tp, offset, metadata)| CommitResult {
                        tp,
                        offset,
                        metadata,
                        refused: refused.clone(),
                    })
                    .collect();
                if answers.send(results).is_err() {
                    break;
                }
            }
            drop(consumer);
        })?;
    Ok((tx, handle))
}

/// Adds `tp` at `offset` with `metadata` to `tpl`.
pub fn add(tpl: &mut TopicPartitionList, tp: &TopicPartition, offset: i64, metadata: &str) {
    let mut elem = tpl.add_partition(&tp.topic, tp.partition);
    let _ = elem.set_offset(Offset::Offset(offset));
    elem.set_metadata(metadata);
}

/// Stores and synchronously commits `commits` (a revoke's or the shutdown's last word), off
/// the runtime.
pub async fn commit_sync(connection: &str, consumer: &Arc<Consumer_>, commits: CommitBatch) {
    if commits.is_empty() {
        return;
    }
    let mut tpl = TopicPartitionList::with_capacity(commits.len());
    for (tp, offset, metadata) in &commits {
        add(&mut tpl, tp, *offset, metadata);
    }
    let consumer = Arc::clone(consumer);
    // Store first: librdkafka commits stored offsets again on close, and an older stored
    // offset must not replace this commit.
    let result = tokio::task::spawn_blocking(move || {
        consumer.store_offsets(&tpl)?;
        consumer.commit(&tpl, CommitMode::Sync)
    })
    .await;
    match result {
        Ok(Ok(())) => {
            metrics::commit(connection, true);
            tracing::info!(connection = %connection, partitions = commits.len(), "offsets committed");
        }
        Ok(Err(e)) => {
            metrics::commit(connection, false);
            tracing::warn!(connection = %connection, error = %e, "synchronous commit failed");
        }
        Err(e) => tracing::warn!(connection = %connection, error = %e, "commit task failed"),
    }
}
