//! A connection's own threads: the poll thread (librdkafka's events, off the runtime), the
//! commit thread (one commit request at a time, off the runtime) and the flow thread (pauses
//! and resumes, in the order decided, off the runtime).

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;

use rdkafka::TopicPartitionList;
use tokio::sync::mpsc;

use crate::consumer::commit_thread::{self, CommitBatch};
use crate::consumer::poll_loop::{self, FlowOp};
use crate::consumer::queue_wake::Waker;
use crate::consumer::setup::{Consumer_, SupervisorError};
use crate::core::committer::CommitResult;
use crate::dispatch::event::TopicPartition;

/// The poll thread of a connection, while it runs.
pub(super) struct PollThread {
    stop: Arc<AtomicBool>,
    waker: Waker,
    handle: std::thread::JoinHandle<()>,
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
            poll_loop::spawn_poll_loop(name, Arc::clone(consumer), events, Arc::clone(&stop))
                .map_err(|e| SupervisorError::Thread(name.to_owned(), e))?;
        Ok(Self {
            stop,
            waker,
            handle,
        })
    }

    /// Stops polling and waits for the thread, which closes the consumer if it holds the
    /// last reference.
    pub(super) async fn join(self) {
        self.stop.store(true, AtomicOrdering::SeqCst);
        self.waker.wake();
        let handle = self.handle;
        let _ = tokio::task::spawn_blocking(move || handle.join()).await;
    }
}

/// The commit and flow threads of a connection, while they run.
pub(super) struct Threads {
    commits: std::sync::mpsc::Sender<CommitBatch>,
    commit_thread: std::thread::JoinHandle<()>,
    flow: std::sync::mpsc::Sender<FlowOp>,
    flow_thread: std::thread::JoinHandle<()>,
}

impl Threads {
    /// Starts both threads of connection `name`; commit answers arrive on `answers`.
    pub(super) fn spawn(
        name: &str,
        consumer: &Arc<Consumer_>,
        answers: mpsc::UnboundedSender<Vec<CommitResult>>,
    ) -> Result<Self, SupervisorError> {
        let error = |e| SupervisorError::Thread(name.to_owned(), e);
        let (commits, commit_thread) =
            commit_thread::spawn(name, Arc::clone(consumer), answers).map_err(error)?;
        let (flow, flow_thread) =
            poll_loop::spawn_flow_thread(name, Arc::clone(consumer)).map_err(error)?;
        Ok(Self {
            commits,
            commit_thread,
            flow,
            flow_thread,
        })
    }

    /// Hands a commit request to the commit thread; fails when the thread has ended.
    pub(super) fn commit(&self, name: &str, batch: CommitBatch) -> Result<(), SupervisorError> {
        self.commits.send(batch).map_err(|_| {
            let e = std::io::Error::other("the commit thread ended");
            SupervisorError::Thread(name.to_owned(), e)
        })
    }

    /// Lets both threads finish what they were given and waits for them: the commit thread's
    /// request is answered before anything commits after it.
    pub(super) async fn join(self) {
        drop((self.commits, self.flow));
        let (commit_thread, flow_thread) = (self.commit_thread, self.flow_thread);
        let _ = tokio::task::spawn_blocking(move || {
            let _ = commit_thread.join();
            let _ = flow_thread.join();
        })
        .await;
    }
}

/// Pauses or resumes `tps` through the flow thread of `threads` (in the order decided), or
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
        Some(t) => match t.flow.send(op) {
            Ok(()) => return,
            Err(std::sync::mpsc::SendError(op)) => op,
        },
        None => op,
    };
    poll_loop::apply_flow(name, consumer, op);
}

/// Sleeps until `deadline`, or for ever without one.
pub(super) async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
