//! The status model of a region, as `GET /api/v1/status` serves it and the console and
//! `ctl status` show it: connections → triggers → partitions, with the parked keys. Each
//! replica reports what it owns; the replica asked merges its peers' reports ([`merge`],
//! pure).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::recent::LagPoint;
use super::trigger::{ParkedKey, RunState, TargetState};

/// The region as one replica sees it (with its peers' reports merged, unless asked for its
/// own only).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RegionStatus {
    /// `region.name`.
    pub region: String,
    /// The replica that answered.
    pub replica: String,
    /// When, in milliseconds since the epoch.
    pub generated_at_ms: i64,
    /// The replicas whose reports are in it, and those that could not be asked.
    pub replicas: Vec<ReplicaStatus>,
    /// The connections the caller may see.
    pub connections: Vec<ConnectionStatus>,
}

/// One replica of the region, as the status found it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReplicaStatus {
    /// Its `region.replica_id` (its URL while it did not answer).
    pub id: String,
    /// Its admin URL, for a peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Whether its report is in.
    pub reachable: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One connection.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ConnectionStatus {
    /// Its name.
    pub name: String,
    /// The replicas running its consumer.
    pub running_on: Vec<String>,
    /// A broker is reachable (every replica running it says so); None when none runs it.
    #[serde(default)]
    pub brokers_up: Option<bool>,
    /// Its Schema Registry answers (true without one); None when no replica runs it.
    #[serde(default)]
    pub registry_reachable: Option<bool>,
    /// The last error a replica reports for it: it could not start, authenticate, or lacks
    /// permissions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Its triggers the caller may see.
    pub triggers: Vec<TriggerStatus>,
}

/// One trigger.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TriggerStatus {
    /// Its name.
    pub name: String,
    /// The workflow its runs start.
    pub workflow: String,
    /// Its topics (patterns as configured).
    pub topics: Vec<String>,
    /// Running or paused.
    pub state: RunState,
    /// Who set the state, why and when.
    pub target: TargetState,
    /// `block`, `skip` or `dead_letter`.
    pub on_error: String,
    /// Its dead-letter topic (also where a skip writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_topic: Option<String>,
    /// Why it does not dispatch, while a configuration error (401/403) stops it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// Records whose run is in flight (parked ones included).
    pub runs_in_flight: usize,
    /// Records received and waiting to start.
    pub waiting: usize,
    /// Records not yet handled, by the brokers' end offsets, its partitions summed.
    pub lag_records: i64,
    /// Age of its oldest record received and not yet handled, in seconds.
    pub lag_seconds: f64,
    /// Records handled in the last five minutes, by outcome.
    pub last_5m: BTreeMap<String, u64>,
    /// Its lag over the last ten minutes, a point per 10 s.
    pub lag_history: Vec<LagPoint>,
    /// Its assigned partitions.
    pub partitions: Vec<PartitionStatus>,
    /// Its parked keys, oldest first.
    pub parked: Vec<ParkedKey>,
}

/// One assigned partition, as its owner reports it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PartitionStatus {
    /// Its topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The trigger that consumes it.
    pub trigger: String,
    /// The replica it is assigned to.
    #[serde(default)]
    pub owner: String,
    /// Not fetched now.
    pub paused: bool,
    /// Why: `paused by an operator`, `buffer full`, `gap bound`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_reason: Option<String>,
    /// The offset the group commits (or has committed): the first not handled.
    #[serde(default)]
    pub commit_offset: Option<i64>,
    /// Offsets handled above it (they travel in the commit metadata).
    pub handled_above: usize,
    /// Records received and waiting to start.
    pub waiting: usize,
    /// Records whose run is in flight.
    pub in_flight: usize,
    /// Records not yet handled, by the broker's end offset.
    #[serde(default)]
    pub lag_records: Option<i64>,
    /// Age of its oldest record received and not yet handled, in seconds.
    #[serde(default)]
    pub lag_seconds: Option<f64>,
    /// Why it is stalled, while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled: Option<String>,
}

/// Adds a peer's report (`other`) to `into`: its connections' and triggers' partitions and
/// parked keys join, counters add up, ages take the largest, reachability holds only if every
/// replica running a connection says so, and of two target states the later one is shown.
pub fn merge(into: &mut RegionStatus, other: RegionStatus) {
    for conn in other.connections {
        match into.connections.iter_mut().find(|c| c.name == conn.name) {
            Some(mine) => merge_connection(mine, conn),
            None => into.connections.push(conn),
        }
    }
    into.connections.sort_by(|a, b| a.name.cmp(&b.name));
}

fn merge_connection(into: &mut ConnectionStatus, other: ConnectionStatus) {
    into.running_on.extend(other.running_on);
    into.running_on.sort();
    into.running_on.dedup();
    into.brokers_up = both(into.brokers_up, other.brokers_up);
    into.registry_reachable = both(into.registry_reachable, other.registry_reachable);
    if into.last_error.is_none() {
        into.last_error = other.last_error;
    }
    for t in other.triggers {
        match into.triggers.iter_mut().find(|x| x.name == t.name) {
            Some(mine) => merge_trigger(mine, t),
            None => into.triggers.push(t),
        }
    }
    into.triggers.sort_by(|a, b| a.name.cmp(&b.name));
}

fn both(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a && b),
        (a, None) => a,
        (None, b) => b,
    }
}

fn merge_trigger(into: &mut TriggerStatus, other: TriggerStatus) {
    if other.target.at_ms > into.target.at_ms {
        into.state = other.state;
        into.target = other.target;
    }
    if into.stopped.is_none() {
        into.stopped = other.stopped;
    }
    into.runs_in_flight += other.runs_in_flight;
    into.waiting += other.waiting;
    into.lag_records += other.lag_records;
    into.lag_seconds = into.lag_seconds.max(other.lag_seconds);
    for (outcome, n) in other.last_5m {
        *into.last_5m.entry(outcome).or_default() += n;
    }
    let mut points: BTreeMap<i64, LagPoint> =
        into.lag_history.drain(..).map(|p| (p.at_ms, p)).collect();
    for p in other.lag_history {
        points
            .entry(p.at_ms)
            .and_modify(|q| {
                q.records += p.records;
                q.seconds = q.seconds.max(p.seconds);
            })
            .or_insert(p);
    }
    into.lag_history = points.into_values().collect();
    into.partitions.extend(other.partitions);
    into.partitions
        .sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    into.parked.extend(other.parked);
    into.parked.sort_by_key(|k| k.since_ms);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trigger(owner: &str, partition: i32, lag: i64, at_ms: i64) -> TriggerStatus {
        TriggerStatus {
            name: "t".into(),
            runs_in_flight: 1,
            lag_records: lag,
            lag_seconds: lag as f64,
            target: TargetState {
                at_ms,
                ..TargetState::default()
            },
            last_5m: [("accepted".to_owned(), 2)].into(),
            lag_history: vec![LagPoint {
                at_ms: 10_000,
                records: lag,
                seconds: 1.0,
            }],
            partitions: vec![PartitionStatus {
                topic: "x".into(),
                partition,
                owner: owner.into(),
                ..PartitionStatus::default()
            }],
            ..TriggerStatus::default()
        }
    }

    fn report(owner: &str, partition: i32, lag: i64, at_ms: i64, up: bool) -> RegionStatus {
        RegionStatus {
            replica: owner.into(),
            connections: vec![ConnectionStatus {
                name: "c".into(),
                running_on: vec![owner.into()],
                brokers_up: Some(up),
                registry_reachable: Some(true),
                triggers: vec![trigger(owner, partition, lag, at_ms)],
                ..ConnectionStatus::default()
            }],
            ..RegionStatus::default()
        }
    }

    #[test]
    fn reports_of_two_replicas_merge_into_one_region() {
        let mut a = report("tk-0", 1, 5, 10, true);
        let mut b = report("tk-1", 0, 7, 20, false);
        b.connections[0].triggers[0].state = RunState::Paused;
        b.connections[0].triggers[0].target.state = RunState::Paused;
        b.connections.push(ConnectionStatus {
            name: "b".into(),
            ..ConnectionStatus::default()
        });
        merge(&mut a, b);
        let names: Vec<&str> = a.connections.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["b", "c"]);
        let c = &a.connections[1];
        assert_eq!(c.running_on, ["tk-0", "tk-1"]);
        assert_eq!(
            c.brokers_up,
            Some(false),
            "one replica cannot reach a broker"
        );
        let t = &c.triggers[0];
        assert_eq!(t.state, RunState::Paused, "the later target state wins");
        assert_eq!(
            (t.runs_in_flight, t.lag_records, t.lag_seconds),
            (2, 12, 7.0)
        );
        assert_eq!(t.last_5m["accepted"], 4);
        assert_eq!(t.lag_history.len(), 1);
        assert_eq!(t.lag_history[0].records, 12);
        let owners: Vec<(&str, i32)> = t
            .partitions
            .iter()
            .map(|p| (p.owner.as_str(), p.partition))
            .collect();
        assert_eq!(owners, [("tk-1", 0), ("tk-0", 1)]);
    }
}
