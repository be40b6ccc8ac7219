//! `[connections.<name>]`: one Kafka cluster, one consumer group, its registry and triggers.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::registry_paste::PastedRegistry;
use super::secret::Secret;
use super::security::{self, AwsIamConfig, KafkaAuth};
use super::trigger::TriggerConfig;
use super::ConfigError;

/// One Kafka connection: a consumer in a group over the union of its triggers' topics.
/// Debug output shows secret properties (passwords, JAAS text, client secrets) redacted.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionConfig {
    /// librdkafka client properties under their Kafka names, as the product page shows them:
    /// `bootstrap.servers`, `security.protocol`, `sasl.mechanism`, `sasl.username`,
    /// `sasl.password`, `group.id`, `auto.offset.reset`, `ssl.ca.location`, ...
    /// `bootstrap.servers` is required, and `group.id` when the connection has triggers. The
    /// connector sets `enable.auto.offset.store=false`, `enable.auto.commit=false` and
    /// `isolation.level=read_committed` itself (docs/configuration.md lists what it sets).
    /// Schema Registry client properties pasted with them from a console's snippet
    /// (`schema.registry.url`, `basic.auth.credentials.source`, `basic.auth.user.info`,
    /// `bearer.auth.token`, `schema.registry.ssl.*`) are moved to `schema_registry` at load.
    #[serde(
        serialize_with = "super::secret::serialize_properties",
        deserialize_with = "super::secret::deserialize_properties"
    )]
    pub kafka: BTreeMap<String, String>,
    /// The Schema Registry used to decode `schema_registry` and `auto` formats.
    #[serde(default)]
    pub schema_registry: Option<RegistryConfig>,
    /// The connection's idempotent producer (produce API, dead-letter writes).
    #[serde(default)]
    pub producer: super::produce::ProducerConfig,
    /// Triggers by name. A trigger maps topics to the workflow each message starts. A
    /// connection without triggers runs no consumer (and needs no `group.id`): it only
    /// serves the produce API, so a `[produce]` token must grant it.
    #[serde(default)]
    pub triggers: BTreeMap<String, TriggerConfig>,
    /// How long a revoke or shutdown waits for runs in flight before giving up on them
    /// (their offsets are then not committed, and they are dispatched again later).
    /// Default 30000.
    #[serde(default = "default_drain_timeout_ms")]
    pub drain_timeout_ms: u64,
    /// A partition with messages waiting or in flight whose commit offset has not moved for
    /// this long is reported as stalled (metric, log line, `/health`). Default 60000.
    #[serde(default = "default_stall_after_ms")]
    pub stall_after_ms: u64,
    /// Messages buffered per partition before that partition is paused (it resumes at half).
    /// Default 10000: a pause makes librdkafka drop what it prefetched for the partition, and
    /// at 1000 the pause-and-refetch cycle capped a drain near 14k events/s; the byte budget
    /// below is what bounds memory.
    #[serde(default = "default_max_buffered_per_partition")]
    pub max_buffered_per_partition: usize,
    /// Bytes of message payload buffered over the whole connection before partitions are
    /// paused. Default 67108864 (64 MiB).
    #[serde(default = "default_max_buffered_bytes")]
    pub max_buffered_bytes: usize,
    /// The longest commit metadata the connector writes, in characters: the brokers'
    /// `offset.metadata.max.bytes` (4096 unless changed). The metadata carries which offsets
    /// above a partition's committed offset were handled; a partition whose map might
    /// outgrow this starts nothing but the record it waits on until the map shrinks, so a
    /// handover never repeats what was handled. At most 8192. Default 4096.
    #[serde(default = "default_commit_metadata_max_bytes")]
    pub commit_metadata_max_bytes: usize,
    /// Removed. A transactional producer used to commit the same offsets while the
    /// consumer's own commits waited behind a rejoin; its writes and the consumer's could
    /// land out of order and move a partition's committed offset back, so every commit now
    /// goes through the consumer, in order. Still accepted (`"transactional"` or `"off"`) so
    /// that existing files load; ignored, with a warning at start.
    #[serde(default, skip_serializing)]
    pub commit_fallback: Option<CommitFallback>,
    /// Amazon MSK IAM credentials and region, used with `"sasl.mechanism" = "AWS_MSK_IAM"`
    /// (see [`AwsIamConfig`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws: Option<AwsIamConfig>,
    /// Topics the connection writes to besides dead-letter topics (a produce grant). Each
    /// needs WRITE for the connection's principal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub produce_topics: Vec<String>,
    /// What the loader translated from Java client properties (logged at start).
    #[serde(skip)]
    pub notices: Vec<String>,
}

/// The values [`ConnectionConfig::commit_fallback`] accepted (removed; ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CommitFallback {
    /// Was the default.
    Transactional,
    /// Was the way to turn it off.
    Off,
}

/// Schema Registry access (Confluent API; Apicurio's `/apis/ccompat/v7` works too).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    /// Base URL, path included, e.g. `https://psrc-xxxx.region.aws.confluent.cloud` or
    /// `http://registry:8080/apis/ccompat/v7`.
    pub url: super::secret::Endpoint,
    /// Basic-auth user (Confluent Cloud: the registry API key).
    #[serde(default)]
    pub username: Option<String>,
    /// Basic-auth password (Confluent Cloud: the registry API secret).
    #[serde(default)]
    pub password: Option<Secret>,
    /// Bearer token, instead of basic auth.
    #[serde(default)]
    pub bearer_token: Option<Secret>,
    /// CA certificates (PEM) that sign the registry's certificate, instead of the system's.
    #[serde(default)]
    pub ca_location: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for mTLS; needs `key_location`.
    #[serde(default)]
    pub certificate_location: Option<std::path::PathBuf>,
    /// Client private key (PEM, unencrypted) for mTLS.
    #[serde(default)]
    pub key_location: Option<std::path::PathBuf>,
    /// Timeout of one registry request. Default 10000.
    #[serde(default = "default_registry_timeout_ms")]
    pub timeout_ms: u64,
}

impl RegistryConfig {
    /// The CA and client certificate files of this registry.
    pub fn tls_files(&self) -> crate::tls::TlsFiles<'_> {
        crate::tls::TlsFiles::of(
            &self.ca_location,
            &self.certificate_location,
            &self.key_location,
        )
    }

    /// A registry at `url` with every other setting at its default.
    pub(crate) fn new(url: super::secret::Endpoint) -> Self {
        Self {
            url,
            username: None,
            password: None,
            bearer_token: None,
            ca_location: None,
            certificate_location: None,
            key_location: None,
            timeout_ms: default_registry_timeout_ms(),
        }
    }
}

impl std::fmt::Debug for ConnectionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionConfig")
            .field("kafka", &super::secret::redacted_properties(&self.kafka))
            .field("schema_registry", &self.schema_registry)
            .field("producer", &self.producer)
            .field("triggers", &self.triggers)
            .field("drain_timeout_ms", &self.drain_timeout_ms)
            .field("stall_after_ms", &self.stall_after_ms)
            .field(
                "max_buffered_per_partition",
                &self.max_buffered_per_partition,
            )
            .field("max_buffered_bytes", &self.max_buffered_bytes)
            .field("commit_metadata_max_bytes", &self.commit_metadata_max_bytes)
            .field("commit_fallback", &self.commit_fallback)
            .field("aws", &self.aws)
            .field("produce_topics", &self.produce_topics)
            .field("notices", &self.notices)
            .finish()
    }
}

fn default_drain_timeout_ms() -> u64 {
    30_000
}
fn default_stall_after_ms() -> u64 {
    60_000
}
fn default_max_buffered_per_partition() -> usize {
    10_000
}
fn default_max_buffered_bytes() -> usize {
    64 * 1024 * 1024
}
fn default_commit_metadata_max_bytes() -> usize {
    crate::core::offsets::DEFAULT_METADATA_MAX_CHARS
}
fn default_registry_timeout_ms() -> u64 {
    10_000
}

/// Properties the connector owns; a user value is refused with the reason.
const OWNED_PROPERTIES: &[(&str, &str, &str)] = &[
    (
        "isolation.level",
        "read_committed",
        "the connector reads with read_committed isolation so that aborted transactions never start a run",
    ),
    (
        "enable.auto.offset.store",
        "false",
        "the connector stores an offset only after the run for it was accepted",
    ),
    (
        "enable.auto.commit",
        "false",
        "the connector commits itself, in order, only what was accepted (one request at a time, and on revoke and shutdown)",
    ),
];

impl ConnectionConfig {
    /// Translates Java client properties into librdkafka's (see [`security`]) and records a
    /// notice for each translation.
    /// Schema Registry properties pasted among the Kafka ones move to `schema_registry`
    /// (see [`super::registry_paste`]).
    pub(super) fn normalize(&mut self, name: &str) -> Result<(), ConfigError> {
        let in_kafka = |e: security::SecurityError| {
            ConfigError::invalid(format!("connections.{name}.kafka"), e.to_string())
        };
        self.notices = security::normalize(&mut self.kafka, &mut self.aws).map_err(in_kafka)?;
        let registry = PastedRegistry::take(&mut self.kafka).map_err(in_kafka)?;
        self.notices
            .extend(registry.apply(name, &mut self.schema_registry)?);
        Ok(())
    }

    /// How the connection authenticates (valid after loading).
    pub fn auth(&self) -> Result<KafkaAuth, security::SecurityError> {
        security::auth_of(&self.kafka, self.aws.as_ref())
    }

    /// Topics the connection writes to: every trigger's dead-letter topic and the
    /// `produce_topics` grant. The principal needs WRITE on each; an empty set means the
    /// connection never produces.
    pub fn produced_topics(&self) -> BTreeSet<&str> {
        self.triggers
            .values()
            .filter_map(|t| t.dead_letter_topic.as_deref())
            .chain(self.produce_topics.iter().map(String::as_str))
            .collect()
    }

    /// Whether any trigger dead-letters (the connection then runs an idempotent producer).
    pub fn dead_letters(&self) -> bool {
        self.triggers.values().any(TriggerConfig::dead_letters)
    }

    /// The drain on revoke and shutdown must fit the group's timeouts. The revoke callback
    /// holds a poll round for up to `drain_timeout_ms` + 10 s: past `max.poll.interval.ms`
    /// librdkafka leaves the group mid-drain. With static membership (`group.instance.id`) a
    /// restart only avoids a rebalance when the drain on stop fits within
    /// `session.timeout.ms`.
    fn validate_group_timing(&self, name: &str) -> Result<(), ConfigError> {
        let ms = |prop: &str, default: u64| -> Result<u64, ConfigError> {
            match self.kafka.get(prop) {
                None => Ok(default),
                Some(v) => v.trim().parse().map_err(|_| {
                    ConfigError::invalid(
                        format!("connections.{name}.kafka.\"{prop}\""),
                        format!("{v:?} is not a number of milliseconds"),
                    )
                }),
            }
        };
        let max_poll = ms("max.poll.interval.ms", 300_000)?;
        let session = ms("session.timeout.ms", 45_000)?;
        let revoke_hold = self.drain_timeout_ms.saturating_add(10_000);
        if revoke_hold >= max_poll {
            return Err(ConfigError::invalid(
                format!("connections.{name}.drain_timeout_ms"),
                format!(
                    "{} ms plus 10 s is not below max.poll.interval.ms ({max_poll} ms): a revoke \
                     would outlast it and the consumer would leave its group mid-drain; lower \
                     drain_timeout_ms below {} or raise \"max.poll.interval.ms\" above {}",
                    self.drain_timeout_ms,
                    max_poll.saturating_sub(10_000),
                    revoke_hold
                ),
            ));
        }
        if self.kafka.contains_key("group.instance.id") && self.drain_timeout_ms >= session {
            return Err(ConfigError::invalid(
                format!("connections.{name}.drain_timeout_ms"),
                format!(
                    "{} ms is not below session.timeout.ms ({session} ms): with static \
                     membership (group.instance.id) a restart must be back within the session \
                     timeout to avoid a rebalance; lower drain_timeout_ms or raise \
                     \"session.timeout.ms\" above {}",
                    self.drain_timeout_ms,
                    self.drain_timeout_ms.saturating_add(15_000)
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("connections.{name}.{k}");
        self.auth()
            .map_err(|e| ConfigError::invalid(key("kafka"), e.to_string()))?;
        if let Some(r) = &self.schema_registry {
            if let Some(reason) = r.tls_files().unpaired("registry") {
                return Err(ConfigError::invalid(key("schema_registry"), reason));
            }
            if r.bearer_token.is_some() && (r.username.is_some() || r.password.is_some()) {
                return Err(ConfigError::invalid(
                    key("schema_registry"),
                    "bearer_token and username/password are exclusive",
                ));
            }
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(ConfigError::invalid(
                format!("connections.{name}"),
                "connection names use letters, digits, '-' and '_'",
            ));
        }
        let max = crate::core::offset_codec::MAX_METADATA_CHARS;
        if self.commit_metadata_max_bytes > max {
            return Err(ConfigError::invalid(
                key("commit_metadata_max_bytes"),
                format!(
                    "{} is more than {max}: a map that long is not read back (set the \
                     brokers' offset.metadata.max.bytes, 4096 by default, or less)",
                    self.commit_metadata_max_bytes
                ),
            ));
        }
        // A connection without triggers runs no consumer and needs no group.
        let required: &[&str] = if self.consumes() {
            &["bootstrap.servers", "group.id"]
        } else {
            &["bootstrap.servers"]
        };
        for required in required {
            match self.kafka.get(*required) {
                Some(v) if !v.trim().is_empty() => {}
                _ => {
                    return Err(ConfigError::invalid(
                        key(&format!("kafka.\"{required}\"")),
                        "is required",
                    ))
                }
            }
        }
        for (prop, wanted, why) in OWNED_PROPERTIES {
            if let Some(v) = self.kafka.get(*prop) {
                if !v.eq_ignore_ascii_case(wanted) {
                    return Err(ConfigError::invalid(
                        key(&format!("kafka.\"{prop}\"")),
                        format!("must be {wanted} (or left out): {why}"),
                    ));
                }
            }
        }
        for (table, props) in [
            ("kafka", &self.kafka),
            ("producer.kafka", &self.producer.kafka),
        ] {
            for (prop, value) in props {
                check_property(prop, value).map_err(|reason| {
                    ConfigError::invalid(key(&format!("{table}.\"{prop}\"")), reason)
                })?;
            }
        }
        if self.consumes() {
            self.validate_group_timing(name)?;
        }
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (tname, trigger) in &self.triggers {
            trigger.validate(&key(&format!("triggers.{tname}")))?;
            for topic in &trigger.topics {
                if let Some(other) = seen.insert(topic.as_str(), tname.as_str()) {
                    return Err(ConfigError::invalid(
                        key(&format!("triggers.{tname}.topics")),
                        format!("topic {topic} is also in trigger {other}; a topic belongs to one trigger per connection (use another connection with its own group.id to start two workflows)"),
                    ));
                }
            }
            if trigger.needs_registry() && self.schema_registry.is_none() {
                return Err(ConfigError::invalid(
                    key(&format!("triggers.{tname}")),
                    "key_format or value_format is schema_registry but the connection has no schema_registry",
                ));
            }
        }
        for (tname, trigger) in &self.triggers {
            if let Some(dlq) = &trigger.dead_letter_topic {
                if let Some((other, _)) = self.trigger_for(dlq) {
                    return Err(ConfigError::invalid(
                        key(&format!("triggers.{tname}.dead_letter_topic")),
                        format!("{dlq} is consumed by trigger {other} of this connection: dead letters would start runs again"),
                    ));
                }
            }
        }
        self.producer.validate(name)?;
        if self.max_buffered_per_partition == 0 {
            return Err(ConfigError::invalid(
                key("max_buffered_per_partition"),
                "must be at least 1",
            ));
        }
        for (tname, t) in &self.triggers {
            if let Some(b) = t
                .batch
                .filter(|b| b.max_records > self.max_buffered_per_partition)
            {
                return Err(ConfigError::invalid(
                    key(&format!("triggers.{tname}.batch.max_records")),
                    format!(
                        "{} is above max_buffered_per_partition ({}): the partition would pause before a batch fills",
                        b.max_records, self.max_buffered_per_partition
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The topics the connection's consumer subscribes to.
    pub fn topics(&self) -> BTreeSet<&str> {
        self.triggers
            .values()
            .flat_map(|t| t.topics.iter().map(String::as_str))
            .collect()
    }

    /// Whether the connection consumes (has triggers); one without triggers only produces.
    pub fn consumes(&self) -> bool {
        !self.triggers.is_empty()
    }

    /// The consumer group id.
    pub fn group_id(&self) -> &str {
        self.kafka
            .get("group.id")
            .map(String::as_str)
            .unwrap_or_default()
    }

    /// The trigger that owns `topic`: the one naming it, else the first (in name order) with
    /// a pattern matching it.
    pub fn trigger_for(&self, topic: &str) -> Option<(&str, &TriggerConfig)> {
        self.triggers
            .iter()
            .find(|(_, t)| t.names_topic(topic))
            .or_else(|| self.triggers.iter().find(|(_, t)| t.pattern_matches(topic)))
            .map(|(n, t)| (n.as_str(), t))
    }

    /// Whether some trigger subscribes with a pattern.
    pub fn has_patterns(&self) -> bool {
        self.triggers
            .values()
            .any(|t| t.topics.iter().any(|x| super::trigger::is_pattern(x)))
    }
}

/// Whether librdkafka knows the property `name` and takes `value` for it, as it will when the
/// clients are created; librdkafka's reason otherwise, with a secret's value left out.
/// Nothing connects: only librdkafka's configuration object is built.
fn check_property(name: &str, value: &str) -> Result<(), String> {
    let mut cfg = rdkafka::ClientConfig::new();
    let _ = cfg.set(name, value);
    let shown = if super::is_secret_property(name) {
        super::REDACTED.to_owned()
    } else {
        format!("{value:?}")
    };
    match cfg.create_native_config() {
        Ok(_) => Ok(()),
        Err(rdkafka::error::KafkaError::ClientConfig(_, reason, _, _)) => {
            let reason = if shown == super::REDACTED && !value.is_empty() {
                reason.replace(value, super::REDACTED)
            } else {
                reason
            };
            Err(format!("librdkafka refuses {shown}: {reason}"))
        }
        Err(e) => Err(format!("librdkafka refuses {shown}: {e}")),
    }
}

#[cfg(test)]
mod group_timing_tests {
    use crate::config::Config;

    /// A connection `orders` with one trigger, and these extra lines in its table and its
    /// `kafka` table.
    fn text(kafka_extra: &str, connection_extra: &str) -> String {
        format!(
            r#"
[connections.orders]
{connection_extra}
[connections.orders.kafka]
"bootstrap.servers" = "127.0.0.1:9092"
"group.id" = "g"
{kafka_extra}
[connections.orders.triggers.t]
topics = ["payments"]
workflow = "w"
dispatcher = {{ url = "http://127.0.0.1:8080/runs" }}
"#
        )
    }

    fn load(kafka_extra: &str, connection_extra: &str) -> Result<Config, String> {
        let text = text(kafka_extra, connection_extra);
        Config::from_toml_with_env(&text, Vec::new()).map_err(|e| e.to_string())
    }

    /// The configuration is refused, and why names each of `mentions`.
    fn assert_refused(kafka_extra: &str, connection_extra: &str, mentions: &[&str]) {
        let e = load(kafka_extra, connection_extra).unwrap_err();
        for m in mentions {
            assert!(e.contains(m), "{m:?} not in: {e}");
        }
    }

    #[test]
    fn the_drain_must_fit_the_poll_interval_and_with_static_membership_the_session() {
        assert!(load("", "").is_ok(), "defaults fit");
        assert_refused(
            "\"max.poll.interval.ms\" = \"30000\"",
            "drain_timeout_ms = 25000",
            // What to change, either way.
            &[
                "drain_timeout_ms",
                "max.poll.interval.ms",
                "below 20000",
                "above 35000",
            ],
        );
        assert!(load("\"group.instance.id\" = \"tessel-0\"", "").is_ok());
        assert_refused(
            "\"group.instance.id\" = \"tessel-0\"\n\"session.timeout.ms\" = \"20000\"",
            "drain_timeout_ms = 30000",
            &["session.timeout.ms", "group.instance.id"],
        );
        assert_refused(
            "\"session.timeout.ms\" = \"soon\"",
            "",
            &["session.timeout.ms"],
        );
    }

    #[test]
    fn the_commit_metadata_budget_is_at_most_what_is_read_back() {
        let c = load("", "").unwrap();
        assert_eq!(c.connections["orders"].commit_metadata_max_bytes, 4096);
        assert!(load("", "commit_metadata_max_bytes = 0").is_ok());
        assert!(load("", "commit_metadata_max_bytes = 8192").is_ok());
        assert_refused(
            "",
            "commit_metadata_max_bytes = 8193",
            &[
                "connections.orders.commit_metadata_max_bytes",
                "8193",
                "8192",
            ],
        );
    }

    #[test]
    fn static_membership_comes_from_the_environment_as_a_pod_name_would() {
        let env = vec![(
            "TESSEL_KAFKA__CONNECTIONS__ORDERS__KAFKA__GROUP_INSTANCE_ID".to_owned(),
            "tessel-kafka-2".to_owned(),
        )];
        let c = Config::from_toml_with_env(&text("", ""), env).unwrap();
        assert_eq!(
            c.connections["orders"].kafka["group.instance.id"],
            "tessel-kafka-2"
        );
    }
}
