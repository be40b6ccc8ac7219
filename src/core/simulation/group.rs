//! The simulated group coordinator: who owns each partition, in which generation (or, under
//! KIP-848, each member's epoch), which commits it applies and how it refuses the others,
//! kills, restarts and session expiry, under each [`Protocol`].

use super::schedule::Protocol;
use super::{Request, Sim};
use crate::core::committer::CommitResult;
use crate::core::partitions::TriggerSlot;
use crate::core::shell::Record as _;
use crate::core::types::TopicPartition;
use crate::core::AssignedPartition;

impl Sim {
    /// The coordinator gives `part` to member `m` in a new generation (under KIP-848, a new
    /// epoch of `m` alone).
    pub(super) fn assign(&mut self, part: i32, m: usize) {
        self.generation += 1;
        self.owner[part as usize] = Some(m);
        let now = self.now();
        // Under the classic protocol every live member rejoins into the new generation (an
        // empty assignment for the others); under KIP-848 the others are not involved.
        if !matches!(self.p.protocol, Protocol::Consumer { .. }) {
            for (i, member) in self.members.iter_mut().enumerate() {
                if member.alive && i != m {
                    member.generation = self.generation;
                    member.core.on_assigned(now, Vec::new());
                }
            }
        }
        self.members[m].generation = self.generation;
        self.give(part, m);
    }

    /// Member `m`'s core gets `part` with the group's commit and metadata, at `m`'s current
    /// generation (a static member's restart gets its partitions back this way, with no
    /// rebalance).
    fn give(&mut self, part: i32, m: usize) {
        let (offset, mut metadata) = self.committed[part as usize].clone();
        if self.p.metadata_faults && self.faults && !metadata.is_empty() && self.metadata.chance(30)
        {
            // What the map named may run again unless the owner can still read it.
            let named = crate::core::offsets::parse_metadata(offset, &metadata)
                .iter()
                .filter(|o| self.accepted.contains(&(part, *o)))
                .count();
            let (text, kind, keeps) =
                super::metadata::disguise(&mut self.metadata, offset, &metadata);
            if !keeps {
                self.repeat_bound += named as u64;
            }
            self.saw(kind);
            metadata = text;
        }
        let committed = (offset >= 0).then_some(offset);
        let now = self.now();
        let member = &mut self.members[m];
        let _ = member.assigned_at.insert(part, member.generation);
        let slot = TriggerSlot {
            index: 0,
            ordering: self.p.ordering,
            runtime: member.trigger.clone(),
            batch: self.p.batch,
        };
        let assigned = AssignedPartition {
            tp: Self::tp(part),
            committed,
            metadata,
            topic_id: Some(super::world::topic_id(
                self.world.incarnation[part as usize],
            )),
        };
        let stale = member.core.on_assigned(now, vec![(assigned, slot)]);
        // The consumer starts at the commit, or the beginning.
        let _ = member.fetch.insert(part, (committed.unwrap_or(0), false));
        // librdkafka reports no position until it fetched.
        member.core.on_position(&Self::tp(part), None);
        if !stale.is_empty() {
            // The commit names an older topic's id: the shell moves the consumer to where
            // auto.offset.reset says (the beginning), and what was accepted below the commit
            // runs again; the commit follows the log from there.
            self.saw("metadata: a commit of an older topic, read anew");
            let again = self
                .accepted
                .iter()
                .filter(|(p, o)| *p == part && *o < offset)
                .count();
            self.repeat_bound += again as u64;
            self.world.lower_commit_ok[part as usize] = true;
            let member = &mut self.members[m];
            let _ = member.fetch.insert(part, (0, false));
            member.core.on_sought(&Self::tp(part));
            member.core.on_position(&Self::tp(part), None);
        }
    }

    /// Member `m` released `partitions` (its revoke finished): under KIP-848 it moves to a
    /// new epoch once its heartbeat no longer reports them.
    pub(super) fn released(&mut self, m: usize, partitions: &[TopicPartition]) {
        for tp in partitions {
            let _ = self.members[m].assigned_at.remove(&tp.partition);
        }
        if matches!(self.p.protocol, Protocol::Consumer { .. }) {
            self.generation += 1;
            self.members[m].generation = self.generation;
        }
    }

    /// Counts an event of the coordinator's, for the test that each protocol's are reached.
    pub(super) fn saw(&mut self, event: &'static str) {
        *self.seen.entry(event).or_default() += 1;
    }

    /// Whether the group still counts member `m` in: alive, or a static member whose
    /// session has not expired.
    fn known(&self, m: usize) -> bool {
        let member = &self.members[m];
        member.alive || member.expires.is_some()
    }

    /// Whether a commit member `m` sends now (a revoke's or a stop's last) is applied: the
    /// revoke or the stop holds the rebalance, so the member's generation is still current.
    pub(super) fn final_commit_applies(&self, m: usize) -> bool {
        match self.p.protocol {
            Protocol::Consumer { .. } => self.known(m),
            _ => self.known(m) && self.generation == self.members[m].generation,
        }
    }

    pub(super) fn stop_faults(&mut self) {
        self.faults = false;
        self.parked.clear();
        self.rejected.clear();
        // Dead static members' sessions end; every partition gets a live owner.
        for m in 0..self.members.len() {
            if self.members[m].expires.take().is_some() {
                self.reassign_from(m);
            }
        }
        for part in 0..self.p.partitions {
            let owner_alive = self.owner[part as usize].is_some_and(|m| self.members[m].alive);
            if !owner_alive {
                let m = self.live_member();
                self.assign(part, m);
            }
        }
    }

    pub(super) fn live_member(&mut self) -> usize {
        if let Some(m) = (0..self.members.len()).find(|m| self.members[*m].alive) {
            return m;
        }
        let incarnation = self.members[0].incarnation + 1;
        self.members[0] = Self::member(&self.p, self.generation);
        self.members[0].incarnation = incarnation;
        0
    }

    /// Why the coordinator refuses request `r`'s commit of `part`, if it does.
    fn refusal(&mut self, r: &Request, part: i32) -> Option<&'static str> {
        let member = &self.members[r.member];
        let fenced = r.incarnation != member.incarnation;
        match self.p.protocol {
            Protocol::Classic | Protocol::Static { .. } => {
                // The classic protocol checks the member and its generation, not who owns
                // the partition; while a rebalance is under way (a member revoking) it may
                // refuse commits of the current generation too.
                let rebalancing = self.members.iter().any(|m| m.alive && m.core.revoking());
                if !self.known(r.member) {
                    Some("UNKNOWN_MEMBER_ID")
                } else if r.generation != self.generation {
                    Some("ILLEGAL_GENERATION")
                } else if rebalancing && self.rng.chance(30) {
                    Some("REBALANCE_IN_PROGRESS")
                } else if fenced {
                    // A restarted member: a new member id, or, static, the same instance id
                    // now mapped to the new incarnation's member id.
                    Some(match self.p.protocol {
                        Protocol::Static { .. } => "FENCED_INSTANCE_ID",
                        _ => "UNKNOWN_MEMBER_ID",
                    })
                } else {
                    None
                }
            }
            Protocol::Consumer { relaxed } => {
                if !member.alive || fenced {
                    Some("UNKNOWN_MEMBER_ID")
                } else if !relaxed {
                    (r.generation != member.generation).then_some("STALE_MEMBER_EPOCH")
                } else {
                    let ok = self.owner[part as usize] == Some(r.member)
                        && member
                            .assigned_at
                            .get(&part)
                            .is_some_and(|at| *at <= r.generation)
                        && r.generation <= member.generation;
                    (!ok).then_some("STALE_MEMBER_EPOCH")
                }
            }
        }
    }

    /// The coordinator applies one due request and answers it: a member's requests in the
    /// order it sent them (one connection), different members' (or incarnations') in any
    /// order.
    pub(super) fn deliver_request(&mut self) {
        let heads: Vec<usize> = (0..self.requests.len())
            .filter(|&i| {
                let r = &self.requests[i];
                r.due <= self.step
                    && !self
                        .requests
                        .iter()
                        .take(i)
                        .any(|e| e.member == r.member && e.incarnation == r.incarnation)
            })
            .collect();
        let chosen = match heads.len() {
            0 => return,
            1 => heads[0],
            n => heads[self.coordinator.below(n as u64) as usize],
        };
        if chosen > 0 {
            self.saw("coordinator: a request applied before another member's earlier one");
        }
        self.deliver(chosen);
    }

    /// Delivers member `m`'s requests still on the way, in order (an orderly stop waits for
    /// them).
    pub(super) fn deliver_all_of(&mut self, m: usize) {
        let incarnation = self.members[m].incarnation;
        while let Some(i) = self
            .requests
            .iter()
            .position(|r| r.member == m && r.incarnation == incarnation)
        {
            self.deliver(i);
        }
    }

    /// The coordinator applies the request at `index` of the queue, and answers it.
    fn deliver(&mut self, index: usize) {
        let Some(mut r) = self.requests.remove(index) else {
            return;
        };
        let mut valid = true;
        let mut results = Vec::new();
        // Checked per partition only where the rule is (KIP-1251): otherwise once per
        // request, which keeps the classic schedules' draws as they were.
        let per_partition = self.p.protocol == Protocol::Consumer { relaxed: true };
        let mut request_refusal = None;
        for (i, (tp, offset, metadata)) in std::mem::take(&mut r.commits).into_iter().enumerate() {
            let refused = if per_partition {
                self.refusal(&r, tp.partition)
            } else {
                if i == 0 {
                    request_refusal = self.refusal(&r, tp.partition);
                }
                request_refusal
            };
            // The partition's own refusal: its topic is gone (created again since the
            // request was taken), or now and then while faults last (a missing permission,
            // metadata over the broker's limit). The request's other partitions are stored.
            let own = refused.is_none() && self.partition_refusal(tp.partition, r.incarnations[i]);
            let refused = if own {
                Some("UNKNOWN_TOPIC_OR_PARTITION")
            } else {
                refused
            };
            valid &= refused.is_none();
            match refused {
                Some(reason) => self.saw(reason),
                None => {
                    if !self.members[r.member].alive {
                        self.saw("commit of a dead static member applied");
                    }
                    self.apply_commit(r.member, &tp, offset, &metadata);
                }
            }
            results.push(CommitResult {
                tp,
                offset,
                metadata,
                refused: refused.map(str::to_owned),
                partition_only: own,
            });
        }
        let now = self.now();
        let member = &mut self.members[r.member];
        if member.alive && member.incarnation == r.incarnation {
            member.core.on_commit_answer(now, &results);
            // Every commit taken so far is confirmed: what was accepted before this request
            // was taken is covered.
            if valid && r.covers_all && member.core.commits_settled() {
                member.covered = member.covered.max(r.accepted_at_take);
            }
        }
    }

    pub(super) fn apply_commit(
        &mut self,
        m: usize,
        tp: &TopicPartition,
        offset: i64,
        metadata: &str,
    ) {
        let part = tp.partition as usize;
        let current = self.owner[part] == Some(m);
        let before = self.committed[part].0;
        // After its position moved back, the owner's commits follow it: the log moved back
        // (a truncation, a reset); what is checked then is that nothing is lost.
        if self.world.lower_commit_ok[part] {
            self.committed[part] = (offset, metadata.to_owned());
            return;
        }
        if current && offset < before {
            // Checked in `check` through this marker.
            self.committed[part] = (i64::MIN, format!("moved back from {before} to {offset}"));
            return;
        }
        self.committed[part] = (offset, metadata.to_owned());
    }

    /// Member `m` dies: its runs in flight are lost (a dispatcher may still have accepted
    /// them), its requests on the way may still arrive, its partitions go to others (a
    /// static member's only once its session expires).
    pub(super) fn kill(&mut self, m: usize) {
        if !self.members[m].alive {
            return;
        }
        self.members[m].alive = false;
        // What this kill may make the group offer again: the runs in flight, and the runs
        // accepted since the last confirmed commit that covered them.
        let member = &self.members[m];
        let in_flight: usize = member.runs.iter().map(|r| r.records.len()).sum();
        self.repeat_bound += in_flight as u64 + (member.accepted - member.covered);
        for run in std::mem::take(&mut self.members[m].runs) {
            let part = run.start.msg.partition();
            for ((offset, key), incarnation) in run.records.into_iter().zip(run.incarnations) {
                if self.rng.chance(50) && !self.held(key) {
                    self.dispatch(part, run.start.topic_id.clone(), offset, incarnation);
                }
            }
        }
        if let Protocol::Static { session_steps } = self.p.protocol {
            self.members[m].expires = Some(self.step + session_steps);
            return;
        }
        self.reassign_from(m);
    }

    /// Member `m`'s partitions go to a live member, if there is one.
    fn reassign_from(&mut self, m: usize) {
        let orphans: Vec<i32> = (0..self.p.partitions)
            .filter(|p| self.owner[*p as usize] == Some(m))
            .collect();
        for part in orphans {
            self.owner[part as usize] = None;
            if let Some(to) = (0..self.members.len()).find(|x| self.members[*x].alive) {
                self.assign(part, to);
            }
        }
    }

    /// Static members whose session expired leave the group; their partitions move.
    pub(super) fn expire_sessions(&mut self) {
        for m in 0..self.members.len() {
            if self.members[m].expires.is_some_and(|at| at <= self.step) {
                self.members[m].expires = None;
                self.reassign_from(m);
            }
        }
    }

    /// Member `m` starts again, as a new incarnation: a dynamic member joins (and takes the
    /// partitions nobody owns); a static one within its session takes its own back in the
    /// same generation.
    pub(super) fn restart(&mut self, m: usize) {
        if self.members[m].alive {
            return;
        }
        let incarnation = self.members[m].incarnation + 1;
        let within_session = self.members[m].expires.is_some();
        self.members[m] = Self::member(&self.p, self.generation);
        self.members[m].incarnation = incarnation;
        if within_session {
            self.saw("static member back within its session");
            for part in 0..self.p.partitions {
                if self.owner[part as usize] == Some(m) {
                    self.give(part, m);
                }
            }
        }
        for part in 0..self.p.partitions {
            if self.owner[part as usize].is_none() {
                self.assign(part, m);
            }
        }
    }
}
