//! `[produce]`: the produce API's tokens and limits; `[connections.<name>.producer]`: the
//! connection's producer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::secret::Secret;
use super::ConfigError;

/// The produce API (`POST /v1/connections/{connection}/messages`) and `tessel-kafka produce`.
/// Without tokens the API answers 404: producing is off unless a token grants it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProduceConfig {
    /// Largest request body, in bytes. Default 1048576 (1 MiB).
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Most messages in one request. Default 1000.
    #[serde(default = "default_max_batch_messages")]
    pub max_batch_messages: usize,
    /// Bearer tokens by name (`[produce.tokens.<name>]`). The name appears in logs, never
    /// the token.
    #[serde(default)]
    pub tokens: BTreeMap<String, TokenGrant>,
}

impl Default for ProduceConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: default_max_body_bytes(),
            max_batch_messages: default_max_batch_messages(),
            tokens: BTreeMap::new(),
        }
    }
}

fn default_max_body_bytes() -> usize {
    1024 * 1024
}
fn default_max_batch_messages() -> usize {
    1_000
}

/// One bearer token and what it may produce to.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenGrant {
    /// The token: inline, `{ env = "VAR" }` or `{ file = "/run/secrets/x" }`. At least 16
    /// characters.
    pub token: Secret,
    /// Connections it may produce through; `"*"` for all.
    pub connections: Vec<String>,
    /// Topics it may produce to: exact names, or prefixes ending in `*` (`"cdc.*"`); `"*"`
    /// for all.
    pub topics: Vec<String>,
}

impl TokenGrant {
    /// Whether the grant covers `topic` on `connection`.
    pub fn allows(&self, connection: &str, topic: &str) -> bool {
        let conn_ok = self.connections.iter().any(|c| c == "*" || c == connection);
        conn_ok && self.topics.iter().any(|p| topic_matches(p, topic))
    }
}

/// `pattern` is an exact topic name or a prefix followed by `*`.
pub fn topic_matches(pattern: &str, topic: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => topic.starts_with(prefix),
        None => pattern == topic,
    }
}

/// `[connections.<name>.producer]`: the connection's idempotent producer, shared by the
/// produce API and dead-letter writes.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerConfig {
    /// librdkafka producer properties added to the connection's `kafka` table (consumer-only
    /// properties are left out), e.g. `linger.ms`, `compression.type`. The connector forces
    /// `enable.idempotence=true` and `acks=all`; `partitioner` defaults to `murmur2_random`,
    /// which places keys on the same partitions as the Java client does.
    #[serde(
        default,
        serialize_with = "super::secret::serialize_properties",
        deserialize_with = "super::secret::deserialize_properties"
    )]
    pub kafka: BTreeMap<String, String>,
    /// How long the broker may take to acknowledge a record, retries included
    /// (`message.timeout.ms`). The API answers 504 after it. Default 30000.
    #[serde(default = "default_ack_timeout_ms")]
    pub ack_timeout_ms: u64,
    /// Enables transactional batches (`"transactional": true`) with this `transactional.id`
    /// prefix. The id is `<prefix>-<connection>`; each replica needs its own prefix (for
    /// example from the pod name), or replicas fence each other.
    #[serde(default)]
    pub transactional_id_prefix: Option<String>,
}

fn default_ack_timeout_ms() -> u64 {
    30_000
}

impl std::fmt::Debug for ProducerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerConfig")
            .field("kafka", &super::secret::redacted_properties(&self.kafka))
            .field("ack_timeout_ms", &self.ack_timeout_ms)
            .field("transactional_id_prefix", &self.transactional_id_prefix)
            .finish()
    }
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            kafka: BTreeMap::new(),
            ack_timeout_ms: default_ack_timeout_ms(),
            transactional_id_prefix: None,
        }
    }
}

impl ProducerConfig {
    pub(super) fn validate(&self, connection: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("connections.{connection}.producer.{k}");
        if self.ack_timeout_ms == 0 {
            return Err(ConfigError::invalid(
                key("ack_timeout_ms"),
                "must be positive",
            ));
        }
        for forced in ["enable.idempotence", "acks", "transactional.id"] {
            if self.kafka.contains_key(forced) {
                return Err(ConfigError::invalid(
                    key(&format!("kafka.{forced}")),
                    "is set by the connector and cannot be changed",
                ));
            }
        }
        if let Some(p) = &self.transactional_id_prefix {
            if p.trim().is_empty() {
                return Err(ConfigError::invalid(
                    key("transactional_id_prefix"),
                    "must not be empty",
                ));
            }
        }
        Ok(())
    }
}

impl ProduceConfig {
    pub(super) fn validate(&self, connections: &[&str]) -> Result<(), ConfigError> {
        if self.max_body_bytes == 0 || self.max_batch_messages == 0 {
            return Err(ConfigError::invalid(
                "produce",
                "max_body_bytes and max_batch_messages must be positive",
            ));
        }
        for (name, grant) in &self.tokens {
            let key = |k: &str| format!("produce.tokens.{name}.{k}");
            if grant.token.expose().len() < 16 {
                return Err(ConfigError::invalid(
                    key("token"),
                    "must be at least 16 characters",
                ));
            }
            for c in &grant.connections {
                if c != "*" && !connections.contains(&c.as_str()) {
                    return Err(ConfigError::invalid(
                        key("connections"),
                        format!("names connection {c:?}, which is not configured"),
                    ));
                }
            }
            if grant.connections.is_empty() || grant.topics.is_empty() {
                return Err(ConfigError::invalid(
                    key("topics"),
                    "a token needs at least one connection and one topic",
                ));
            }
        }
        Ok(())
    }

    /// Whether any token may produce through `connection`.
    pub fn grants_connection(&self, connection: &str) -> bool {
        self.tokens
            .values()
            .any(|g| g.connections.iter().any(|c| c == "*" || c == connection))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_match_connections_and_topic_patterns() {
        let g = TokenGrant {
            token: Secret::new("x".repeat(16)),
            connections: vec!["orders".into()],
            topics: vec!["cdc.*".into(), "audit".into()],
        };
        assert!(g.allows("orders", "cdc.public.users"));
        assert!(g.allows("orders", "audit"));
        assert!(!g.allows("orders", "audit2"));
        assert!(!g.allows("payments", "audit"));
        assert!(topic_matches("*", "anything"));
    }
}
