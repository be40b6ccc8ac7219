//! `[region]`: this replica and the region it belongs to. Shared by connection placement
//! (which replica runs which connection) and by the operator controls (where a trigger's
//! paused state lives, and how an action reaches the replica that owns a partition).
//!
//! Without `[region.kafka]` a region is the set of replicas that run the same file: every
//! replica runs every connection (the behaviour of a single pod and of the demo), the
//! operators' target states live in `state_dir`, and actions are forwarded to `peers`. With
//! it, the replicas join a group on Tessel's own cluster (never a tenant's) and divide the
//! connections among themselves, and the target states live in a compacted topic there.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[region]`.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegionConfig {
    /// The region's name: part of the region group's and topics' default names and the
    /// `region` label of region metrics. Letters, digits, `.`, `_` and `-`. Default
    /// `"default"`.
    #[serde(default = "default_name")]
    pub name: String,
    /// This replica's id, unique in the region and stable across restarts (on Kubernetes,
    /// the pod name). Default: the `HOSTNAME` environment variable, else the host name.
    #[serde(default)]
    pub replica_id: Option<String>,
    /// The URL other replicas use to reach this replica's admin listener (forwarded
    /// actions). Default `http://<replica_id>:<port of server.listen>`.
    #[serde(default)]
    pub advertise_url: Option<String>,
    /// Directory of this replica's durable state: the triggers' target states (paused or
    /// running) when the region has no cluster of its own. Created if missing. Default
    /// `"/var/lib/tessel-kafka"`.
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// The other replicas' admin URLs, for a region without a cluster of its own: actions
    /// received here are forwarded to them. An entry whose host name resolves to several
    /// addresses (a Kubernetes headless Service) names one replica per address. Default none
    /// (a single replica).
    #[serde(default)]
    pub peers: Vec<String>,
    /// Static membership for every consuming connection: each joins its group with
    /// `group.instance.id = "<name>-<replica_id>"` (unless its `kafka` table sets one), so a
    /// restarted replica takes its partitions back without a rebalance. Needs a `replica_id`
    /// that is stable across restarts (a StatefulSet's pod name). Default `false`.
    #[serde(default)]
    pub static_membership: bool,
    /// librdkafka properties of Tessel's own cluster (the region cluster), under their Kafka
    /// names; `bootstrap.servers` is required when the table is present. Secrets as in a
    /// connection's `kafka` table. Absent: no placement, every replica runs every connection.
    #[serde(
        default,
        serialize_with = "super::secret::serialize_properties",
        deserialize_with = "super::secret::deserialize_properties"
    )]
    pub kafka: BTreeMap<String, String>,
    /// How connections are divided among the replicas (with `kafka` only).
    #[serde(default)]
    pub placement: PlacementConfig,
    /// The region's control topic (with `kafka` only).
    #[serde(default)]
    pub control: ControlConfig,
}

impl Default for RegionConfig {
    fn default() -> Self {
        Self {
            name: default_name(),
            replica_id: None,
            advertise_url: None,
            state_dir: default_state_dir(),
            peers: Vec::new(),
            static_membership: false,
            kafka: BTreeMap::new(),
            placement: PlacementConfig::default(),
            control: ControlConfig::default(),
        }
    }
}

impl std::fmt::Debug for RegionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionConfig")
            .field("name", &self.name)
            .field("replica_id", &self.replica_id)
            .field("advertise_url", &self.advertise_url)
            .field("state_dir", &self.state_dir)
            .field("peers", &self.peers)
            .field("static_membership", &self.static_membership)
            .field("kafka", &super::secret::redacted_properties(&self.kafka))
            .field("placement", &self.placement)
            .field("control", &self.control)
            .finish()
    }
}

fn default_name() -> String {
    "default".to_owned()
}

fn default_state_dir() -> PathBuf {
    PathBuf::from("/var/lib/tessel-kafka")
}

/// `[region.placement]`: connections placed on replicas through a group on the region
/// cluster.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementConfig {
    /// On how many replicas a connection runs at most (also never more than the replicas,
    /// nor its partitions): 2 means a replica's death never leaves a connection without a
    /// member. Default 2.
    #[serde(default = "default_spread")]
    pub spread: u32,
    /// Partitions of the placement topic: the slots the region group divides among the
    /// replicas. More slots place connections more evenly; at most 10000. Default 60.
    #[serde(default = "default_slots")]
    pub slots: u32,
    /// The region group's `group.id`. Default `tessel-region-<name>`.
    #[serde(default)]
    pub group_id: Option<String>,
    /// The placement topic, created with `slots` partitions if missing. Default
    /// `tessel-region-<name>-placement`.
    #[serde(default)]
    pub topic: Option<String>,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        Self {
            spread: default_spread(),
            slots: default_slots(),
            group_id: None,
            topic: None,
        }
    }
}

fn default_spread() -> u32 {
    2
}

fn default_slots() -> u32 {
    60
}

/// `[region.control]`: the compacted topic on the region cluster that holds the triggers'
/// target states and the replicas' directory, read by every replica.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// The control topic, created compacted with one partition if missing. Default
    /// `tessel-region-<name>-control`.
    #[serde(default)]
    pub topic: Option<String>,
}

/// The largest `placement.slots`.
pub const MAX_PLACEMENT_SLOTS: u32 = 10_000;

/// librdkafka properties of the region consumer that the connector sets (another value in
/// `region.kafka` is refused): the replicas read each other's slots from the group's
/// description, which the classic protocol gives, and a rebalance revokes only the slots that
/// move (cooperative); nothing is ever committed. `client.id` and `group.id` are set too.
pub const REGION_OWNED_PROPERTIES: &[(&str, &str)] = &[
    ("group.protocol", "classic"),
    ("partition.assignment.strategy", "cooperative-sticky"),
    ("enable.auto.commit", "false"),
];

impl RegionConfig {
    /// Whether the region has a cluster of its own (placement and the control topic).
    pub fn has_cluster(&self) -> bool {
        !self.kafka.is_empty()
    }

    /// This replica's id: `replica_id`, else `HOSTNAME`, else the host name.
    pub fn replica_id(&self) -> String {
        if let Some(id) = &self.replica_id {
            return id.clone();
        }
        std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.trim().is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "tessel-kafka".to_owned())
    }

    /// The URL peers reach this replica's admin listener at.
    pub fn advertise_url(&self, listen_port: u16) -> String {
        self.advertise_url
            .clone()
            .unwrap_or_else(|| format!("http://{}:{listen_port}", self.replica_id()))
    }

    /// The `group.instance.id` of this replica's consumers with `static_membership`:
    /// `<name>-<replica_id>` (pod names repeat in every region's StatefulSet).
    pub fn group_instance_id(&self) -> Option<String> {
        self.static_membership
            .then(|| format!("{}-{}", self.name, self.replica_id()))
    }

    /// The region group's `group.id`.
    pub fn placement_group_id(&self) -> String {
        self.placement
            .group_id
            .clone()
            .unwrap_or_else(|| format!("tessel-region-{}", self.name))
    }

    /// The placement topic.
    pub fn placement_topic(&self) -> String {
        self.placement
            .topic
            .clone()
            .unwrap_or_else(|| format!("tessel-region-{}-placement", self.name))
    }

    /// The control topic.
    pub fn control_topic(&self) -> String {
        self.control
            .topic
            .clone()
            .unwrap_or_else(|| format!("tessel-region-{}-control", self.name))
    }

    /// Rules serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 200
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        };
        if !name_ok(&self.name) {
            return Err(ConfigError::invalid(
                "region.name",
                "use 1 to 200 letters, digits, '.', '_' or '-' (it names Kafka groups and topics)",
            ));
        }
        if let Some(id) = &self.replica_id {
            if !name_ok(id) {
                return Err(ConfigError::invalid(
                    "region.replica_id",
                    "use 1 to 200 letters, digits, '.', '_' or '-'",
                ));
            }
        }
        if let Some(url) = &self.advertise_url {
            check_http_url("region.advertise_url", url)?;
        }
        for (i, peer) in self.peers.iter().enumerate() {
            check_http_url(&format!("region.peers[{i}]"), peer)?;
        }
        if self.has_cluster() {
            if !self.kafka.contains_key("bootstrap.servers") {
                return Err(ConfigError::invalid(
                    "region.kafka.\"bootstrap.servers\"",
                    "is required when [region.kafka] is set",
                ));
            }
            if self.kafka.contains_key("group.id") {
                return Err(ConfigError::invalid(
                    "region.kafka.\"group.id\"",
                    "is set by the connector; name the region group with region.placement.group_id",
                ));
            }
            for (key, value) in REGION_OWNED_PROPERTIES {
                if self.kafka.get(*key).is_some_and(|v| v != value) {
                    return Err(ConfigError::invalid(
                        format!("region.kafka.\"{key}\""),
                        format!(
                            "is set by the connector to {value:?} (replicas read each other's \
                             slots from the classic group protocol's description)"
                        ),
                    ));
                }
            }
        }
        if self.placement.spread == 0 {
            return Err(ConfigError::invalid(
                "region.placement.spread",
                "must be at least 1",
            ));
        }
        if self.placement.slots == 0 || self.placement.slots > MAX_PLACEMENT_SLOTS {
            return Err(ConfigError::invalid(
                "region.placement.slots",
                format!("must be between 1 and {MAX_PLACEMENT_SLOTS}"),
            ));
        }
        Ok(())
    }
}

/// `url` is an absolute http:// or https:// URL with a host.
fn check_http_url(key: &str, url: &str) -> Result<(), ConfigError> {
    match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(()),
        _ => Err(ConfigError::invalid(
            key,
            format!("{url:?} is not an http:// or https:// URL"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(text: &str) -> Result<RegionConfig, ConfigError> {
        let r: RegionConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            message: e.to_string(),
            key: None,
        })?;
        r.validate().map(|()| r)
    }

    #[test]
    fn defaults_name_the_region_group_and_topics() {
        let r = region("").unwrap();
        assert!(!r.has_cluster());
        assert_eq!(r.placement.spread, 2);
        assert_eq!(r.placement_group_id(), "tessel-region-default");
        assert_eq!(r.placement_topic(), "tessel-region-default-placement");
        assert_eq!(r.control_topic(), "tessel-region-default-control");
        let r = region("name = \"eu-1\"\nreplica_id = \"tk-0\"").unwrap();
        assert_eq!(r.placement_group_id(), "tessel-region-eu-1");
        assert_eq!(r.advertise_url(9464), "http://tk-0:9464");
        assert_eq!(r.group_instance_id(), None);
        let r = region("name = \"eu-1\"\nreplica_id = \"tk-0\"\nstatic_membership = true").unwrap();
        assert_eq!(r.group_instance_id().as_deref(), Some("eu-1-tk-0"));
    }

    #[test]
    fn bad_values_are_refused_at_their_key() {
        for (text, key) in [
            ("name = \"a b\"", "region.name"),
            ("replica_id = \"\"", "region.replica_id"),
            ("advertise_url = \"tk-0:9464\"", "region.advertise_url"),
            ("peers = [\"ftp://x\"]", "region.peers[0]"),
            (
                "[kafka]\n\"security.protocol\" = \"SSL\"",
                "bootstrap.servers",
            ),
            (
                "[kafka]\n\"bootstrap.servers\" = \"b:9092\"\n\"group.id\" = \"g\"",
                "group.id",
            ),
            (
                "[kafka]\n\"bootstrap.servers\" = \"b:9092\"\n\"group.protocol\" = \"consumer\"",
                "group.protocol",
            ),
            ("[placement]\nspread = 0", "region.placement.spread"),
            ("[placement]\nslots = 10001", "region.placement.slots"),
        ] {
            let err = region(text).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
    }
}
