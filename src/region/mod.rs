//! Placement of connections on the replicas of a region, through Kafka's own group protocol
//! on the region cluster (Tessel's, never a tenant's), as Kafka Connect places its workers'
//! tasks.
//!
//! The placement topic's partitions are slots. Every replica consumes it in the region group
//! (classic protocol, cooperative-sticky assignor), so the group coordinator divides the
//! slots among the live replicas and moves only the slots that must move when one joins or
//! dies. Each connection ranks the slots by a hash of its name ([`placement`]) and runs on
//! the holders of its best-ranked slots: `placement.spread` distinct replicas at most. A
//! replica knows its own slots from its assignment and the others' from the group's
//! description; a slot whose holder it does not know counts as a holder of its own, so it
//! never starts what a better-informed replica would give to another.
//!
//! When slots are revoked, the rebalance callback hands the connections that move over
//! before the slots are released: the daemon stops their supervisors (runs drained, final
//! commit, the tenant group left), bounded by the drain timeout. A placement that changes
//! because another replica's slots moved is applied the same orderly way, without waiting
//! for the newcomer: the tenant group's own protocol keeps the commit rule in either case.
//!
//! Without `[region.kafka]` none of this runs: every replica runs every connection.

mod assignment;
mod group;
mod native;
mod partitions;
pub mod placement;

pub use partitions::PartitionCounts;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::config::{Config, RegionConfig};

/// What the daemon asks the region to place: each connection with how many replicas it
/// wants, and the longest drain (how long a handover may take).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// Connection name → min(spread, what is known of its partitions).
    pub wants: BTreeMap<String, usize>,
    /// The longest `drain_timeout_ms` of the connections.
    pub drain: Duration,
}

impl Demand {
    /// Every connection of `config` with triggers, each wanting `region.placement.spread`
    /// replicas (a connection without triggers is not placed: it only produces, on every
    /// replica).
    pub fn of(config: &Config) -> Self {
        let spread = config.region.placement.spread as usize;
        Self {
            wants: config
                .connections
                .iter()
                .filter(|(_, c)| c.consumes())
                .map(|(name, _)| (name.clone(), spread))
                .collect(),
            drain: Duration::from_millis(
                config
                    .connections
                    .values()
                    .map(|c| c.drain_timeout_ms)
                    .max()
                    .unwrap_or(0),
            ),
        }
    }
}

/// Connections the region moves away from this replica: the daemon stops them (drained,
/// committed) and then answers on `done`, before the slots are released.
#[derive(Debug)]
pub struct Handover {
    /// The connections to stop.
    pub stop: BTreeSet<String>,
    /// Answered once they stopped.
    pub done: std::sync::mpsc::SyncSender<()>,
}

/// Why a connection runs here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlacedHere {
    /// The slot of this replica that placed it here.
    pub slot: u32,
    /// Its rank among the connection's replicas (0: the best-ranked).
    pub rank: usize,
    /// The connection's other replicas (their `replica_id`, or `unknown (slot N)` while
    /// the holder of the slot is not known).
    pub with: Vec<String>,
}

/// What this replica runs, as the region decided it, and the region group as it sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// This replica is a member of the region group.
    pub joined: bool,
    /// The region group's generation.
    pub generation: i32,
    /// Members of the region group (0 until its description was read).
    pub replicas: usize,
    /// The slots this replica holds.
    pub slots: Vec<u32>,
    /// The connections that run here, and why.
    pub runs: BTreeMap<String, PlacedHere>,
    /// Why the replica is not in the region group, while it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Placement {
    fn describe_holder(&self, slot: u32, holder: &placement::Holder) -> String {
        match holder {
            placement::Holder::Me => "this replica".to_owned(),
            // `replica#member id`: the replica is what people know.
            placement::Holder::Member(m) => m.split('#').next().unwrap_or(m).to_owned(),
            placement::Holder::Incoming => format!("taking over (slot {slot})"),
            placement::Holder::Unknown(_) => format!("unknown (slot {slot})"),
        }
    }
}

/// The running region member, as the daemon holds it.
pub struct Region {
    /// What this replica runs.
    pub placement: watch::Receiver<Placement>,
    /// Connections to hand over before slots are released (taken by the daemon).
    handovers: std::sync::Mutex<Option<mpsc::Receiver<Handover>>>,
    demand: watch::Sender<Demand>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// `[region]` as the member was started with.
    pub config: RegionConfig,
}

impl Region {
    /// Starts this replica's member of the region group of `config` (which has a region
    /// cluster), on a thread of its own.
    pub fn start(config: &Config) -> std::io::Result<Self> {
        let (demand_tx, demand_rx) = watch::channel(Demand::of(config));
        let (placement_tx, placement_rx) = watch::channel(Placement::default());
        let (handovers_tx, handovers_rx) = mpsc::channel(1);
        let stop = Arc::new(AtomicBool::new(false));
        let channels = group::Channels {
            demand: demand_rx,
            placement: placement_tx,
            handovers: handovers_tx,
            stop: Arc::clone(&stop),
        };
        let region = config.region.clone();
        let thread = std::thread::Builder::new()
            .name("region".to_owned())
            .spawn(move || group::run(region, channels))?;
        Ok(Self {
            placement: placement_rx,
            handovers: std::sync::Mutex::new(Some(handovers_rx)),
            demand: demand_tx,
            stop,
            thread: Some(thread),
            config: config.region.clone(),
        })
    }

    /// The handovers the daemon answers (once; None after).
    pub fn take_handovers(&self) -> Option<mpsc::Receiver<Handover>> {
        self.handovers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// The connections to place changed (a reload).
    pub fn set_demand(&self, demand: Demand) {
        self.demand.send_if_modified(|d| {
            let changed = *d != demand;
            *d = demand;
            changed
        });
    }

    /// Leaves the region group (without handing over: the daemon stops every connection)
    /// and waits for the member's thread to end.
    pub async fn leave(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // A callback may wait for a handover the daemon no longer answers: the daemon drops
        // its receiver first, so the callback's send fails at once.
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}
