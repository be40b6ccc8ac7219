//! The region group: this replica's consumer of the placement topic on the region cluster,
//! its rebalance callbacks (where a connection that moves away is handed over) and the
//! group's description (who holds which slot). One OS thread polls it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::TopicPartitionList;
use tokio::sync::{mpsc, watch};

use super::placement::Knowledge;
use super::{Demand, Handover, PlacedHere, Placement};
use crate::clients::security::SecurityContext;
use crate::config::RegionConfig;

/// How often the group's description is read while nothing changes (who holds which slot;
/// a rebalance also has it read at once).
const VIEW_EVERY: Duration = Duration::from_secs(10);
/// How soon it is read again while the group is rebalancing.
const VIEW_RETRY: Duration = Duration::from_millis(500);
/// Bound on one request for the group's description or the topic's metadata.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one poll of the region consumer waits.
const POLL: Duration = Duration::from_millis(200);

/// Defaults of the region consumer, unless `region.kafka` sets them: a dead replica's slots
/// move after 10 s (Kafka Connect's workers use the same), and nothing is ever read from the
/// placement topic.
const DEFAULTS: &[(&str, &str)] = &[
    ("session.timeout.ms", "10000"),
    ("heartbeat.interval.ms", "3000"),
    ("auto.offset.reset", "latest"),
    ("statistics.interval.ms", "0"),
];

/// The `client.id` prefix of region members; the rest is the replica id.
const CLIENT_ID_PREFIX: &str = "tessel-kafka-region.";

/// What the thread and the callbacks share.
pub(super) struct Shared {
    state: Mutex<State>,
    /// Set when the daemon stops: callbacks no longer hand over.
    closing: AtomicBool,
    handovers: mpsc::Sender<Handover>,
    topic: String,
}

#[derive(Default)]
struct State {
    knowledge: Knowledge,
    demand: Demand,
    /// Slots this replica held when its assignment was lost (a session timeout, the region
    /// cluster out of reach): what it runs is kept until it is assigned again, since the
    /// region cluster being away is no reason to stop the tenants' work.
    lost: Option<BTreeSet<u32>>,
    /// When to read the group's description next.
    view_due: Option<Instant>,
    /// The placement must be computed again.
    dirty: bool,
}

impl State {
    /// The knowledge placements are computed from (held slots kept while lost).
    fn effective(&self) -> Knowledge {
        match &self.lost {
            Some(held) => {
                let mut k = self.knowledge.clone();
                k.mine.extend(held.iter().copied());
                k
            }
            None => self.knowledge.clone(),
        }
    }
}

/// The region consumer's context: librdkafka's log through the connector's, and the
/// rebalance callbacks.
pub(super) struct RegionContext {
    client: SecurityContext,
    shared: Arc<Shared>,
}

impl ClientContext for RegionContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.client.log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.client.error(error, reason);
    }

    fn generate_oauth_token(
        &self,
        oauthbearer_config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        self.client.generate_oauth_token(oauthbearer_config)
    }
}

/// The slots among `tpl`'s partitions of `topic`.
fn slots_of(tpl: &TopicPartitionList, topic: &str) -> Vec<u32> {
    tpl.elements()
        .iter()
        .filter(|e| e.topic() == topic)
        .filter_map(|e| u32::try_from(e.partition()).ok())
        .collect()
}

impl ConsumerContext for RegionContext {
    /// Slots revoked (not lost): the connections that would no longer run here are handed
    /// over first, drained and committed by their supervisors, and only then does librdkafka
    /// release the slots to their next holder. Bounded by the longest drain.
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let revoked = slots_of(tpl, &self.shared.topic);
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        if consumer.assignment_lost() {
            if state.lost.is_none() && !state.knowledge.mine.is_empty() {
                tracing::warn!(
                    slots = revoked.len(),
                    "region group membership lost; this replica keeps running its connections \
                     until it is assigned again"
                );
                state.lost = Some(state.knowledge.mine.clone());
            }
            state.knowledge.mine.clear();
            state.view_due = Some(Instant::now());
            return;
        }
        let before = state.effective().here(&state.demand.wants);
        state.knowledge.release(&revoked);
        let after = state.effective().here(&state.demand.wants);
        state.dirty = true;
        state.view_due = Some(Instant::now());
        let wait = state.demand.drain + Duration::from_secs(10);
        drop(state);
        let stop: BTreeSet<String> = before
            .into_keys()
            .filter(|c| !after.contains_key(c))
            .collect();
        tracing::info!(
            slots = ?revoked,
            connections = stop.len(),
            "region slots revoked: handing over the connections that move"
        );
        if stop.is_empty() || self.shared.closing.load(Ordering::SeqCst) {
            return;
        }
        let (done, wait_done) = std::sync::mpsc::sync_channel(1);
        let started = Instant::now();
        if self
            .shared
            .handovers
            .blocking_send(Handover { stop, done })
            .is_ok()
        {
            match wait_done.recv_timeout(wait) {
                Ok(()) => tracing::info!(
                    took_ms = started.elapsed().as_millis() as u64,
                    "connections handed over: drained and committed"
                ),
                Err(_) => tracing::warn!(
                    waited_ms = wait.as_millis() as u64,
                    "the handover did not finish in time; the slots are released anyway"
                ),
            }
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Assign(tpl) = rebalance else {
            return;
        };
        let assigned = slots_of(tpl, &self.shared.topic);
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        state.knowledge.mine.extend(assigned.iter().copied());
        if state.lost.take().is_some() {
            tracing::info!("region group joined again");
        }
        state.dirty = true;
        state.view_due = Some(Instant::now());
        drop(state);
        if !assigned.is_empty() {
            tracing::info!(slots = ?assigned, "region slots assigned");
        }
    }
}

/// The region thread's handles on the daemon.
pub(super) struct Channels {
    pub(super) demand: watch::Receiver<Demand>,
    pub(super) placement: watch::Sender<Placement>,
    pub(super) handovers: mpsc::Sender<Handover>,
    pub(super) stop: Arc<AtomicBool>,
}

/// The region consumer's librdkafka configuration.
fn client_config(region: &RegionConfig) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    for (k, v) in &region.kafka {
        let _ = cfg.set(k, v);
    }
    for (k, v) in DEFAULTS {
        if !region.kafka.contains_key(*k) {
            let _ = cfg.set(*k, *v);
        }
    }
    for (k, v) in crate::config::REGION_OWNED_PROPERTIES {
        let _ = cfg.set(*k, *v);
    }
    let _ = cfg.set("group.id", region.placement_group_id()).set(
        "client.id",
        format!("{CLIENT_ID_PREFIX}{}", region.replica_id()),
    );
    cfg.set_log_level(RDKafkaLogLevel::Info);
    cfg
}

/// Runs the region member until `channels.stop` is set: joins the group (creating the
/// placement topic if missing), follows its assignment and the group's description, and
/// publishes what this replica runs.
pub(super) fn run(region: RegionConfig, mut channels: Channels) {
    let topic = region.placement_topic();
    let label = format!("region:{}", region.name);
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            demand: channels.demand.borrow_and_update().clone(),
            ..State::default()
        }),
        closing: AtomicBool::new(false),
        handovers: channels.handovers.clone(),
        topic: topic.clone(),
    });
    let mut backoff = Duration::from_secs(1);
    let consumer = loop {
        if channels.stop.load(Ordering::SeqCst) {
            return;
        }
        match join(&region, &topic, &label, &shared) {
            Ok(c) => break c,
            Err(e) => {
                tracing::error!(error = %e, retry_in_ms = backoff.as_millis() as u64,
                    "cannot join the region group; no connection runs here until it does");
                channels
                    .placement
                    .send_modify(|p| p.error = Some(e.clone()));
                sleep_unless(&channels.stop, backoff);
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    };
    channels.placement.send_modify(|p| p.error = None);
    let group = region.placement_group_id();
    while !channels.stop.load(Ordering::SeqCst) {
        // Messages are never written to the placement topic; polling serves the callbacks.
        let _ = consumer.poll(POLL);
        if channels.demand.has_changed().unwrap_or(false) {
            let demand = channels.demand.borrow_and_update().clone();
            let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            state.demand = demand;
            state.dirty = true;
        }
        let view_due = {
            let state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            state.view_due.is_none_or(|at| at <= Instant::now())
        };
        let (generation, member) = super::native::membership(&consumer);
        if view_due {
            let view = describe(&consumer, &group, &topic, &member);
            let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            match view {
                Some((others, members)) => {
                    let before = state.knowledge.clone();
                    state.knowledge.described(others);
                    if state.knowledge != before {
                        state.dirty = true;
                    }
                    channels.placement.send_if_modified(|p| {
                        let changed = p.replicas != members;
                        p.replicas = members;
                        changed
                    });
                    state.view_due = Some(Instant::now() + VIEW_EVERY);
                }
                None => state.view_due = Some(Instant::now() + VIEW_RETRY),
            }
        }
        crate::telemetry::metrics::region_generation(generation.max(0));
        let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let dirty = std::mem::take(&mut state.dirty);
        let placement = dirty.then(|| {
            let knowledge = state.effective();
            let here = knowledge.here(&state.demand.wants);
            let placed = knowledge.place_all(&state.demand.wants);
            (knowledge, here, placed)
        });
        drop(state);
        channels.placement.send_if_modified(|p| {
            let mut changed = p.generation != generation || p.joined != (generation > 0);
            p.generation = generation;
            p.joined = generation > 0;
            if let Some((knowledge, here, placed)) = &placement {
                let runs: BTreeMap<String, PlacedHere> = here
                    .iter()
                    .map(|(name, (slot, rank))| {
                        let others = placed[name]
                            .holders
                            .iter()
                            .filter(|(s, _)| s != slot)
                            .map(|(s, h)| p.describe_holder(*s, h))
                            .collect();
                        (
                            name.clone(),
                            PlacedHere {
                                slot: *slot,
                                rank: *rank,
                                with: others,
                            },
                        )
                    })
                    .collect();
                let slots: Vec<u32> = knowledge.mine.iter().copied().collect();
                if runs != p.runs || slots != p.slots {
                    p.runs = runs;
                    p.slots = slots;
                    changed = true;
                }
            }
            changed
        });
    }
    // Leaving: the callbacks no longer hand over (the daemon is stopping every connection).
    shared.closing.store(true, Ordering::SeqCst);
    drop(consumer);
    tracing::info!("left the region group");
}

/// Sleeps `d`, waking early when `stop` is set.
fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100).min(until - Instant::now()));
    }
}

/// Creates the region consumer, makes sure the placement topic exists (created with
/// `placement.slots` partitions) and subscribes to it.
fn join(
    region: &RegionConfig,
    topic: &str,
    label: &str,
    shared: &Arc<Shared>,
) -> Result<BaseConsumer<RegionContext>, String> {
    let context = RegionContext {
        client: SecurityContext::new(label, None),
        shared: Arc::clone(shared),
    };
    let consumer: BaseConsumer<RegionContext> = client_config(region)
        .create_with_context(context)
        .map_err(|e| format!("region consumer: {e}"))?;
    let slots = match partitions(&consumer, topic)? {
        Some(n) => n,
        None => {
            create_topic(region, topic, label)?;
            tracing::info!(
                topic,
                slots = region.placement.slots,
                "placement topic created"
            );
            region.placement.slots
        }
    };
    if slots != region.placement.slots {
        tracing::warn!(topic, slots, configured = region.placement.slots,
            "the placement topic has another partition count than region.placement.slots; its own count is used");
    }
    shared
        .state
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .knowledge
        .slots = slots;
    consumer
        .subscribe(&[topic])
        .map_err(|e| format!("subscribe to {topic}: {e}"))?;
    tracing::info!(group = %region.placement_group_id(), topic, slots,
        replica = %region.replica_id(), "joining the region group");
    Ok(consumer)
}

/// The partitions of `topic` (None when it does not exist).
fn partitions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
) -> Result<Option<u32>, String> {
    let md = consumer
        .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
        .map_err(|e| format!("metadata of the placement topic {topic}: {e}"))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    match t.error() {
        Some(e)
            if rdkafka::types::RDKafkaErrorCode::from(e)
                == rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition =>
        {
            Ok(None)
        }
        Some(e) => Err(format!(
            "metadata of the placement topic {topic}: {}",
            rdkafka::types::RDKafkaErrorCode::from(e)
        )),
        None if t.partitions().is_empty() => Ok(None),
        None => Ok(Some(t.partitions().len() as u32)),
    }
}

/// Creates the placement topic (the cluster's default replication). One that another
/// replica created meanwhile is fine.
fn create_topic(region: &RegionConfig, topic: &str, label: &str) -> Result<(), String> {
    let mut cfg = ClientConfig::new();
    for (k, v) in &region.kafka {
        let _ = cfg.set(k, v);
    }
    let admin: AdminClient<SecurityContext> = cfg
        .create_with_context(SecurityContext::new(label, None))
        .map_err(|e| format!("region admin client: {e}"))?;
    let new = NewTopic::new(
        topic,
        region.placement.slots as i32,
        TopicReplication::Fixed(-1),
    );
    let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
    let results = futures::executor::block_on(admin.create_topics(&[new], &options))
        .map_err(|e| format!("create the placement topic {topic}: {e}"))?;
    for r in results {
        match r {
            Ok(_) => {}
            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => return Err(format!("create the placement topic {t}: {e}")),
        }
    }
    Ok(())
}

/// The other members' slots and the number of members, from the group's description; None
/// while it is rebalancing or cannot be read.
fn describe<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    group: &str,
    topic: &str,
    me: &str,
) -> Option<(BTreeMap<u32, String>, usize)> {
    let list = match consumer.fetch_group_list(Some(group), REQUEST_TIMEOUT) {
        Ok(list) => list,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the region group's description");
            return None;
        }
    };
    let g = list.groups().iter().find(|g| g.name() == group)?;
    if g.state() != "Stable" {
        return None;
    }
    let mut others = BTreeMap::new();
    for m in g.members() {
        if m.id() == me {
            continue;
        }
        let Some(assigned) = m.assignment().and_then(super::assignment::parse) else {
            continue;
        };
        let replica = m
            .client_id()
            .strip_prefix(CLIENT_ID_PREFIX)
            .unwrap_or(m.client_id());
        for p in assigned.get(topic).into_iter().flatten() {
            if let Ok(slot) = u32::try_from(*p) {
                let _ = others.insert(slot, format!("{replica}#{}", m.id()));
            }
        }
    }
    Some((others, g.members().len()))
}
