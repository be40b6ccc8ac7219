//! Operator tools: committed offsets and lag, resetting a group's offsets (dead-letter
//! replay is in [`super::replay`]). They use the connection's own settings (cluster,
//! security, group).

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{bail, Context};
use rdkafka::config::{ClientConfig, FromClientConfigAndContext};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use crate::clients::probe::matching_topics;
use crate::clients::security::SecurityContext;
use crate::config::{Config, ConnectionConfig};

pub(super) const TIMEOUT: Duration = Duration::from_secs(15);

/// One partition's position for `offsets show`.
#[derive(Debug, Serialize)]
pub struct PartitionOffsets {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The group's committed offset, if any.
    pub committed: Option<i64>,
    /// Earliest offset still in the log.
    pub low_watermark: i64,
    /// The next offset to be written.
    pub high_watermark: i64,
    /// Messages not yet committed by the group.
    pub lag: i64,
}

pub(super) fn connection<'a>(
    config: &'a Config,
    name: Option<&str>,
) -> anyhow::Result<(&'a str, &'a ConnectionConfig)> {
    match name {
        Some(n) => config
            .connections
            .get_key_value(n)
            .map(|(k, v)| (k.as_str(), v))
            .with_context(|| format!("no connection named {n}")),
        None if config.connections.len() == 1 => {
            let (k, v) = config.connections.iter().next().expect("one connection");
            Ok((k.as_str(), v))
        }
        None => bail!("the config has several connections; name one with --connection"),
    }
}

/// A consumer with the connection's settings (MSK IAM tokens included) that never joins the
/// group.
fn admin_consumer(conn: &ConnectionConfig) -> anyhow::Result<BaseConsumer<SecurityContext>> {
    let mut cfg = ClientConfig::new();
    for (k, v) in &conn.kafka {
        let _ = cfg.set(k, v);
    }
    let _ = cfg
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false");
    client(&cfg, conn)
}

/// A client of the connection's cluster configured by `cfg`, with the connection's security
/// context (MSK IAM tokens).
pub(super) fn client<T: FromClientConfigAndContext<SecurityContext>>(
    cfg: &ClientConfig,
    conn: &ConnectionConfig,
) -> anyhow::Result<T> {
    let context = SecurityContext::for_connection("tools", conn)?;
    cfg.create_with_context(context)
        .context("cannot create a Kafka client for the connection")
}

/// The group's committed offsets of `parts`.
fn committed_offsets(
    consumer: &BaseConsumer<SecurityContext>,
    parts: &[(String, i32)],
) -> anyhow::Result<TopicPartitionList> {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in parts {
        tpl.add_partition(t, *p);
    }
    consumer
        .committed_offsets(tpl, TIMEOUT)
        .context("cannot read committed offsets")
}

fn partitions_of(
    consumer: &BaseConsumer<SecurityContext>,
    topics: &BTreeSet<&str>,
) -> anyhow::Result<Vec<(String, i32)>> {
    let mut out = Vec::new();
    let (patterns, named): (Vec<&str>, Vec<&str>) = topics
        .iter()
        .copied()
        .partition(|t| crate::config::is_pattern(t));
    let mut topics: BTreeSet<String> = named.into_iter().map(str::to_owned).collect();
    if !patterns.is_empty() {
        topics.extend(matching_topics(consumer, &patterns)?);
    }
    for topic in &topics {
        let topic = topic.as_str();
        let md = consumer
            .fetch_metadata(Some(topic), TIMEOUT)
            .with_context(|| format!("cannot read the metadata of topic {topic}"))?;
        for t in md.topics() {
            if let Some(e) = t.error() {
                bail!("topic {topic}: {:?}", e);
            }
            out.extend(t.partitions().iter().map(|p| (t.name().to_owned(), p.id())));
        }
    }
    out.sort();
    Ok(out)
}

/// The consuming connection named, or the only one; connections without triggers have no
/// consumer group.
fn consuming_connection<'a>(
    config: &'a Config,
    name: Option<&str>,
) -> anyhow::Result<(&'a str, &'a ConnectionConfig)> {
    if name.is_some() {
        let (n, c) = connection(config, name)?;
        if !c.consumes() {
            bail!("connection {n} has no triggers: it only produces and has no consumer group");
        }
        return Ok((n, c));
    }
    let mut consuming = config.connections.iter().filter(|(_, c)| c.consumes());
    match (consuming.next(), consuming.next()) {
        (Some((n, c)), None) => Ok((n.as_str(), c)),
        (None, _) => bail!("no connection has triggers, so none has a consumer group"),
        (Some(_), Some(_)) => {
            bail!("the config has several consuming connections; name one with --connection")
        }
    }
}

/// Committed offsets and lag of every partition of the connection's topics.
pub fn offsets_show(config: &Config, name: Option<&str>) -> anyhow::Result<Vec<PartitionOffsets>> {
    let (_, conn) = consuming_connection(config, name)?;
    let consumer = admin_consumer(conn)?;
    let parts = partitions_of(&consumer, &conn.topics())?;
    let committed = committed_offsets(&consumer, &parts)?;
    parts
        .into_iter()
        .map(|(topic, partition)| {
            let (low, high) = consumer.fetch_watermarks(&topic, partition, TIMEOUT)?;
            let committed = match committed
                .find_partition(&topic, partition)
                .map(|e| e.offset())
            {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            };
            let lag = high - committed.unwrap_or(low).max(low);
            Ok(PartitionOffsets {
                topic,
                partition,
                committed,
                low_watermark: low,
                high_watermark: high,
                lag,
            })
        })
        .collect::<Result<Vec<_>, rdkafka::error::KafkaError>>()
        .context("cannot read watermarks")
}

/// Where `offsets reset` moves the group.
#[derive(Debug, Clone)]
pub enum ResetTo {
    /// The earliest offset still in the log.
    Earliest,
    /// The end of the log.
    Latest,
    /// The first offset at or after this time (milliseconds since the epoch).
    Timestamp(i64),
    /// This offset.
    Offset(i64),
}

impl std::str::FromStr for ResetTo {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "earliest" => Ok(Self::Earliest),
            "latest" => Ok(Self::Latest),
            _ => {
                if let Some(ms) = s.strip_prefix("timestamp:") {
                    return ms
                        .parse()
                        .map(Self::Timestamp)
                        .map_err(|_| format!("bad timestamp {ms}: milliseconds since the epoch"));
                }
                if let Some(o) = s.strip_prefix("offset:") {
                    return o
                        .parse()
                        .map(Self::Offset)
                        .map_err(|_| format!("bad offset {o}"));
                }
                Err("use earliest, latest, timestamp:<ms> or offset:<n>".to_owned())
            }
        }
    }
}

/// What `offsets reset` is asked to do.
#[derive(Debug, Clone)]
pub struct ResetRequest {
    /// Where the offsets go.
    pub to: ResetTo,
    /// Only this topic (default: all of the connection's topics).
    pub topic: Option<String>,
    /// Only these partitions of `topic` (default: all); needs `topic`.
    pub partitions: Vec<i32>,
    /// Commit the planned offsets; without it nothing is written (a dry run).
    pub execute: bool,
}

/// One partition of an `offsets reset` plan.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct PartitionReset {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// The group's committed offset before the reset (None: nothing committed).
    pub current: Option<i64>,
    /// The offset the group is moved to (clamped to the watermarks).
    pub planned: i64,
    /// Earliest offset still in the log.
    pub low_watermark: i64,
    /// The next offset to be written.
    pub high_watermark: i64,
}

/// The plan of `offsets reset` and whether it was committed.
#[derive(Debug, Serialize)]
pub struct ResetReport {
    /// The connection.
    pub connection: String,
    /// Its consumer group.
    pub group: String,
    /// Whether the planned offsets were committed (`--execute`); false for a dry run.
    pub executed: bool,
    /// Members the group description shows (a KIP-848 group shows none while it has some; a
    /// commit from outside is refused then).
    pub active_members: usize,
    /// One line per partition, in topic and partition order.
    pub partitions: Vec<PartitionReset>,
}

/// Plans moving the group's committed offsets and, with `execute`, commits them; the commit
/// is refused while the group has active members. A dry run writes nothing.
pub fn offsets_reset(
    config: &Config,
    name: Option<&str>,
    request: &ResetRequest,
) -> anyhow::Result<ResetReport> {
    let (cname, conn) = consuming_connection(config, name)?;
    let group = conn.group_id();
    if !request.partitions.is_empty() && request.topic.is_none() {
        bail!("--partition needs --topic: partitions are numbered per topic");
    }
    let consumer = admin_consumer(conn)?;
    let groups = consumer
        .fetch_group_list(Some(group), TIMEOUT)
        .context("cannot describe the consumer group")?;
    let described = groups.groups().iter().find(|g| g.name() == group);
    let active_members = described.map_or(0, |g| g.members().len());
    if request.execute {
        if let Some(g) = described {
            if !g.members().is_empty() || !matches!(g.state(), "Empty" | "Dead" | "") {
                bail!(
                    "consumer group {group} of connection {cname} has {} active member(s) (state {}); stop every tessel-kafka of this connection first",
                    g.members().len(),
                    g.state()
                );
            }
        }
    }
    let topics: BTreeSet<&str> = match request.topic.as_deref() {
        Some(t) => {
            if conn.trigger_for(t).is_none() {
                bail!("topic {t} is not consumed by connection {cname}");
            }
            BTreeSet::from([t])
        }
        None => conn.topics(),
    };
    let mut parts = partitions_of(&consumer, &topics)?;
    if !request.partitions.is_empty() {
        let topic = request.topic.as_deref().unwrap_or_default();
        for p in &request.partitions {
            if !parts.iter().any(|(_, q)| q == p) {
                bail!(
                    "topic {topic} has no partition {p} (it has {} partitions, from 0)",
                    parts.len()
                );
            }
        }
        parts.retain(|(_, p)| request.partitions.contains(p));
    }
    let current = committed_offsets(&consumer, &parts)?;
    let mut tpl = TopicPartitionList::new();
    let mut plan = Vec::new();
    for (t, p) in parts {
        let (low, high) = consumer.fetch_watermarks(&t, p, TIMEOUT)?;
        let planned = match request.to {
            ResetTo::Earliest => low,
            ResetTo::Latest => high,
            ResetTo::Offset(o) => o.clamp(low, high),
            ResetTo::Timestamp(ms) => {
                let mut q = TopicPartitionList::new();
                q.add_partition_offset(&t, p, Offset::Offset(ms))?;
                let found = consumer.offsets_for_times(q, TIMEOUT)?;
                match found.find_partition(&t, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o,
                    _ => high,
                }
            }
        };
        tpl.add_partition_offset(&t, p, Offset::Offset(planned))?;
        let committed = match current.find_partition(&t, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        };
        plan.push(PartitionReset {
            topic: t,
            partition: p,
            current: committed,
            planned,
            low_watermark: low,
            high_watermark: high,
        });
    }
    if request.execute && !plan.is_empty() {
        if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
            // A group on the KIP-848 protocol does not show its members to the classic group
            // description above; the broker refuses a commit from outside while it has any.
            if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::UnknownMemberId) {
                bail!(
                    "consumer group {group} of connection {cname} has active member(s) (the broker refused a commit from outside the group: {e}); stop every tessel-kafka of this connection first"
                );
            }
            return Err(anyhow::Error::new(e).context(format!(
                "the broker refused the new offsets of group {group} (is a consumer active?)"
            )));
        }
    }
    Ok(ResetReport {
        connection: cname.to_owned(),
        group: group.to_owned(),
        executed: request.execute,
        active_members,
        partitions: plan,
    })
}
