//! A connection's own tasks, which hold no thread while they wait: the poll task
//! (librdkafka's events, polled on the blocking pool; it also pauses, resumes and seeks
//! between two polls, in the order decided) and the commit task (one commit request at a
//! time, on the blocking pool).

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::consumer::commit_task::{self, CommitBatch};
use crate::consumer::poll_loop::{self, FlowCmd, FlowOp, FlowQueue};
use crate::consumer::port::KafkaPort;
use crate::consumer::queue_wake::Waker;
use crate::consumer::setup::SupervisorError;
use crate::core::committer::CommitResult;
use crate::dispatch::event::TopicPartition;

/// The poll task of a connection, while it runs.
pub(super) struct PollTask {
    stop: Arc<AtomicBool>,
    waker: Waker,
    flow: FlowQueue,
    /// None once it ended.
    handle: Option<JoinHandle<Option<String>>>,
}

/// Waits for a task of the connection that must not end while it runs; yields why it
/// ended (the panic's message). Pending for ever once it ended.
async fn ended(handle: &mut Option<JoinHandle<Option<String>>>) -> String {
    let Some(h) = handle.as_mut() else {
        return std::future::pending().await;
    };
    let result = h.await;
    *handle = None;
    match result {
        Ok(Some(reason)) => reason,
        Ok(None) => "it ended".to_owned(),
        Err(e) if e.is_panic() => super::setup::panic_message(&*e.into_panic()),
        Err(e) => e.to_string(),
    }
}

impl PollTask {
    /// Starts polling `consumer` of connection `name`; its events go to `events`.
    pub(super) fn spawn<P: KafkaPort>(
        name: &str,
        consumer: &Arc<P>,
        events: mpsc::Sender<crate::consumer::ConsumerEvent>,
    ) -> Result<Self, SupervisorError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flow = FlowQueue::default();
        let (handle, waker) = poll_loop::spawn_poll_loop(
            name,
            Arc::clone(consumer),
            events,
            Arc::clone(&stop),
            flow.clone(),
        )
        .map_err(|e| SupervisorError::Thread(name.to_owned(), e))?;
        Ok(Self {
            stop,
            waker,
            flow,
            handle: Some(handle),
        })
    }

    /// Where pauses, resumes and seeks go for the task to carry out before its next poll.
    pub(super) fn flow(&self) -> FlowHandle {
        FlowHandle {
            queue: self.flow.clone(),
            waker: self.waker.clone(),
        }
    }

    /// Resolves when the task ended before it was told to (a round panicked), with why.
    pub(super) async fn ended(&mut self) -> String {
        ended(&mut self.handle).await
    }

    /// Stops polling and waits for the task, which closes the consumer if it holds the
    /// last reference.
    pub(super) async fn join(self) {
        self.stop.store(true, AtomicOrdering::SeqCst);
        self.waker.wake();
        if let Some(h) = self.handle {
            let _ = h.await;
        }
    }
}

/// Hands pauses, resumes and seeks to the poll task and wakes it.
pub(super) struct FlowHandle {
    queue: FlowQueue,
    waker: Waker,
}

impl FlowHandle {
    fn send(&self, cmd: FlowCmd) {
        self.queue.push(cmd);
        self.waker.wake();
    }

    /// Moves `tp`'s position to `to` (after the pauses and resumes decided before).
    pub(super) fn seek(&self, tp: TopicPartition, to: rdkafka::Offset) {
        self.send(FlowCmd::Seek(tp, to));
    }

    /// Drops the seeks of `revoked` partitions not made yet (see [`FlowQueue::forget`]).
    pub(super) fn forget(&self, revoked: &[TopicPartition]) {
        self.queue.forget(revoked);
    }
}

/// The commit task of a connection, while it runs.
pub(super) struct OpsTask {
    ops: mpsc::UnboundedSender<CommitBatch>,
    /// None once it ended.
    ops_task: Option<JoinHandle<Option<String>>>,
}

impl OpsTask {
    /// Starts the ops task of connection `name`; commit answers arrive on `answers`.
    pub(super) fn spawn<P: KafkaPort>(
        name: &str,
        consumer: &Arc<P>,
        answers: mpsc::UnboundedSender<Vec<CommitResult>>,
    ) -> Self {
        let (ops, ops_task) = commit_task::spawn(name, Arc::clone(consumer), answers);
        Self {
            ops,
            ops_task: Some(ops_task),
        }
    }

    /// Resolves when the ops task ended while the connection runs (a commit panicked), with
    /// why.
    pub(super) async fn ended(&mut self) -> String {
        ended(&mut self.ops_task).await
    }

    /// Hands a commit request to the commit task; fails when the task has ended.
    pub(super) fn commit(&self, name: &str, batch: CommitBatch) -> Result<(), SupervisorError> {
        self.ops.send(batch).map_err(|_| {
            let e = std::io::Error::other("the commit task ended");
            SupervisorError::Thread(name.to_owned(), e)
        })
    }

    /// Lets the task finish what it was given and waits for it: its commit request is
    /// answered before anything commits after it.
    pub(super) async fn join(self) {
        drop(self.ops);
        if let Some(t) = self.ops_task {
            let _ = t.await;
        }
    }
}

/// [`OpsTask::ended`] of the ops task while it runs; pending for ever otherwise.
pub(super) async fn ops_ended(ops_task: &mut Option<OpsTask>) -> String {
    match ops_task {
        Some(t) => t.ended().await,
        None => std::future::pending().await,
    }
}

/// Pauses or resumes `tps` through the poll task (`flow`: before its next poll, in the order
/// decided), or on this thread while it does not run (before the connection runs).
pub(super) fn pause_or_resume<P: KafkaPort>(
    flow: Option<&FlowHandle>,
    name: &str,
    consumer: &P,
    pause: bool,
    partitions: Vec<TopicPartition>,
) {
    let op = FlowOp { pause, partitions };
    match flow {
        Some(f) => f.send(FlowCmd::Flow(op)),
        None => poll_loop::apply_flow(name, consumer, op),
    }
}

/// Sleeps until `deadline`, or for ever without one.
pub(super) async fn sleep_until_opt(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}
