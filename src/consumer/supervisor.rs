//! The supervisor of one connection: the shell around the [consumer core](crate::core). It
//! feeds the core the consumer's events, the runs' ends and the commit task's answers, and
//! carries out the core's commands: runs started and signalled ([`crate::run`]), pauses,
//! resumes and seeks (the poll task, before its next poll), commit requests (the commit
//! task), a revoke's final commit and its acknowledgement. Every decision is the core's; this file only moves data.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{AssignedPartition, ConsumerEvent, EVENT_CHANNEL};
use crate::admin::health::{HealthRegistry, Heartbeat};
use crate::config::ConnectionConfig;
use crate::consumer::commit_task;
use crate::consumer::identity::IdentityWatch;
use crate::consumer::monitor::{CheckClock, LagSeconds, Monitor, MovedBack};
use crate::consumer::port::{KafkaPort, RdKafkaPort};
use crate::consumer::setup::{self, Triggers};
use crate::consumer::tasks::{self, FlowHandle, OpsTask, PollTask};
use crate::control::gate::TargetGate;
use crate::control::ConnectionControl;
use crate::core::committer::CommitResult;
use crate::core::{Command, Core, RevokeEnd};
use crate::dispatch::event::TopicPartition;
use crate::run::spawn::{KafkaShell, Runs, WorkerEvent};
use crate::telemetry::metrics;

pub use crate::consumer::setup::{SharedClients, SupervisorError};

/// Most worker events handled before the core is polled.
const COMPLETIONS_AT_ONCE: usize = 256;

/// How long a stop waits for the consumer to close, after its final commit. Closing revokes
/// what is left and leaves the group, which takes librdkafka a few seconds at most (it gives
/// a LeaveGroup 5 s). Twice, with librdkafka's mock cluster in a cooperative rebalance, it
/// had not ended 25 s after the final commit; with librdkafka's debug lines on, none came
/// after its LeaveGroup was sent (cause not found). The commits are made by then, so the stop does not wait longer:
/// the close goes on in the background and the group takes the partitions back at its
/// session timeout. With the default `drain_timeout_ms` (30 s) and the final commit's
/// retries (10 s) a stop stays within the chart's grace period (60 s).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs one connection, over its consumer's port (librdkafka's adapter unless a simulation
/// gives another).
pub struct ConnectionSupervisor<P: KafkaPort = RdKafkaPort> {
    name: String,
    config: ConnectionConfig,
    consumer: Arc<P>,
    events: mpsc::Receiver<ConsumerEvent>,
    events_tx: mpsc::Sender<ConsumerEvent>,
    triggers: Triggers,
    core: Core<KafkaShell>,
    /// Reused between polls of the core.
    commands: Vec<Command<KafkaShell>>,
    runs: Runs,
    completions: mpsc::UnboundedReceiver<WorkerEvent>,
    /// None before `run` and after shutdown began.
    ops_task: Option<OpsTask>,
    /// The poll task's pauses, resumes and seeks, while it runs.
    flow: Option<FlowHandle>,
    commit_answers: mpsc::UnboundedReceiver<Vec<CommitResult>>,
    commit_answers_tx: mpsc::UnboundedSender<Vec<CommitResult>>,
    /// librdkafka waits in its rebalance callback until this is sent.
    revoke_ack: Option<std::sync::mpsc::SyncSender<()>>,
    monitor: Monitor,
    /// Which log each partition is read from (topics created again, positions moved back).
    identity: IdentityWatch,
    /// Partitions to move (their topic was created again), for the poll task.
    seeks: Vec<crate::consumer::identity::Seek>,
    /// Beaten once per turn of the event loop (`/livez`).
    heartbeat: Heartbeat,
    lag: LagSeconds,
    /// Operators' controls: the triggers' target states (applied through `gate`) and the
    /// status this shell reports.
    control: Arc<ConnectionControl>,
    control_changes: tokio::sync::watch::Receiver<u64>,
    gate: TargetGate,
}

impl ConnectionSupervisor<RdKafkaPort> {
    /// Creates the consumer and the triggers' clients; opens no connection yet. `shared`
    /// holds the clients the connection shares with the produce API.
    pub fn try_new(
        name: &str,
        config: &ConnectionConfig,
        health: HealthRegistry,
        shared: &SharedClients,
    ) -> Result<Self, SupervisorError> {
        let triggers = Triggers::try_new(name, config, shared)?;
        let (events_tx, events) = mpsc::channel(EVENT_CHANNEL);
        let consumer = setup::consumer(name, config, events_tx.clone())?;
        let port =
            RdKafkaPort::new(consumer).map_err(|e| SupervisorError::Thread(name.to_owned(), e))?;
        Ok(Self::with_port(
            name, config, health, shared, triggers, port, events_tx, events,
        ))
    }
}

#[cfg(test)]
impl<P: KafkaPort> ConnectionSupervisor<P> {
    /// A supervisor over the port `port_of` makes, given where its rebalance callbacks' events
    /// go (a simulated librdkafka).
    pub(crate) fn over(
        name: &str,
        config: &ConnectionConfig,
        health: HealthRegistry,
        shared: &SharedClients,
        port_of: impl FnOnce(mpsc::Sender<ConsumerEvent>) -> P,
    ) -> Result<Self, SupervisorError> {
        let triggers = Triggers::try_new(name, config, shared)?;
        let (events_tx, events) = mpsc::channel(EVENT_CHANNEL);
        let port = port_of(events_tx.clone());
        Ok(Self::with_port(
            name, config, health, shared, triggers, port, events_tx, events,
        ))
    }
}

impl<P: KafkaPort> ConnectionSupervisor<P> {
    /// A supervisor over `port`, whose events (and its callbacks') arrive on `events`.
    #[allow(clippy::too_many_arguments)]
    fn with_port(
        name: &str,
        config: &ConnectionConfig,
        health: HealthRegistry,
        shared: &SharedClients,
        triggers: Triggers,
        port: P,
        events_tx: mpsc::Sender<ConsumerEvent>,
        events: mpsc::Receiver<ConsumerEvent>,
    ) -> Self {
        let (runs, completions) = Runs::new(name, config.group_id());
        let (commit_answers_tx, commit_answers) = mpsc::unbounded_channel();
        let monitor = Monitor::new(
            name,
            health.clone(),
            shared.registry.clone(),
            events_tx.clone(),
        );
        Self {
            name: name.to_owned(),
            config: config.clone(),
            consumer: Arc::new(port),
            events,
            events_tx,
            triggers,
            core: setup::core(config),
            commands: Vec::new(),
            runs,
            completions,
            ops_task: None,
            flow: None,
            commit_answers,
            commit_answers_tx,
            revoke_ack: None,
            heartbeat: health.heartbeat(name),
            monitor,
            identity: IdentityWatch::new(name, config),
            seeks: Vec::new(),
            lag: LagSeconds::default(),
            control: Arc::clone(&shared.control),
            control_changes: shared.control.subscribe(),
            gate: TargetGate::default(),
        }
    }

    /// Subscribes and runs until `shutdown` fires; then drains, commits and closes.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<(), SupervisorError> {
        setup::subscribe(&self.name, &self.config, &*self.consumer)?;
        let events = self.events_tx.clone();
        let mut poll_task = PollTask::spawn(&self.name, &self.consumer, events)?;
        self.flow = Some(poll_task.flow());
        let answers = self.commit_answers_tx.clone();
        self.ops_task = Some(OpsTask::spawn(&self.name, &self.consumer, answers));
        metrics::register_connection(
            &self.name,
            self.triggers.all.iter().map(|t| t.name.as_str()),
        );
        self.runs.register(&self.triggers.all);
        self.apply_target_states();
        // The health check also bounds how long the loop goes without a turn (1 s while busy,
        // 10 s when idle): the heartbeat says whether the loop is wedged (`/livez`).
        let mut check = CheckClock::new(crate::clock::now());
        let result = loop {
            self.heartbeat.beat();
            check.busy_if(self.core.partitions());
            let wake = self.core.next_wake(crate::clock::now());
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break Ok(()),
                // A task of the connection that ends while it runs (a panic in a poll round
                // or a callback, in a commit) restarts the connection: nothing else would
                // poll or commit for it.
                reason = poll_task.ended() => break Err(self.panicked("poll", reason)),
                reason = tasks::ops_ended(&mut self.ops_task) => {
                    break Err(self.panicked("ops", reason))
                }
                Some(e) = self.completions.recv() => {
                    self.on_worker_event(e);
                    // Whatever else finished meanwhile, before the core decides what starts.
                    for _ in 0..COMPLETIONS_AT_ONCE {
                        let Ok(e) = self.completions.try_recv() else { break };
                        self.on_worker_event(e);
                    }
                }
                _ = tasks::sleep_until_opt(Some(check.due())) => {
                    let (triggers, tasks) = (&self.triggers.all, &self.runs.tasks);
                    let partitions = self.core.partitions_mut();
                    self.monitor.check(&self.config, &self.consumer, partitions, triggers, tasks);
                    self.lag.report(&self.name, self.core.partitions());
                    check.checked(crate::clock::now(), self.core.partitions());
                    self.check_identity();
                    self.publish_status();
                }
                Some(ids) = self.identity.rx.recv() => {
                    let seeks = self.identity.on_answer(ids, &mut self.core);
                    self.seeks.extend(seeks);
                }
                Ok(()) = self.control_changes.changed() => self.apply_target_states(),
                _ = tasks::sleep_until_opt(wake) => {}
                Some(answer) = self.commit_answers.recv() => {
                    self.core.on_commit_answer(crate::clock::now(), &answer);
                }
                event = self.events.recv(), if !self.core.revoking() => match event {
                    Some(e) => self.on_event(e),
                    None => break Ok(()),
                },
            }
            if let Err(e) = self.execute().await {
                break Err(e);
            }
        };
        // Stopping is bounded by the drain deadline, not by the liveness bound.
        self.heartbeat.retire();
        self.shut_down(poll_task).await;
        result
    }

    fn on_event(&mut self, event: ConsumerEvent) {
        match event {
            ConsumerEvent::Messages(batch) => {
                let moved = crate::consumer::monitor::intake(
                    &self.name,
                    &mut self.core,
                    &mut self.lag,
                    batch,
                );
                if !moved.is_empty() {
                    for m in &moved {
                        self.identity.on_moved_back(m);
                    }
                    self.check_identity();
                }
            }
            ConsumerEvent::Positions(positions) => {
                let mut moved = false;
                for (tp, position) in positions {
                    if let Some(m) = self.core.on_position(&tp, position) {
                        self.moved_back(tp, &m);
                        moved = true;
                    }
                }
                if moved {
                    self.check_identity();
                }
            }
            ConsumerEvent::LogEnds(ends) => {
                let mut moved = false;
                for (tp, generation, end) in ends {
                    if let Some(m) = self.core.on_log_end(&tp, generation, end) {
                        // librdkafka would fetch from its position, past the end, and
                        // go on from there once records reach it.
                        self.seeks.push(crate::consumer::identity::Seek {
                            tp: tp.clone(),
                            to: rdkafka::Offset::Offset(m.offset),
                        });
                        self.moved_back(tp, &m);
                        moved = true;
                    }
                }
                if moved {
                    self.check_identity();
                }
            }
            ConsumerEvent::Assigned(assigned) => self.on_assigned(assigned),
            ConsumerEvent::Revoked {
                partitions,
                lost,
                ack,
            } => {
                metrics::rebalance(&self.name, if lost { "lost" } else { "revoke" });
                tracing::info!(connection = %self.name, partitions = partitions.len(), lost, "partitions revoked");
                self.revoke_ack = Some(ack);
                // Their moves were for this assignment; a later one starts from the commit.
                self.seeks.retain(|s| !partitions.contains(&s.tp));
                if let Some(f) = &self.flow {
                    f.forget(&partitions);
                }
                // A revoke's final commit must not land on a topic created again.
                self.take_identity_hint();
                self.core.on_revoked(crate::clock::now(), partitions, lost);
            }
            ConsumerEvent::Sought(tps) => {
                for tp in &tps {
                    self.core.on_sought(tp);
                }
            }
            ConsumerEvent::IdentityHint => {
                self.suspect_topics();
                self.check_identity();
            }
            ConsumerEvent::Error(e) => {
                self.consumer.note_error(&e);
                tracing::warn!(connection = %self.name, error = %e, "kafka consumer error");
            }
        }
    }

    /// The core started `tp`'s bookkeeping again where its position moved back to: said
    /// and counted (its log is identified at the next check).
    fn moved_back(&mut self, tp: TopicPartition, m: &crate::core::partitions::PositionMovedBack) {
        self.identity.on_moved_back(&MovedBack {
            tp,
            expected: m.expected,
            offset: m.offset,
        });
    }

    /// The error for a task of the connection that panicked or ended: counted and logged.
    fn panicked(&self, task: &'static str, reason: String) -> SupervisorError {
        metrics::connection_panic(&self.name);
        tracing::error!(connection = %self.name, task, error = %reason, "a task of the connection panicked; the connection drains, commits and starts again");
        SupervisorError::Panicked {
            connection: self.name.clone(),
            task,
            reason,
        }
    }

    /// Reads the assigned topics' ids when due (see [`IdentityWatch`]).
    fn check_identity(&mut self) {
        self.take_identity_hint();
        self.identity
            .tick(crate::clock::now(), &self.consumer, &self.core);
    }

    /// librdkafka said something that may mean a topic was deleted and created again: every
    /// partition runs and commits nothing until its topic's id is read again, at once.
    fn suspect_topics(&mut self) {
        self.core.suspect_topics();
        self.identity.want_now();
    }

    /// Takes librdkafka's hint, if it gave one since the poll task last looked, before the
    /// core decides a commit: a commit decided for a topic's old log and sent after it was
    /// created again would land on the new one (Kafka keeps offsets by topic name), and the
    /// next owner would start the new log there.
    fn take_identity_hint(&mut self) {
        if self.consumer.take_identity_check() {
            self.suspect_topics();
        }
    }

    fn on_assigned(&mut self, assigned: Vec<AssignedPartition>) {
        metrics::rebalance(&self.name, "assign");
        // librdkafka can keep a partition's pause flag across revoke and re-assign; a new
        // assignment starts unpaused, in librdkafka as in the core (behind any pause decided
        // before the revoke, through the poll task), unless an operator paused its trigger.
        let tps: Vec<TopicPartition> = assigned.iter().map(|a| a.tp.clone()).collect();
        self.pause_or_resume(false, tps.clone());
        let slots = self.triggers.slots(&self.name, &self.config, assigned);
        let stale = self.core.on_assigned(crate::clock::now(), slots);
        // Commits made under an older topic of the same name: read from auto.offset.reset.
        let seeks = self.identity.on_stale_commits(stale);
        self.seeks.extend(seeks);
        for tp in &tps {
            let Some(p) = self.core.partitions().by_tp(tp) else {
                continue;
            };
            if let Some(why) = p.tracker.metadata_refused() {
                tracing::warn!(connection = %self.name, topic = %tp.topic, partition = tp.partition,
                    committed = p.tracker.stored_offset(), reason = %why,
                    "commit metadata not read: records the previous owner handled above the \
                     committed offset run again");
            }
        }
        let held = self.gate.to_pause(self.core.partitions(), &tps);
        if !held.is_empty() {
            self.pause_or_resume(true, held);
        }
        self.report_partitions();
        self.publish_status();
    }

    fn on_worker_event(&mut self, event: WorkerEvent) {
        match event {
            WorkerEvent::Finished(mut f) => {
                let records = self.runs.finished(&f);
                let returned = std::mem::take(&mut f.returned);
                if !returned.is_empty() {
                    let _ = self
                        .core
                        .on_run_returned(f.id, f.generation, &f.key, returned);
                }
                let known = self
                    .core
                    .on_run_finished(f.id, f.generation, &f.key, &records);
                if known {
                    if let Some(p) = self.core.partitions().get(f.id) {
                        self.runs.report(&p.trigger.runtime, &f);
                    }
                }
            }
            WorkerEvent::Yielded(trigger) => self.core.on_yielded(trigger),
        }
    }

    /// Carries out what the core decided. Fails when the commit task is gone.
    async fn execute(&mut self) -> Result<(), SupervisorError> {
        for seek in std::mem::take(&mut self.seeks) {
            if let Some(f) = &self.flow {
                f.seek(seek.tp, seek.to);
            }
        }
        self.take_identity_hint();
        let mut commands = std::mem::take(&mut self.commands);
        self.core.poll(crate::clock::now(), &mut commands);
        let mut paused_or_resumed = false;
        for command in commands.drain(..) {
            match command {
                Command::Start(start) => self.runs.spawn(start),
                Command::Signal(signal) => self.runs.signal(signal),
                Command::Flow {
                    pause,
                    mut partitions,
                } => {
                    if !pause {
                        self.gate
                            .keep_paused(self.core.partitions(), &mut partitions);
                    }
                    if !partitions.is_empty() {
                        self.pause_or_resume(pause, partitions);
                    }
                    paused_or_resumed = true;
                }
                Command::Commit(batch) => {
                    if let Some(t) = &self.ops_task {
                        t.commit(&self.name, batch)?;
                    }
                }
                Command::FinishRevoke(end) => self.finish_revoke(end).await,
                Command::Hold(change) => crate::consumer::monitor::log_hold(&self.name, &change),
            }
        }
        self.commands = commands;
        if paused_or_resumed {
            self.report_partitions();
        }
        Ok(())
    }

    /// Commits a revoke's final state synchronously and releases librdkafka.
    async fn finish_revoke(&mut self, end: RevokeEnd) {
        if !end.withheld.is_empty() {
            tracing::warn!(connection = %self.name, partitions = ?end.withheld, "revoked before their topics' ids were read again (a topic may have been created again): no final commit for them; the next owner runs again what they accepted since their last commit");
        }
        if end.abandoned > 0 {
            tracing::warn!(connection = %self.name, in_flight = end.abandoned, "drain deadline passed on revoke; unfinished runs will be dispatched again by the next owner");
        }
        // The answer can wait behind the group's rebalance, which Kafka bounds, not the
        // liveness bound: the loop is waiting, not wedged.
        let commit = commit_task::commit_sync(&self.name, &self.consumer, end.commit);
        self.heartbeat.beating_while(commit).await;
        self.lag
            .forget(&self.name, self.core.partitions(), &end.partitions);
        self.report_partitions();
        self.publish_status();
        if let Some(ack) = self.revoke_ack.take() {
            let _ = ack.send(());
        }
        tracing::info!(connection = %self.name, partitions = end.partitions.len(), "revoke finished: partitions released");
    }

    fn pause_or_resume(&self, pause: bool, tps: Vec<TopicPartition>) {
        let flow = self.flow.as_ref();
        tasks::pause_or_resume(flow, &self.name, &*self.consumer, pause, tps);
    }

    fn report_partitions(&self) {
        let p = self.core.partitions();
        metrics::partitions(&self.name, p.len(), p.paused_count());
    }

    /// Applies the triggers' target states: an operator paused or resumed one.
    fn apply_target_states(&mut self) {
        let wanted: Vec<bool> = self
            .triggers
            .all
            .iter()
            .map(|t| t.control.paused())
            .collect();
        let r = self.gate.reconcile(&wanted, self.core.partitions());
        if !r.pause.is_empty() {
            self.pause_or_resume(true, r.pause);
        }
        if !r.resume.is_empty() {
            self.pause_or_resume(false, r.resume);
        }
        for index in r.wake {
            self.core.on_yielded(index);
        }
        self.publish_status();
    }

    /// Reports the owned partitions to the operators' status.
    fn publish_status(&self) {
        let name = &self.name;
        let report = crate::control::gate::partition_statuses(
            self.core.partitions(),
            &self.gate,
            |t| t.name.clone(),
            |tp| metrics::partition_lag(name, &tp.topic, tp.partition),
        );
        self.control.publish(Some(report));
    }

    async fn shut_down(mut self, poll_task: PollTask) {
        // The commit task finishes its request and ends, so the final synchronous commit
        // below is the last one the broker sees; its answers reach the core (a revoke ends
        // only once the request out was answered).
        if let Some(t) = self.ops_task.take() {
            t.join().await;
        }
        while let Ok(answer) = self.commit_answers.try_recv() {
            self.core.on_commit_answer(crate::clock::now(), &answer);
        }
        tracing::info!(connection = %self.name, "stopping: draining runs in flight");
        self.core.on_stop(crate::clock::now());
        let _ = self.execute().await;
        self.drain().await;
        self.runs.abandon_all();
        self.take_identity_hint();
        // The consumer is still a member (librdkafka's threads run the group protocol): a
        // commit refused while the group rebalances is tried again once the rebalance ends.
        let commits = self.core.stop_commit();
        let retry = Some(commit_task::FINAL_COMMIT_RETRY);
        commit_task::commit_sync_retrying(&self.name, &self.consumer, commits, retry).await;
        // A revoke still draining at the deadline was part of the commit above: release
        // the poll task's revoke callback at once instead of letting it wait for its own.
        if let Some(ack) = self.revoke_ack.take() {
            let _ = ack.send(());
        }
        self.consumer.set_closing();
        self.control.publish(None);
        self.runs.tasks.close();
        // The poll task holds the last reference: closing (callbacks) runs off the runtime.
        drop(self.consumer);
        drop(self.events);
        if tokio::time::timeout(CLOSE_TIMEOUT, poll_task.join())
            .await
            .is_err()
        {
            tracing::error!(connection = %self.name, timeout_s = CLOSE_TIMEOUT.as_secs(), "the consumer did not close in time (the group's coordinator did not answer its leaving): left to close in the background; the group takes its partitions back at its session timeout");
            return;
        }
        tracing::info!(connection = %self.name, "consumer closed");
    }

    /// Waits, up to the drain deadline, for the runs in flight, polling the core after each
    /// end: a revoke, begun before the stop or during it, finishes (final commit of its
    /// partitions, librdkafka released) as soon as its own partitions drained. Holding the
    /// rebalance callback for the whole drain would stall the group's rebalance for every
    /// member meanwhile, and the broker may expel this member (a commit refused while the
    /// group waits for it to rejoin, the session timing out). The consumer's events are
    /// read meanwhile, so that its poll task is never blocked handing one over: a revoke
    /// is taken; records, positions and assignments are not (nothing starts any more).
    async fn drain(&mut self) {
        let deadline = crate::clock::now() + Duration::from_millis(self.config.drain_timeout_ms);
        let mut events_open = true;
        loop {
            let in_flight = self.core.partitions().in_flight();
            if in_flight == 0 && !self.core.revoking() {
                return;
            }
            let now = crate::clock::now();
            if now >= deadline {
                if in_flight > 0 {
                    tracing::warn!(connection = %self.name, in_flight, "drain deadline passed; unfinished runs will be dispatched again");
                }
                return;
            }
            let wake = self
                .core
                .next_wake(now)
                .map_or(deadline, |w| w.min(deadline));
            tokio::select! {
                biased;
                Some(e) = self.completions.recv() => self.on_worker_event(e),
                event = self.events.recv(), if events_open && !self.core.revoking() => {
                    match event {
                        Some(e) => self.on_event_stopping(e),
                        None => events_open = false,
                    }
                }
                _ = tasks::sleep_until_opt(Some(wake)) => {}
            }
            let _ = self.execute().await;
        }
    }

    /// A consumer event while the connection stops: revokes (and what says a topic may
    /// have changed, errors) are handled as always; records, positions and assignments are
    /// dropped, as nothing starts any more and the final commit covers only what ran.
    fn on_event_stopping(&mut self, event: ConsumerEvent) {
        match event {
            ConsumerEvent::Messages(_)
            | ConsumerEvent::Positions(_)
            | ConsumerEvent::LogEnds(_)
            | ConsumerEvent::Sought(_)
            | ConsumerEvent::Assigned(_) => {}
            e @ (ConsumerEvent::Revoked { .. }
            | ConsumerEvent::IdentityHint
            | ConsumerEvent::Error(_)) => self.on_event(e),
        }
    }
}
