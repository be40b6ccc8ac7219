//! The consumer calls of the commit rule ([`crate::core::committer`] decides, this sends): the
//! connection's commit task, which commits batches synchronously one request at a time off
//! the runtime's workers and reports the broker's verdict, and the final synchronous commit
//! of a revoke or shutdown, which goes out only once the task's request was answered (rule 6
//! of the commit rule: one path).

use std::sync::Arc;

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::mpsc;

use crate::consumer::port::{self, KafkaPort};
use crate::core::committer::CommitResult;
use crate::dispatch::event::TopicPartition;
use crate::telemetry::metrics;

pub(super) use crate::core::CommitBatch;

/// Starts the connection's commit task: it commits each batch synchronously (one request at
/// a time, on the blocking pool) and answers with the broker's verdict per partition, which
/// an asynchronous manual commit never reports (see [`crate::core::committer`]). It holds no
/// thread while it waits, and ends when the sender is dropped. (Pauses, resumes and seeks
/// are the poll task's, between two polls: see [`crate::consumer::poll_loop::FlowQueue`].)
pub(crate) fn spawn<P: KafkaPort>(
    connection: &str,
    consumer: Arc<P>,
    answers: mpsc::UnboundedSender<Vec<CommitResult>>,
) -> (
    mpsc::UnboundedSender<CommitBatch>,
    tokio::task::JoinHandle<Option<String>>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<CommitBatch>();
    let name: Arc<str> = Arc::from(connection);
    let handle = tokio::spawn(async move {
        while let Some(batch) = rx.recv().await {
            let (c, name) = (Arc::clone(&consumer), Arc::clone(&name));
            let done = port::call::<P, _>(move || apply(&name, &*c, batch)).await;
            let results = match done {
                Ok(results) => results,
                // A request whose answer is lost would hold the connection's commits for
                // good: the task ends, and the supervisor restarts the connection.
                Err(reason) => return Some(reason),
            };
            if answers.send(results).is_err() {
                break;
            }
        }
        // The consumer's last reference may be this one: it closes off the runtime.
        let _ = port::call::<P, _>(move || drop(consumer)).await;
        None
    });
    (tx, handle)
}

/// Commits `batch`; the broker's verdict, to answer with.
fn apply<P: KafkaPort>(name: &str, consumer: &P, batch: CommitBatch) -> Vec<CommitResult> {
    let (request, partitions) = consumer.commit(&batch);
    let results = results(batch, request, &partitions);
    let refused = results.iter().filter(|r| r.refused.is_some()).count();
    metrics::commit(name, refused == 0);
    if refused > 0 {
        tracing::debug!(connection = %name, refused, of = results.len(), error = ?request, "offset commit refused");
    }
    results
}

/// The verdict on each commit of `batch`, partition by partition: the broker stores or
/// refuses each partition of a request on its own (a deleted topic, a missing topic
/// permission, metadata over `offset.metadata.max.bytes` refuse only theirs). A partition the
/// answer does not name carries the request's error. "No offset" (nothing to commit) is no
/// refusal.
fn results(
    batch: CommitBatch,
    request: Option<RDKafkaErrorCode>,
    partitions: &[(TopicPartition, Option<RDKafkaErrorCode>)],
) -> Vec<CommitResult> {
    let refusal = |code: Option<RDKafkaErrorCode>| {
        code.filter(|c| *c != RDKafkaErrorCode::NoOffset)
            .map(|c| KafkaError::ConsumerCommit(c).to_string())
    };
    batch
        .into_iter()
        .map(|(tp, offset, metadata)| {
            let own = partitions
                .iter()
                .find(|(t, _)| *t == tp)
                .map_or(request, |(_, code)| *code);
            CommitResult {
                tp,
                offset,
                metadata,
                refused: refusal(own),
                partition_only: own.is_some_and(partition_only),
            }
        })
        .collect()
}

/// Whether the broker refused a partition's commit for a reason of that partition alone,
/// rather than for the member's standing in the group (a rebalance, an unknown or fenced
/// member, a moving coordinator), which every partition of the request shares.
fn partition_only(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::UnknownTopicOrPartition
            | C::UnknownTopicId
            | C::TopicAuthorizationFailed
            | C::OffsetMetadataTooLarge
            | C::InvalidCommitOffsetSize
            | C::InvalidTopic
            | C::UnstableOffsetCommit
    )
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
pub(super) async fn commit_sync<P: KafkaPort>(
    connection: &str,
    consumer: &Arc<P>,
    commits: CommitBatch,
) {
    commit_sync_retrying(connection, consumer, commits, None).await;
}

/// Like [`commit_sync`], but a commit [`refused_for_now`] is tried again for `retry_for` from
/// its first refusal (the shutdown's last commit: librdkafka's threads still run the group
/// protocol meanwhile, so the rebalance that refused it can end). The first answer itself
/// can take as long as the rebalance does: the request waits behind the member's JoinGroup.
pub(super) async fn commit_sync_retrying<P: KafkaPort>(
    connection: &str,
    consumer: &Arc<P>,
    commits: CommitBatch,
    retry_for: Option<Duration>,
) {
    if commits.is_empty() {
        return;
    }
    let mut tries = 0u32;
    let commits = Arc::new(commits);
    let mut retry_until = None;
    loop {
        tries += 1;
        let (c, batch) = (Arc::clone(consumer), Arc::clone(&commits));
        let result = port::call::<P, _>(move || c.commit_sync(&batch)).await;
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
