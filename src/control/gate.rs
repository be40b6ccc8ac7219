//! How a connection's shell applies its triggers' target states to the partitions it owns,
//! as pure functions of the [partition set](crate::core::partitions::PartitionSet).
//!
//! A paused trigger starts no run: its trigger's permit is withheld
//! ([`KafkaShell::try_permit`](crate::run::spawn::KafkaShell)), so its partitions keep their
//! waiting records and their runs in flight finish. Its partitions are also paused in
//! librdkafka (still assigned: no rebalance), so nothing more is fetched for them; the core's
//! own flow decisions (a buffer that drained) never resume them while the trigger is paused,
//! and a resume resumes only those the core does not hold paused itself. A new assignment
//! of a paused trigger's partition is paused at once.

use crate::core::partitions::{PartitionSet, PauseReason};
use crate::core::shell::Shell;
use crate::dispatch::event::TopicPartition;

use super::status::PartitionStatus;

/// The target states a shell has applied, by trigger index.
#[derive(Debug, Default)]
pub struct TargetGate {
    applied: Vec<bool>,
}

/// What the shell does after the target states changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reconcile {
    /// Partitions to pause in the consumer.
    pub pause: Vec<TopicPartition>,
    /// Partitions to resume in the consumer.
    pub resume: Vec<TopicPartition>,
    /// Triggers (by index) resumed: their partitions may start runs again.
    pub wake: Vec<usize>,
}

impl TargetGate {
    /// Whether the trigger with `index` is paused, as applied.
    pub fn paused(&self, index: usize) -> bool {
        self.applied.get(index).copied().unwrap_or(false)
    }

    /// Applies `wanted` (by trigger index: paused or not) to `partitions`.
    pub fn reconcile<S: Shell>(
        &mut self,
        wanted: &[bool],
        partitions: &PartitionSet<S>,
    ) -> Reconcile {
        let mut out = Reconcile::default();
        for (index, &paused) in wanted.iter().enumerate() {
            if paused == self.paused(index) {
                continue;
            }
            let of_trigger = partitions.iter().filter(|p| p.trigger.index == index);
            if paused {
                out.pause.extend(of_trigger.map(|p| p.tp.clone()));
            } else {
                // Those the core holds paused (a full buffer, the gap bound) stay paused.
                out.resume.extend(
                    of_trigger
                        .filter(|p| p.paused.is_none())
                        .map(|p| p.tp.clone()),
                );
                out.wake.push(index);
            }
        }
        self.applied = wanted.to_vec();
        out
    }

    /// Takes out of a resume the core decided the partitions of paused triggers.
    pub fn keep_paused<S: Shell>(
        &self,
        partitions: &PartitionSet<S>,
        resume: &mut Vec<TopicPartition>,
    ) {
        resume.retain(|tp| {
            partitions
                .by_tp(tp)
                .is_none_or(|p| !self.paused(p.trigger.index))
        });
    }

    /// Of newly assigned `tps`, those of paused triggers (to pause at once).
    pub fn to_pause<S: Shell>(
        &self,
        partitions: &PartitionSet<S>,
        tps: &[TopicPartition],
    ) -> Vec<TopicPartition> {
        tps.iter()
            .filter(|tp| {
                partitions
                    .by_tp(tp)
                    .is_some_and(|p| self.paused(p.trigger.index))
            })
            .cloned()
            .collect()
    }
}

/// What the shell reports of each partition it owns: `name_of` names a partition's trigger,
/// `lag` gives a partition's lag (in records, in seconds) as last reported.
pub fn partition_statuses<S: Shell>(
    partitions: &PartitionSet<S>,
    gate: &TargetGate,
    name_of: impl Fn(&S::Trigger) -> String,
    lag: impl Fn(&TopicPartition) -> (Option<f64>, Option<f64>),
) -> Vec<PartitionStatus> {
    let mut out: Vec<PartitionStatus> = partitions
        .iter()
        .map(|p| {
            let operator = gate.paused(p.trigger.index);
            let paused_reason = if operator {
                Some("paused by an operator".to_owned())
            } else {
                p.paused.map(|why| {
                    match why {
                        PauseReason::Buffer => "buffer full",
                        PauseReason::Budget => "byte budget full",
                        PauseReason::Gap => "gap bound",
                        PauseReason::Metadata => "commit metadata budget",
                    }
                    .to_owned()
                })
            };
            let (records, seconds) = lag(&p.tp);
            PartitionStatus {
                topic: p.tp.topic.clone(),
                partition: p.tp.partition,
                trigger: name_of(&p.trigger.runtime),
                owner: String::new(),
                paused: operator || p.paused.is_some(),
                paused_reason,
                commit_offset: p.tracker.commit_offset().or(p.tracker.stored_offset()),
                handled_above: p.tracker.handled_above(),
                waiting: p.queue.waiting(),
                in_flight: p.queue.in_flight(),
                lag_records: records.map(|r| r as i64),
                lag_seconds: seconds,
                stalled: p.stalled.clone(),
            }
        })
        .collect();
    out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Ordering;
    use crate::core::partitions::{Limits, TriggerSlot};
    use crate::core::testing::{TestShell, TestTrigger};
    use crate::core::AssignedPartition;

    fn tp(topic: &str, p: i32) -> TopicPartition {
        TopicPartition {
            topic: topic.into(),
            partition: p,
        }
    }

    /// Topic "a" (trigger 0) partitions 0 and 1, topic "b" (trigger 1) partition 0.
    fn set() -> PartitionSet<TestShell> {
        let mut s = PartitionSet::new(Limits {
            per_partition: 10,
            max_bytes: 1 << 20,
            max_tracked_above: 100,
            metadata_max_chars: crate::core::offsets::DEFAULT_METADATA_MAX_CHARS,
        });
        for (topic, p, index) in [("a", 0, 0), ("a", 1, 0), ("b", 0, 1)] {
            let a = AssignedPartition {
                tp: tp(topic, p),
                committed: Some(4),
                metadata: String::new(),
                topic_id: None,
            };
            let slot = TriggerSlot {
                index,
                ordering: Ordering::Key,
                runtime: TestTrigger::new(1),
                batch: None,
            };
            s.assign(a, slot, std::time::Instant::now());
        }
        s
    }

    #[test]
    fn a_pause_pauses_the_triggers_partitions_and_a_resume_wakes_it() {
        let s = set();
        let mut gate = TargetGate::default();
        let r = gate.reconcile(&[true, false], &s);
        assert_eq!(r.pause, [tp("a", 0), tp("a", 1)]);
        assert!(r.resume.is_empty() && r.wake.is_empty());
        assert_eq!(
            gate.reconcile(&[true, false], &s),
            Reconcile::default(),
            "applied already"
        );
        // The core decided to resume a drained buffer of each trigger: trigger 0's stays paused.
        let mut resume = vec![tp("a", 1), tp("b", 0)];
        gate.keep_paused(&s, &mut resume);
        assert_eq!(resume, [tp("b", 0)]);
        assert_eq!(gate.to_pause(&s, &[tp("a", 0), tp("b", 0)]), [tp("a", 0)]);
        let r = gate.reconcile(&[false, false], &s);
        assert_eq!(r.resume, [tp("a", 0), tp("a", 1)]);
        assert_eq!(r.wake, [0]);
    }

    #[test]
    fn partitions_report_their_offsets_and_why_they_are_paused() {
        let s = set();
        let mut gate = TargetGate::default();
        let _ = gate.reconcile(&[false, true], &s);
        let report = partition_statuses(
            &s,
            &gate,
            |_| "t".to_owned(),
            |tp| (Some(f64::from(tp.partition) + 3.0), Some(0.5)),
        );
        assert_eq!(report.len(), 3);
        assert_eq!(report[0].commit_offset, Some(4));
        assert_eq!(report[1].lag_records, Some(4));
        assert!(!report[0].paused);
        assert_eq!(
            report[2].paused_reason.as_deref(),
            Some("paused by an operator")
        );
    }
}
