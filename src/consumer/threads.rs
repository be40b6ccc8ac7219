//! A connection's own tasks, which hold no thread while they wait: the poll task
//! (librdkafka's events, polled on the blocking pool) and the ops task (one commit request
//! at a time, and pauses and resumes in the order decided, on the blocking pool).

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;

use rdkafka::TopicPartitionList;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::consumer::commit_thread::{self, CommitBatch, Op};
use crate::consumer::poll_loop::{self, FlowOp};
use crate::consumer::queue_wake::Waker;
use crate::consumer::setup::{Consumer_, SupervisorError};
use crate::core::committer::CommitResult;
use crate::dispatch::event::TopicPartition;

/// The poll task of a connection, while it runs.
pub(super) struct PollThread {
    stop: Arc<AtomicBool>,
    waker: Waker,
    handle: JoinHandle<()>,
}

impl PollThread {
    /// Starts polling `consumer` of connection `name`; its events go to `events`.
    pub(super) fn spawn(
        name: &str,
        consumer: &Arc<Consumer_>,
        events: mpsc::Sender<crate::consumer::ConsumerEvent>,
    ) -> Result<Self, SupervisorError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (handle, waker) =
            poll_loop::spawn_poll_loop(Arc::clone(consumer), events, Arc::clone(&stop))
                .map_err(|e| SupervisorError::Thread(name.to_owned(), e))?;
        Ok(Self {
            stop,
            waker,
            handle,
        })
    }

    /// Stops polling and waits for the task, which closes the consumer if it holds the
    /// last reference.
    pub(super) async fn join(self) {
        self.stop.store(true, AtomicOrdering::SeqCst);
        self.waker.wake();
        let _ = self.handle.await;
    }
}

/// The ops task of a connection (commits, pauses and resumes, in order), while it runs.
pub(super) struct Threads {
    ops: mpsc::UnboundedSender<Op>,
    ops_task: JoinHandle<()>,
}

impl Threads {
    /// Starts the ops task of connection `name`; commit answers arrive on `answers`.
    pub(super) fn spawn(
        name: &str,
        consumer: &Arc<Consumer_>,
        answers: mpsc::UnboundedSender<Vec<CommitResult>>,
    ) -> Self {
        let (ops, ops_task) = commit_thread::spawn(name, Arc::clone(consumer), answers);
        Self { ops, ops_task }
    }

    /// Hands a commit request to the ops task; fails when the task has ended.
    pub(super) fn commit(&self, name: &str, batch: CommitBatch) -> Result<(), SupervisorError> {
        self.ops.send(Op::Commit(batch)).map_err(|_| {
            let e = std::io::Error::other("the ops task ended");
            SupervisorError::Thread(name.to_owned(), e)
        })
    }

    /// Lets the task finish what it was given and waits for it: its commit request is
    /// answered before anything commits after it.
    pub(super) async fn join(self) {
        drop(self.ops);
        let _ = self.ops_task.await;
    }
}

/// Pauses or resumes `tps` through the ops task of `threads` (in the order decided), or
/// on this thread while it does not run (before the connection runs, during shutdown).
pub(super) fn pause_or_resume(
    threads: Option<&Threads>,
    name: &str,
    consumer: &Consumer_,
    pause: bool,
    tps: &[TopicPartition],
) {
    let mut partitions = TopicPartitionList::with_capacity(tps.len());
    for tp in tps {
        let _ = partitions.add_partition(&tp.topic, tp.partition);
    }
    let op = FlowOp { pause, partitions };
    let op = match threads {
        Some(t) => match t.ops.send(Op::Flow(op)) {
            Ok(()) => return,
            Err(mpsc::error::SendError(Op::Flow(op))) => op,
            Err(_) => return,
        },
        None => op,
    };
    poll_loop::apply_flow(name, consumer, op);
}

/// Sleeps until `deadline`, or for ever without one.
pub(super) async fn sleep_until_opt(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
