//! The consumer calls of the commit rule ([`crate::core::committer`] decides, this sends): the
//! connection's ops task, which commits batches synchronously one request at a time off
//! the runtime's workers and reports the broker's verdict (and applies pauses and resumes, in the same
//! order as the supervisor decided them), and the final synchronous commit of a revoke or
//! shutdown, which goes out only once the task's request was answered (rule 6 of the
//! commit rule: one path).

use std::sync::Arc;

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::consumer::context::ConnectorContext;
use crate::consumer::poll_loop::{apply_flow, FlowOp};
use crate::core::committer::CommitResult;
use crate::dispatch::event::TopicPartition;
use crate::telemetry::metrics;

type Consumer_ = BaseConsumer<ConnectorContext>;

pub(super) use crate::core::CommitBatch;

/// What the ops task does, in the order it was asked.
pub(crate) enum Op {
    /// Commit a batch and answer with the broker's verdict.
    Commit(CommitBatch),
    /// Pause or resume partitions.
    Flow(FlowOp),
}

/// Starts the connection's ops task: it commits each batch synchronously (one request at a
/// time, on the blocking pool) and answers with the broker's verdict per partition, which an
/// asynchronous manual commit never reports (see [`crate::core::committer`]); and it applies
/// pauses and resumes (see [`apply_flow`]). One task for both, in the order asked: a pause
/// or resume waits at most for the commit request before it (a round trip), which a
/// partition's half-full buffer covers. It holds no thread while it waits, and ends when the
/// sender is dropped.
pub(crate) fn spawn(
    connection: &str,
    consumer: Arc<Consumer_>,
    answers: mpsc::UnboundedSender<Vec<CommitResult>>,
) -> (mpsc::UnboundedSender<Op>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Op>();
    let name: Arc<str> = Arc::from(connection);
    let handle = tokio::spawn(async move {
        while let Some(op) = rx.recv().await {
            let (c, name) = (Arc::clone(&consumer), Arc::clone(&name));
            let done = tokio::task::spawn_blocking(move || apply(&name, &c, op)).await;
            let Ok(Some(results)) = done else {
                continue;
            };
            if answers.send(results).is_err() {
                break;
            }
        }
        // The consumer's last reference may be this one: it closes off the runtime.
        let _ = tokio::task::spawn_blocking(move || drop(consumer)).await;
    });
    (tx, handle)
}

/// Carries out `op`; a commit's verdict, to answer with.
fn apply(name: &str, consumer: &Consumer_, op: Op) -> Option<Vec<CommitResult>> {
    let batch = match op {
        Op::Commit(batch) => batch,
        Op::Flow(op) => {
            apply_flow(name, consumer, op);
            return None;
        }
    };
    let tpl = tpl_of(&batch);
    let refused = match consumer.commit(&tpl, CommitMode::Sync) {
        Ok(())
        | Err(rdkafka::error::KafkaError::ConsumerCommit(
            rdkafka::types::RDKafkaErrorCode::NoOffset,
        )) => None,
        Err(e) => Some(e.to_string()),
    };
    metrics::commit(name, refused.is_none());
    if let Some(reason) = &refused {
        tracing::debug!(connection = %name, error = %reason, "offset commit refused");
    }
    Some(results(batch, refused))
}

/// The verdict on every commit of `batch`: one request, one answer.
fn results(batch: CommitBatch, refused: Option<String>) -> Vec<CommitResult> {
    batch
        .into_iter()
        .map(|(tp, offset, metadata)| CommitResult {
            tp,
            offset,
            metadata,
            refused: refused.clone(),
        })
        .collect()
}

/// The request of `batch`.
fn tpl_of(batch: &CommitBatch) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(batch.len());
    for (tp, offset, metadata) in batch {
        add(&mut tpl, tp, *offset, metadata);
    }
    tpl
}

/// Adds `tp` at `offset` with `metadata` to `tpl`.
pub(super) fn add(tpl: &mut TopicPartitionList, tp: &TopicPartition, offset: i64, metadata: &str) {
    let mut elem = tpl.add_partition(&tp.topic, tp.partition);
    let _ = elem.set_offset(Offset::Offset(offset));
    elem.set_metadata(metadata);
}

/// How long, from its first refusal, the shutdown's last commit is tried again while the
/// broker refuses it only for now ([`refused_for_now`]).
pub(super) const FINAL_COMMIT_RETRY: Duration = Duration::from_secs(10);

/// The pause between two tries of the shutdown's last commit.
const FINAL_COMMIT_BACKOFF: Duration = Duration::from_millis(100);

/// Whether the broker refused a commit only for now: the group is between generations (its
/// rebalance is in progress, or the member has not yet heard of the new generation) or its
/// coordinator moves or is loading. The member still owns its partitions then: the
/// rebalance cannot take them from it before its revoke callback returns, which waits for
/// the supervisor. A member the group no longer knows (`UNKNOWN_MEMBER_ID`), or any other
/// error, is final.
///
/// This matters when a replica stops while the group is rebalancing. The classic protocol
/// answers a member's requests in order, so a commit sent behind its pending JoinGroup is
/// answered only when the other members rejoined (up to a heartbeat interval later), and
/// then with `ILLEGAL_GENERATION` (sent with the old generation) or `REBALANCE_IN_PROGRESS`
/// (before the new one is synced). Seen on Kafka 2.8 with cooperative-sticky: a stop right
/// after a partition handover was refused so, librdkafka's own commit on close met the same
/// refusal, and the next owner was offered accepted runs again
/// (`broker::ordering::a_replica_stopping_while_its_group_waits_for_a_slow_member_repeats_nothing`).
pub(super) fn refused_for_now(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    let KafkaError::ConsumerCommit(code) = e else {
        return false;
    };
    matches!(
        code,
        C::RebalanceInProgress
            | C::IllegalGeneration
            | C::NotCoordinator
            | C::CoordinatorNotAvailable
            | C::CoordinatorLoadInProgress
            | C::RequestTimedOut
            | C::OperationTimedOut
    )
}

/// Synchronously commits `commits` (a revoke's last word), off the runtime.
pub(super) async fn commit_sync(connection: &str, consumer: &Arc<Consumer_>, commits: CommitBatch) {
    commit_sync_retrying(connection, consumer, commits, None).await;
}

/// Like [`commit_sync`], but a commit [`refused_for_now`] is tried again for `retry_for` from
/// its first refusal (the shutdown's last commit: librdkafka's threads still run the group
/// protocol meanwhile, so the rebalance that refused it can end). The first answer itself
/// can take as long as the rebalance does: the request waits behind the member's JoinGroup.
pub(super) async fn commit_sync_retrying(
    connection: &str,
    consumer: &Arc<Consumer_>,
    commits: CommitBatch,
    retry_for: Option<Duration>,
) {
    if commits.is_empty() {
        return;
    }
    let mut tries = 0u32;
    let mut retry_until = None;
    loop {
        tries += 1;
        let tpl = tpl_of(&commits);
        let c = Arc::clone(consumer);
        let result = tokio::task::spawn_blocking(move || c.commit(&tpl, CommitMode::Sync)).await;
        match result {
            Ok(Ok(())) => {
                metrics::commit(connection, true);
                tracing::info!(connection = %connection, partitions = commits.len(), tries, "offsets committed");
                return;
            }
            Ok(Err(e)) => {
                metrics::commit(connection, false);
                let now = tokio::time::Instant::now();
                let until = *retry_until.get_or_insert_with(|| now + retry_for.unwrap_or_default());
                let again = refused_for_now(&e) && now + FINAL_COMMIT_BACKOFF < until;
                if !again {
                    tracing::warn!(connection = %connection, error = %e, tries, "synchronous commit failed");
                    return;
                }
                tracing::info!(connection = %connection, error = %e, tries, "synchronous commit refused while the group rebalances; trying again");
                tokio::time::sleep(FINAL_COMMIT_BACKOFF).await;
            }
            Err(e) => {
                tracing::warn!(connection = %connection, error = %e, "commit task failed");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaErrorCode as C;

    #[test]
    fn a_commit_refused_between_generations_is_tried_again() {
        for code in [
            C::RebalanceInProgress,
            C::IllegalGeneration,
            C::NotCoordinator,
            C::CoordinatorNotAvailable,
            C::CoordinatorLoadInProgress,
            C::RequestTimedOut,
            C::OperationTimedOut,
        ] {
            assert!(
                refused_for_now(&KafkaError::ConsumerCommit(code)),
                "{code:?}"
            );
        }
    }

    #[test]
    fn a_member_the_group_forgot_or_a_refusal_for_good_is_final() {
        for code in [
            C::UnknownMemberId,
            C::FencedInstanceId,
            C::GroupAuthorizationFailed,
            C::TopicAuthorizationFailed,
            C::OffsetMetadataTooLarge,
            C::UnknownTopicOrPartition,
            C::State,
        ] {
            assert!(
                !refused_for_now(&KafkaError::ConsumerCommit(code)),
                "{code:?}"
            );
        }
        assert!(!refused_for_now(&KafkaError::StoreOffset(C::State)));
    }
}
